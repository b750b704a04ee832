"""experiments.reproduce: the claims, their commands, one claim's runs
aggregated into its report, and the results page."""

import json
import os
import subprocess
import sys

from experiments import claims
from tests.backend import default_route
from tests.conftest import REPO
from tests.programs import error_lines


def run(*args, module="experiments.reproduce"):
    return subprocess.run([sys.executable, "-m", module, *args], cwd=REPO,
                          text=True, capture_output=True, timeout=600)


@default_route
def test_highway_table1_smoke_run_writes_mean_and_std_per_width(tmp_path):
    args = ["--claim=highway_table1", "--", "--widths=16", "--runs=2", "--epochs=1",
            "--train_examples=512", f"--run_dir={tmp_path / 'runs'}",
            f"--report_dir={tmp_path}"]
    result = run(*args)
    assert result.returncode == 0, result.stderr[-2000:]
    report = (tmp_path / "highway_table1_mnist.md").read_text()
    # The report names the reproduction command, with the flags passed on.
    assert ("- command: `python -m experiments.reproduce --claim=highway_table1 --scale=cpu "
            "-- --widths=16 --runs=2") in report
    assert "- summary: test accuracy width 16: " in report and "(2 runs)" in report
    assert "a shortened run (1 epochs, 512 training images), not the paper's scale" in report
    row = next(line for line in report.splitlines() if line.startswith("| 16 |"))
    assert "37,450 (39K)" in row and "| 2 |" in row and " ± " in row and "99.43" in row
    cells = [c.strip() for c in row.strip("|").split("|")]
    assert len(cells) == 8
    # The last column is our mean against the paper's mean (99.4).
    mean = float(cells[3].split(" ± ")[0])
    assert abs(float(cells[7]) - (mean - 99.4)) < 0.011
    assert 0.0 <= float(cells[5]) <= 100.0     # the mean final training error
    assert (tmp_path / "runs" / "highway_table1" / "width16_seed1" / "model.keras").exists()
    again = run(*args)  # finished runs are reused, not trained again
    assert again.returncode == 0 and "the run is already complete" in again.stdout


def test_bad_flags_are_one_line():
    result = run("--widths=64", module="experiments.highway_table1")
    assert result.returncode == 2
    assert error_lines(result.stderr) == [
        "error: --widths=64 is not valid; Table 1 has widths 16 and 32"]
    result = run("--claim=he_table3_1001")
    assert result.returncode == 2
    assert error_lines(result.stderr) == [
        "error: --claim=he_table3_1001 has no CPU-scale command (GPU only); "
        "use --scale=paper on a GPU or TPU (expected: about 73 PFLOP: 2-10 h on one GPU, or "
        "41-124 min on a v5e chip (estimates))"]
    result = run()
    assert result.returncode == 2 and "give --claim" in result.stderr
    for args, words in [(["--list", "--claim=highway_table1"], "--claim do not apply"),
                        (["--results", "--", "--epochs=1"], "do not apply with --results"),
                        (["--claim=highway_table1", "--results_dir=x"], "applies with --results"),
                        (["--claim=highway_table1", "stray"], "go after --")]:
        result = run(*args)
        assert result.returncode == 2 and words in result.stderr, (args, result.stderr[-300:])


def test_every_claim_has_commands_that_parse():
    names = set()
    for claim in claims.CLAIMS:
        assert claim.name not in names
        names.add(claim.name)
        assert claim.paper_scale, claim.name
        if claim.cpu is None and claim.report is not None:
            # Measured at the paper's scale on a GPU: the report is assembled by hand.
            assert claim.manual_report, claim.name
    listing = run("--list")
    assert listing.returncode == 0
    for claim in claims.CLAIMS:
        assert f"{claim.name}: {claim.source}" in listing.stdout
    dry = run("--claim=he_table2_164", "--scale=paper", "--dry_run")
    assert dry.stdout.strip() == ("python -m keras_identity_cli.train "
                                  "--model=preact_resnet164 --dataset=cifar10 "
                                  "--data_dir=../shared/data")
    # Every module a claim runs exists and parses the claim's flags.
    commands = {}
    for claim in claims.CLAIMS:
        for argv in (claim.cpu, claim.paper_scale):
            if argv:
                commands.setdefault(argv[0], []).append(list(argv[1:]))
    # One process: each module imported, its claims' flags parsed, then the
    # module and its flags removed (two programs may define the same flags).
    result = subprocess.run([sys.executable, "-c", _PARSE, json.dumps(commands)], cwd=REPO,
                            text=True, capture_output=True, timeout=300,
                            env={**os.environ, "PYTHONPATH": os.pathsep.join(
                                filter(None, [REPO, os.environ.get("PYTHONPATH")]))})
    assert result.returncode == 0, result.stderr[-800:]
    assert result.stdout.split() == [f"parsed:{module}" for module in commands]


def test_results_page_has_a_row_per_claim(tmp_path):
    (tmp_path / "highway_table1_mnist.md").write_text(
        "# T\n\n- command: `x`\n- machine: M\n- date: 2026-01-01\n- summary: 99.4\n\nbody\n")
    result = run("--results", f"--results_dir={tmp_path}")
    assert result.returncode == 0, result.stderr[-2000:]
    page = (tmp_path / "README.md").read_text()
    rows = [line for line in page.splitlines() if line.startswith("| ") and
            not line.startswith("| claim") and not line.startswith("| ---")]
    assert len(rows) == len(claims.CLAIMS)
    table1 = next(r for r in rows if r.startswith("| highway_table1"))
    assert "| 99.4 |" in table1 and "| 2026-01-01 | M |" in table1
    assert sum("not run here" in r for r in rows) == sum(c.report is None for c in claims.CLAIMS)
    assert "reports without a summary line" in result.stdout


_PARSE = """
import importlib, json, sys
from absl import flags
from tests.programs import forget_programs
before = set(sys.modules)
for module, argvs in json.loads(sys.argv[1]).items():
    importlib.import_module(module)
    for argv in argvs:
        flags.FLAGS.unparse_flags()
        flags.FLAGS(["x", *argv])
    forget_programs(before)
    print("parsed:" + module)
"""

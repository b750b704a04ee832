"""experiments.reproduce: a claim's runs, aggregated into its report."""

import subprocess
import sys

from tests.conftest import REPO


def run(*args):
    return subprocess.run([sys.executable, "-m", "experiments.reproduce", *args], cwd=REPO,
                          text=True, capture_output=True, timeout=600)


def test_highway_table1_smoke_run_writes_mean_and_std_per_width(tmp_path):
    args = ["--claim=highway_table1", "--widths=16", "--runs=2", "--epochs=1",
            "--train_examples=512", f"--run_dir={tmp_path / 'runs'}",
            f"--report_dir={tmp_path}"]
    result = run(*args)
    assert result.returncode == 0, result.stderr[-2000:]
    report = (tmp_path / "highway_table1_mnist.md").read_text()
    assert "a shortened run (1 epochs, 512 training images), not the paper's scale" in report
    row = next(line for line in report.splitlines() if line.startswith("| 16 |"))
    assert "37,450 (39K)" in row and "| 2 |" in row and " ± " in row and "99.43" in row
    assert (tmp_path / "runs" / "highway_table1" / "width16_seed1" / "model.keras").exists()
    again = run(*args)  # finished runs are reused, not trained again
    assert again.returncode == 0 and "the run is already complete" in again.stdout


def test_bad_flags_are_one_line():
    result = run("--widths=64")
    assert result.returncode == 2
    assert [l for l in result.stderr.splitlines() if l.startswith("error:")] == [
        "error: --widths=64 is not valid; Table 1 has widths 16 and 32"]

r"""Reproduces a claim of the papers; lists the claims; writes the results page.

    python -m experiments.reproduce --list
    python -m experiments.reproduce --claim=highway_table1            # CPU scale
    python -m experiments.reproduce --claim=he_table3_1001 --scale=paper --dry_run
    python -m experiments.reproduce --claim=highway_table1 -- --epochs=1 \
        --train_examples=512 --run_dir=/tmp/smoke --report_dir=/tmp/smoke  # a smoke run
    python -m experiments.reproduce --results     # docs/results/README.md from the reports

Each claim (``experiments/claims.py``) has a command at CPU scale (what ran
on this project's 2-core machine) and one at the paper's scale (for a GPU or
TPU; some claims need one).  ``--claim`` runs the command of ``--scale`` in a
child process; flags after ``--`` are passed on to it (e.g. a shorter smoke
run: give it its own --run_dir and --report_dir, or it mixes with the real
runs).  Its runs are checkpointed: running the command again continues them.
The report it writes under docs/results/ names this command (except the
gate-bias search and the GPU run of ResNet-20, whose reports are assembled by
hand from the tuner's results.md and the run's history.json).
"""

import os
import subprocess
import sys

from absl import app
from absl import flags

from experiments import _cli
from experiments import _report
from experiments import claims as claims_lib

FLAGS = flags.FLAGS
flags.DEFINE_enum("claim", None, [c.name for c in claims_lib.CLAIMS], "The claim to reproduce.")
flags.DEFINE_enum("scale", "cpu", ["cpu", "paper"], "cpu: the scale run on a 2-core CPU "
                  "(stated in the report); paper: the paper's (a GPU or TPU for most claims).")
flags.DEFINE_bool("dry_run", False, "Print the command instead of running it.")
flags.DEFINE_bool("list", False, "List the claims and their commands.")
flags.DEFINE_bool("results", False, "Write docs/results/README.md from the claims' reports.")
flags.DEFINE_string("results_dir", None, "Where the reports are (default: docs/results/).")

README = "README.md"


def _list():
    for claim in claims_lib.CLAIMS:
        print(f"{claim.name}: {claim.source} — {claim.statement}")
        print(f"  paper: {claim.paper}")
        print(f"  cpu:   {claim.command('cpu') or 'not run here (' + claim.cpu_scale + ')'}")
        if claim.manual_report:
            print(f"         (docs/results/{claim.report} is assembled by hand from its output)")
        print(f"  paper: {claim.command('paper')}  [{claim.paper_time}]")


def _run(claim, scale, extra):
    argv = claim.cpu if scale == "cpu" else claim.paper_scale
    if argv is None:
        _cli.fail(f"--claim={claim.name} has no CPU-scale command ({claim.cpu_scale}); use "
                  f"--scale=paper on a GPU or TPU (expected: {claim.paper_time})", 2)
    command = [sys.executable, "-m", *argv, *extra]
    shown = "python -m " + " ".join([*argv, *extra])
    if FLAGS.dry_run:
        print(shown)
        return 0
    ours = " ".join(["python -m experiments.reproduce", f"--claim={claim.name}",
                     f"--scale={scale}", *(["--", *extra] if extra else [])])
    print(f"== {claim.name} ({claim.source}), {scale} scale: {shown}", flush=True)
    env = dict(os.environ, **{_report.COMMAND_VARIABLE: ours})
    return subprocess.call(command, env=env)


def _cell(text):
    return str(text).replace("|", "\\|").replace("\n", " ")


def results_page(directory):
    """The text of docs/results/README.md: one row per claim."""
    rows = ["| claim | the paper | ours | scale | command | report | date | machine |",
            "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    missing = []
    for claim in claims_lib.CLAIMS:
        if claim.report is None:
            rows.append(
                f"| {claim.name}: {_cell(claim.source)} | {_cell(claim.paper)} | not run here "
                f"| {_cell(claim.cpu_scale)}; expected at the paper's scale: "
                f"{_cell(claim.paper_time)} | `{claim.command('paper')}` | - | - | - |")
            continue
        path = os.path.join(directory, claim.report)
        fields = _report.read_header(path) if os.path.exists(path) else {}
        if "summary" not in fields:
            missing.append(claim.report)
        rows.append(
            f"| {claim.name}: {_cell(claim.source)} | {_cell(claim.paper)} | "
            f"{_cell(fields.get('summary', 'not run yet'))} | {_cell(claim.cpu_scale)} | "
            f"`python -m experiments.reproduce --claim={claim.name}"
            f"{'' if claim.cpu else ' --scale=paper'}` | "
            f"[{claim.report}]({claim.report}) | {fields.get('date', '-')} | "
            f"{_cell(fields.get('machine', '-'))} |")
    text = "\n".join([
        "# Results: the papers' claims, reproduced",
        "",
        "Written by `python -m experiments.reproduce --results` from the reports in this "
        "directory; each report names the command, machine and date of its numbers. "
        "Re-run a claim with `python -m experiments.reproduce --claim=<claim>` (CPU scale, "
        "as here) or `--scale=paper` (the paper's scale; `--list` prints both commands). "
        "Claims marked \"not run here\" need a GPU, a TPU or ImageNet, none of which this "
        "project's 2-core machine has; their expected times are estimates (below).",
        "",
        *rows,
        "",
        "## Expected times at the paper's scale (estimates, not measurements)",
        "",
        "Training FLOPs per image (3x the forward pass of `benchmarks.run.forward_flops`): "
        "ResNet-164 1.47 GFLOP, ResNet-1001 8.93 GFLOP, ResNet-110 about 1.5 GFLOP, the "
        "19-layer highway net 1.76 GFLOP (its convolutions counted from the model). The "
        "CIFAR recipe trains 64,000 x 128 = 8.2 million images, so one ResNet-110/164 run is "
        "about 12 PFLOP and one ResNet-1001 run about 73 PFLOP. Thin CIFAR convolutions keep "
        "a GPU far from its peak; at a sustained 2-10 TFLOP/s on one current GPU that is 20 "
        "min to 1.7 h per ResNet-110/164 run and 2-10 h per ResNet-1001 run. TPU figures "
        "are in [docs/tpu.md](../tpu.md). ImageNet ResNet-200 (Table 5): about 90 GFLOP per "
        "training image x 120 epochs of 1.28 million images = 14 EFLOP, about 2 days on 8 "
        "GPUs at 10 TFLOP/s each. The highway net's recipe (`highway_cifar`, 200 epochs) "
        "trains 10 million images: about 18 PFLOP.",
    ])
    return text, missing


def _refuse_extra(mode, extra):
    given = [f"--{name}" for name in ("claim", "dry_run") if FLAGS[name].present]
    if FLAGS["scale"].present:
        given.append("--scale")
    if extra:
        given.append(f"arguments {extra}")
    if given:
        _cli.fail(f"{', '.join(given)} do not apply with {mode}", 2)


def main(argv):
    extra = argv[1:]
    if FLAGS.list and FLAGS.results:
        _cli.fail("--list and --results are exclusive", 2)
    if FLAGS.list or FLAGS.results:
        _refuse_extra("--list" if FLAGS.list else "--results", extra)
    elif FLAGS["results_dir"].present:
        _cli.fail("--results_dir applies with --results", 2)
    if FLAGS.list:
        _list()
        return
    if FLAGS.results:
        directory = FLAGS.results_dir or _report.RESULTS
        text, missing = results_page(directory)
        path = _report.write(README, text, directory=directory)
        print(f"wrote {path}")
        if missing:
            print(f"reports without a summary line (re-run their claims): {', '.join(missing)}")
        return
    if FLAGS.claim is None:
        _cli.fail("give --claim (one of: "
                  f"{', '.join(c.name for c in claims_lib.CLAIMS)}), --list or --results", 2)
    words = [a for a in extra if not a.startswith("-")]
    if words and "--" not in sys.argv:
        _cli.fail(f"unexpected arguments {words}; flags for the claim's program go after --", 2)
    claim = claims_lib.BY_NAME[FLAGS.claim]
    code = _run(claim, FLAGS.scale, extra)
    if claim.manual_report and code == 0 and not FLAGS.dry_run:
        print(f"docs/results/{claim.report} is assembled by hand from this command's "
              f"output (its results.md or history.json); update it from there.")
    sys.exit(code)


def run():
    app.run(main, flags_parser=_cli.one_line_flags_parser)


if __name__ == "__main__":
    run()

r"""Draws several training runs on one plot, as the papers' Figs. 1, 3 and 6.

    python -m experiments.plot_runs --run_dirs=runs/orig1001,runs/pre1001 \
        --labels="original,pre-activation" --out=runs/resnet1001.png
"""

import os

from absl import app
from absl import flags

from experiments import _cli

FLAGS = flags.FLAGS
flags.DEFINE_list("run_dirs", None, "Comma-separated --model_dir values of finished or "
                  "running training runs.")
flags.DEFINE_list("labels", None, "Legend labels, one per run (default: directory names).")
flags.DEFINE_string("out", "runs/comparison.png", "Output PNG.")
flags.DEFINE_string("title", "", "Plot title.")
flags.mark_flag_as_required("run_dirs")


def main(argv):
    if len(argv) > 1:
        _cli.fail(f"unexpected arguments {argv[1:]}", 2)
    from keras_identity.training import plot_runs

    for run_dir in FLAGS.run_dirs:
        if not os.path.exists(os.path.join(run_dir, "history.json")):
            _cli.fail(f"run_dirs: {run_dir!r} has no history.json (not a training run?)", 2)
    try:
        plot_runs(FLAGS.run_dirs, FLAGS.out, labels=FLAGS.labels, title=FLAGS.title)
    except ValueError as error:
        _cli.fail(error, 2)
    print(f"wrote {FLAGS.out}")


def run():
    app.run(main, flags_parser=_cli.one_line_flags_parser)


if __name__ == "__main__":
    run()

r"""Srivastava et al. (2015), Table 1, with the package's own training program.

    python -m experiments.reproduce --claim=highway_table1      # runs this module
    python -m experiments.highway_table1 --runs=3

Table 1: 10-layer
convolutional highway networks on MNIST, width 16 (~39K parameters, 99.43%
test accuracy, 99.4 +- 0.03) and width 32 (~151K, 99.55%, 99.54 +- 0.02),
at the paper's scale (the whole training set, the ``highway_mnist_conv``
recipe), ``--runs`` seeds per width.  Every run is an ordinary training run
under ``--run_dir`` (checkpointed: the command picks up where a killed one
stopped, and finished runs are reused); the report with mean +- std per width
against the paper goes to docs/results/.
"""

import json
import os
import statistics
import time

from absl import app
from absl import flags

from experiments import _cli
from experiments import _report

# width: (parameters, best run's test accuracy %, mean, std)
PAPER_TABLE1 = {16: (39_000, 99.43, 99.4, 0.03), 32: (151_000, 99.55, 99.54, 0.02)}

FLAGS = flags.FLAGS
flags.DEFINE_integer("runs", 3, "Seeds per configuration.")
flags.DEFINE_list("widths", ["16", "32"], "highway_table1: widths (Table 1: 16 and 32).")
flags.DEFINE_integer("epochs", None, "Epochs per run (default: the recipe's; fewer for a "
                     "smoke test, which the report then states).")
flags.DEFINE_integer("train_examples", None, "A random subset of the training set (a smoke "
                     "test, which the report then states).")
flags.DEFINE_string("data_dir", None, "MNIST .npz (default: the built-in copy).")
flags.DEFINE_string("run_dir", "runs/reproduce", "Directory of the individual runs.")
flags.DEFINE_string("report_dir", None, "Where the report goes (default: docs/results/).")


def _table1_run(width, seed):
    import keras

    from keras_identity.training import TrainConfig
    from keras_identity.training import train

    model_dir = os.path.join(FLAGS.run_dir, "highway_table1", f"width{width}_seed{seed}")
    config = TrainConfig(model=f"highway10_conv{width}_mnist", dataset="mnist",
                         data_dir=FLAGS.data_dir, epochs=FLAGS.epochs, seed=seed, verbose=2,
                         train_examples=FLAGS.train_examples, model_dir=model_dir)
    started = time.time()
    result = train(config)
    keras.backend.clear_session()
    history = result["history"]
    seconds = sum(row.get("epoch_time", 0.0) for row in history) or time.time() - started
    return {"width": width, "seed": seed, "params": result["params"],
            "accuracy": 100.0 * (1.0 - result["test_error"]),
            "train_error": 100.0 * history[-1]["train_error"], "epochs": len(history),
            "seconds": seconds, "model_dir": model_dir}


def _table1_report(rows, epochs_flag, train_examples):
    lines = ["| width | parameters (paper) | runs | test accuracy %, mean ± std | runs' accuracies "
             "| training error % (mean) | paper: best (mean ± std) | ours - paper's mean |",
             "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    for width in sorted({r["width"] for r in rows}):
        mine = [r for r in rows if r["width"] == width]
        accuracies = [r["accuracy"] for r in mine]
        spread = statistics.stdev(accuracies) if len(accuracies) > 1 else float("nan")
        params, best, mean, std = PAPER_TABLE1[width]
        ours = statistics.mean(accuracies)
        train_error = statistics.mean(r["train_error"] for r in mine)
        lines.append(f"| {width} | {mine[0]['params']:,} ({params / 1000:.0f}K) | "
                     f"{len(mine)} | {ours:.2f} ± {spread:.2f} | "
                     f"{', '.join(f'{a:.2f}' for a in accuracies)} | {train_error:.2f} | "
                     f"{best} ({mean} ± {std}) | {ours - mean:+.2f} |")
    epochs = sorted({r["epochs"] for r in rows})
    hours = sum(r["seconds"] for r in rows) / 3600
    from keras_identity.recipes import get_recipe

    recipe_epochs = get_recipe("highway_mnist_conv").epochs
    scale = (f"the paper's scale: all 60,000 training images, the recipe's {recipe_epochs} "
             f"epochs" if epochs_flag is None and train_examples is None else
             f"a shortened run ({epochs_flag or recipe_epochs} epochs, "
             f"{train_examples or 60_000:,} training images), not the paper's scale")
    return "\n".join([
        "Srivastava et al. (2015), Table 1: 10-layer convolutional highway networks "
        "(9 convolutional layers + softmax) on MNIST. Architecture and recipe: "
        "`highway_net(10, architecture=\"convolutional\", width=...)` and "
        "`highway_mnist_conv` (the paper gives neither in full; our choices are in "
        "docs/training.md and the builder's docstring).", "",
        f"Scale: {scale}; epochs per run {epochs}; one seed per run (`--seed` 0, 1, ...); "
        f"{hours:.1f} hours of training in total.", "", *lines, "",
        "Runs: " + ", ".join(f"`{r['model_dir']}`" for r in rows) + "."])


def main(argv):
    if len(argv) > 1:
        _cli.fail(f"unexpected arguments {argv[1:]}", 2)
    if FLAGS.runs < 1:
        _cli.fail(f"runs={FLAGS.runs} is not valid; expected an integer >= 1", 2)
    widths = []
    for value in FLAGS.widths:
        if value not in ("16", "32"):
            _cli.fail(f"--widths={','.join(FLAGS.widths)} is not valid; Table 1 has widths "
                      f"16 and 32", 2)
        widths.append(int(value))
    from keras_identity.training import ConfigError
    from keras_identity.training import TrainingDiverged

    rows = []
    try:
        for width in widths:
            for seed in range(FLAGS.runs):
                print(f"== highway_table1: width {width}, seed {seed}")
                rows.append(_table1_run(width, seed))
                print(f"== width {width}, seed {seed}: test accuracy "
                      f"{rows[-1]['accuracy']:.2f}%")
    except ConfigError as error:
        _cli.fail(error, 2)
    except TrainingDiverged as error:
        _cli.fail(f"training diverged: {error}")
    summary = "test accuracy " + ", ".join(
        f"width {w}: {statistics.mean(a):.2f} ± {statistics.stdev(a) if len(a) > 1 else 0:.2f}"
        f" ({len(a)} runs)" for w, a in (
            (w, [r["accuracy"] for r in rows if r["width"] == w]) for w in widths))
    text = _report.header("Highway networks, Table 1: convolutional nets on MNIST",
                          summary=summary) + "\n" + \
        _table1_report(rows, FLAGS.epochs, FLAGS.train_examples)
    directory = FLAGS.report_dir or _report.RESULTS
    path = _report.write("highway_table1_mnist.md", text, directory=directory)
    with open(os.path.join(FLAGS.run_dir, "highway_table1", "runs.json"), "w") as f:
        json.dump(rows, f, indent=1)
    print(f"report: {path}")


def run():
    app.run(main, flags_parser=_cli.one_line_flags_parser)


if __name__ == "__main__":
    run()

r"""Srivastava et al. (2015), Fig. 1: plain against highway networks of growing depth on MNIST.

    python -m experiments.highway_depth_study --epochs=10

Fully connected nets: a plain first layer, then 9, 19, 49 or 99 plain layers
of 71 units or highway layers of 50 blocks (about 5,000 parameters per
layer either way), ReLU, the transform-gate bias of the paper's guideline.
Like the paper, which reports the best of a hyper-parameter search per depth,
each network trains with every learning rate of --learning_rates and the one
with the lowest final training loss is kept.  Writes a Markdown report with
the table and the training curves under docs/results/.  Finished runs are
reused when the command runs again.
"""

import json
import math
import os

from absl import app
from absl import flags

from experiments import _cli
from experiments import _report

FLAGS = flags.FLAGS
flags.DEFINE_list("depths", ["10", "20", "50", "100"], "Depths (hidden layers).")
flags.DEFINE_list("learning_rates", ["0.01", "0.03", "0.1"], "Learning rates tried per net.")
flags.DEFINE_integer("epochs", 10, "Epochs per run.")
flags.DEFINE_integer("seed", 0, "Seed.")
flags.DEFINE_string("data_dir", None, "MNIST .npz (default: the built-in copy).")
flags.DEFINE_string("run_dir", "runs/highway_depth", "Directory of the individual runs.")
flags.DEFINE_string("report", "highway_depth_study_mnist.md", "Report under docs/results/.")


def _run(kind, depth, lr):
    import keras

    from keras_identity.training import TrainConfig
    from keras_identity.training import TrainingDiverged
    from keras_identity.training import train

    model_dir = os.path.join(FLAGS.run_dir, f"{kind}{depth}_lr{lr:g}")
    marker = os.path.join(model_dir, "diverged.json")
    if os.path.exists(marker):
        return json.load(open(marker))
    config = TrainConfig(model=f"{kind}_net", depth=depth, dataset="mnist",
                         data_dir=FLAGS.data_dir, epochs=FLAGS.epochs, learning_rate=lr,
                         seed=FLAGS.seed, verbose=0, model_dir=model_dir)
    try:
        result = train(config, print_fn=lambda *_: None)
        outcome = {"history": result["history"], "diverged": False}
    except TrainingDiverged as error:
        outcome = {"history": [], "diverged": True, "step": error.step}
        os.makedirs(model_dir, exist_ok=True)
        json.dump(outcome, open(marker, "w"))
    keras.backend.clear_session()
    outcome.update(kind=kind, depth=depth, lr=lr, model_dir=model_dir)
    last = outcome["history"][-1] if outcome["history"] else None
    print(f"  {kind}-{depth} lr {lr:g}: " + (
        f"train loss {last['loss']:.4g}, test error {100 * last['test_error']:.2f}%"
        if last else f"diverged at step {outcome['step']}"), flush=True)
    return outcome


def _plot(best, path):
    from keras_identity.training.plots import pyplot

    plt = pyplot()
    depths = sorted({b["depth"] for b in best.values()})
    fig, axes = plt.subplots(1, len(depths), figsize=(3.2 * len(depths), 3.4), sharey=True)
    for ax, depth in zip(axes, depths):
        for kind, color in (("plain", "tab:red"), ("highway", "tab:blue")):
            run = best.get((kind, depth))
            if run and run["history"]:
                epochs = [r["epoch"] for r in run["history"]]
                ax.semilogy(epochs, [r["loss"] for r in run["history"]], color=color,
                            label=f"{kind} (lr {run['lr']:g})")
        ax.set_title(f"{depth} layers", fontsize=10)
        ax.set_xlabel("epoch")
        ax.grid(alpha=0.3, which="both")
        ax.legend(fontsize=7)
    axes[0].set_ylabel("training loss (cross-entropy)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv):
    if len(argv) > 1:
        _cli.fail(f"unexpected arguments {argv[1:]}", 2)
    try:
        depths = [int(d) for d in FLAGS.depths]
        rates = [float(r) for r in FLAGS.learning_rates]
    except ValueError:
        _cli.fail("depths and learning_rates must be comma-separated numbers", 2)
    runs = []
    for depth in depths:
        for kind in ("plain", "highway"):
            for lr in rates:
                runs.append(_run(kind, depth, lr))
    best = {}
    for run in runs:
        if not run["history"]:
            continue
        key = (run["kind"], run["depth"])
        loss = run["history"][-1]["loss"]
        if key not in best or loss < best[key]["history"][-1]["loss"]:
            best[key] = run

    def fmt(run, field):
        if run is None:
            return "diverged"
        value = run["history"][-1][field]
        return f"{100 * value:.2f}" if field == "test_error" else f"{value:.3g}"

    table = ("| depth | plain: train loss | plain: test error (%) | plain: lr | highway: train "
             "loss | highway: test error (%) | highway: lr |\n"
             "| --- | --- | --- | --- | --- | --- | --- |\n")
    for depth in depths:
        p, h = best.get(("plain", depth)), best.get(("highway", depth))
        table += (f"| {depth} | {fmt(p, 'loss')} | {fmt(p, 'test_error')} | "
                  f"{p['lr'] if p else '-'} | {fmt(h, 'loss')} | {fmt(h, 'test_error')} | "
                  f"{h['lr'] if h else '-'} |\n")
    all_runs = ("| net | " + " | ".join(f"lr {r:g}" for r in rates) + " |\n|" +
                " --- |" * (len(rates) + 1) + "\n")
    for depth in depths:
        for kind in ("plain", "highway"):
            cells = []
            for lr in rates:
                run = next(r for r in runs if (r["kind"], r["depth"], r["lr"]) ==
                           (kind, depth, lr))
                loss = run["history"][-1]["loss"] if run["history"] else math.nan
                cells.append("diverged" if run["diverged"] else f"{loss:.3g}")
            all_runs += f"| {kind}-{depth} | " + " | ".join(cells) + " |\n"
    figure = os.path.join(FLAGS.run_dir, "fig1.png")
    os.makedirs(FLAGS.run_dir, exist_ok=True)
    _plot(best, figure)
    summary = "best final training loss, plain / highway: " + ", ".join(
        f"{depth} layers {fmt(best.get(('plain', depth)), 'loss')} / "
        f"{fmt(best.get(('highway', depth)), 'loss')}" for depth in depths)
    text = _report.header("Highway networks, Fig. 1: plain against highway nets on MNIST",
                          summary=summary)
    text += (f"\nFully connected nets on MNIST (60,000 training images), {FLAGS.epochs} "
             f"epochs of the `highway_mnist` recipe (SGD momentum 0.9, lr decayed by 0.9 per "
             f"epoch, batch 128) at each learning rate of {rates}; the table keeps, per net, "
             f"the rate with the lowest final training loss (the paper plots the best of 100 "
             f"random-search runs per depth). Training loss is the mean over the last epoch.\n\n"
             f"{table}\nEvery run's final training loss:\n\n{all_runs}\n"
             + _report.copy_figure(figure, "highway_depth_study_mnist.png") + "\n")
    print(f"wrote {_report.write(FLAGS.report, text)}")
    print(table)


def run():
    app.run(main, flags_parser=_cli.one_line_flags_parser)


if __name__ == "__main__":
    run()

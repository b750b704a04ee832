r"""Srivastava et al. (2015), Fig. 1 at 100 layers, with the paper's protocol.

    python -m experiments.reproduce --claim=highway_fig1_search   # runs this module
    python -m experiments.highway_fig1_search --trials=20 --epochs=5 --retrain_epochs=20

"We performed a random search of 100 runs for both plain and highway networks
to find good settings for the following hyperparameters: initial learning
rate, momentum, learning rate exponential decay factor & activation function
(either rectified linear or tanh). For highway networks, an additional
hyperparameter was the initial value for the transform gate bias (between -1
and -10)."  The search minimises "the best training set error"; Fig. 1 plots
the training loss of the best settings.

Here: a random search (``keras-identity-tune``'s, the same code) of --trials
trials of --epochs epochs for the 100-layer plain (71 units a layer) and
highway (50 blocks a layer) nets of Fig. 1, judged by the best epoch's
training cross-entropy on the training set minus a 10% validation split; the
best settings of each net are then trained on the whole training set for
--retrain_epochs epochs.  Each search lives in its own directory under
--run_dir and continues where it stopped.  Writes
docs/results/highway_fig1_search_mnist.md.
"""

import json
import os
import statistics

from absl import app
from absl import flags

from experiments import _cli
from experiments import _report

FLAGS = flags.FLAGS
flags.DEFINE_integer("depth", 100, "Layers (Fig. 1: 10, 20, 50, 100).")
flags.DEFINE_integer("trials", 20, "Random-search trials per net (the paper: 100).")
flags.DEFINE_integer("epochs", 5, "Epochs per trial.")
flags.DEFINE_integer("retrain_epochs", 20, "Epochs of the best settings on the whole "
                     "training set.")
flags.DEFINE_integer("train_examples", None, "A random subset of MNIST's 60,000 training "
                     "images (a smoke test, which the report then states).")
flags.DEFINE_integer("seed", 0, "Seed of the search and the runs.")
flags.DEFINE_string("run_dir", "runs/reproduce/highway_fig1", "Directory of the searches.")
flags.DEFINE_string("report_dir", None, "Where the report goes (default: docs/results/).")

# The paper's space; its ranges of learning rate, momentum and decay are not
# given, these are ours.
SPACE = dict(learning_rates="0.001:0.3", momentums="0.5:0.99", lr_decays="0.8:1",
             activations="relu,tanh", gate_biases="-10:-1")
NETS = ("highway", "plain")
TOP = 10   # Fig. 1, right: mean of the top 10 settings


def search_config(net):
    """The :class:`SearchConfig` of ``net``'s search: what
    ``keras-identity-tune --model=<net>_net --depth=100 --dataset=mnist
    --tuner=random --max_trials=20 --epochs=5 --learning_rates=0.001:0.3
    --momentums=0.5:0.99 --lr_decays=0.8:1 --activations=relu,tanh
    [--gate_biases=-10:-1] --objective=train_loss --retrain_best
    --retrain_epochs=20 --verbose=2 --model_dir=runs/reproduce/highway_fig1/<net>100``
    builds with this module's defaults (the same search directory)."""
    from keras_identity.training import TrainConfig
    from keras_identity.tuning import SearchConfig
    from keras_identity.tuning import parse_range

    train = TrainConfig(model=f"{net}_net", depth=FLAGS.depth, dataset="mnist",
                        epochs=FLAGS.epochs, seed=FLAGS.seed, verbose=2,
                        train_examples=FLAGS.train_examples,
                        model_dir=os.path.join(FLAGS.run_dir, f"{net}{FLAGS.depth}"))
    return SearchConfig(
        train=train, tuner="random", max_trials=FLAGS.trials,
        learning_rates=parse_range("learning_rates", SPACE["learning_rates"], log=True),
        momentums=parse_range("momentums", SPACE["momentums"]),
        lr_decays=parse_range("lr_decays", SPACE["lr_decays"]),
        activations=tuple(SPACE["activations"].split(",")),
        gate_biases=parse_range("gate_biases", SPACE["gate_biases"]) if net == "highway"
        else None,
        objective="train_loss", retrain_best=True, retrain_epochs=FLAGS.retrain_epochs)


def _format(row):
    parts = [f"lr {row['learning_rate']:.3g}", f"momentum {row['momentum']:.3g}",
             f"decay {row['lr_decay']:.3g}", row["activation"]]
    if "gate_bias_init" in row:
        parts.append(f"b_T {row['gate_bias_init']:.2f}")
    return ", ".join(parts)


def summarize(net, result):
    rows = result["rows"]
    finite = [r for r in rows if not r["note"]]
    top = sorted(r["best_train_loss"] for r in finite)[:TOP]
    retrain = result.get("retrain") or {"diverged": True}
    history = retrain.get("history") or [{"loss": float("nan")}]
    return {
        "net": net, "trials": len(rows), "diverged": len(rows) - len(finite),
        "best": _format(result["best_row"]), "best_values": result["best"],
        "search_loss": result["best_row"]["best_train_loss"],
        "top_mean": statistics.mean(top) if top else float("nan"), "top_n": len(top),
        "retrain_diverged": bool(retrain.get("diverged")),
        "retrain_loss": history[-1]["loss"],
        "retrain_test_error": retrain.get("test_error", float("nan")),
        "retrain_dir": retrain.get("model_dir"),
        "curve": [r["loss"] for r in history] if retrain.get("history") else [],
    }


def report(summaries):
    by_net = {s["net"]: s for s in summaries}
    images = FLAGS.train_examples or 60_000
    lines = [
        f"The paper's protocol at {FLAGS.depth} layers: a random search over the learning rate "
        f"(log-uniform {SPACE['learning_rates']}), momentum ({SPACE['momentums']}), the "
        f"exponential decay factor per epoch ({SPACE['lr_decays']}), the activation (ReLU or "
        f"tanh) and, for the highway net, b_T (uniform {SPACE['gate_biases']}); each trial "
        f"trains {FLAGS.epochs} epochs on about {round(0.9 * images):,} training images (a "
        "tenth of each class held out) and is judged by its best epoch's training "
        f"cross-entropy. The best settings are then trained on all {images:,} for "
        f"{FLAGS.retrain_epochs} epochs. Scale: {FLAGS.trials} trials per net (the paper: "
        "100)" + ("" if FLAGS.train_examples is None else
                  f", a random {images:,} of MNIST's 60,000 training images (a smoke test)")
        + ("; the paper does not state its epochs or its ranges of learning rate, "
           "momentum and decay."), "",
        "| net | trials (diverged) | best settings | best training loss in the search | "
        f"mean of the top {TOP} | retrained: final training loss | retrained: test error |",
        "| --- | --- | --- | --- | --- | --- | --- |"]
    for s in summaries:
        lines.append(
            f"| {s['net']}-{FLAGS.depth} | {s['trials']} ({s['diverged']}) | {s['best']} | "
            f"{s['search_loss']:.4g} | {s['top_mean']:.4g} (top {s['top_n']}) | "
            + ("diverged | - |" if s["retrain_diverged"] else
               f"{s['retrain_loss']:.4g} | {100 * s['retrain_test_error']:.2f}% |"))
    ratio = None
    if "highway" in by_net and "plain" in by_net and not any(
            s["retrain_diverged"] for s in summaries):
        ratio = by_net["plain"]["retrain_loss"] / max(by_net["highway"]["retrain_loss"], 1e-12)
        lines += ["", f"Final training loss, plain / highway: **{ratio:.3g}x** (the paper: "
                  f"more than 100x at 100 layers)."]
    lines += ["", "Every trial: `results.md` in " + ", ".join(
        f"`{os.path.join(FLAGS.run_dir, s['net'] + str(FLAGS.depth))}`" for s in summaries)
              + "."]
    return "\n".join(lines), ratio


def _plot(summaries, path):
    from keras_identity.training.plots import pyplot

    plt = pyplot()
    fig, ax = plt.subplots(figsize=(6.5, 4))
    for s in summaries:
        if not s["curve"]:
            continue
        epochs = range(1, len(s["curve"]) + 1)
        ax.plot(epochs, s["curve"], label=f"{s['net']}-{FLAGS.depth}: {s['best']}")
    ax.set_yscale("log")
    ax.set_xlabel("epoch")
    ax.set_ylabel("mean training loss (cross-entropy)")
    ax.set_title(f"Fig. 1 at {FLAGS.depth} layers: the best settings of a "
                 f"{FLAGS.trials}-trial random search", fontsize=10)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv):
    if len(argv) > 1:
        _cli.fail(f"unexpected arguments {argv[1:]}", 2)
    if FLAGS.train_examples is not None and FLAGS.train_examples > 60_000:
        _cli.fail(f"--train_examples={FLAGS.train_examples} is not valid; expected at most "
                  f"MNIST's 60,000", 2)
    for name in ("depth", "trials", "epochs", "retrain_epochs", "train_examples"):
        if getattr(FLAGS, name) is not None and getattr(FLAGS, name) < 1:
            _cli.fail(f"--{name}={getattr(FLAGS, name)} is not valid; expected an integer "
                      f">= 1", 2)
    import keras

    from keras_identity.training import ConfigError
    from keras_identity.tuning import run_search

    summaries = []
    for net in NETS:
        print(f"== {net}-{FLAGS.depth}: random search of {FLAGS.trials} trials", flush=True)
        try:
            result = run_search(search_config(net))
        except ConfigError as error:
            _cli.fail(error, 2)
        keras.backend.clear_session()
        summaries.append(summarize(net, result))
    text, ratio = report(summaries)
    os.makedirs(FLAGS.run_dir, exist_ok=True)
    figure = os.path.join(FLAGS.run_dir, f"fig1_{FLAGS.depth}.png")
    _plot(summaries, figure)
    directory = FLAGS.report_dir or _report.RESULTS
    name = "highway_fig1_search_mnist.md"
    summary = (f"{FLAGS.depth} layers, {FLAGS.trials} trials per net: final training loss "
               + ", ".join(f"{s['net']} {s['retrain_loss']:.3g}" for s in summaries)
               + (f" (plain/highway {ratio:.3g}x)" if ratio else ""))
    text = (_report.header(f"Highway networks, Fig. 1 at {FLAGS.depth} layers: random search",
                           summary=summary) + "\n" + text + "\n\n"
            + _report.copy_figure(figure, f"highway_fig1_search_{FLAGS.depth}.png",
                                  directory=directory))
    with open(os.path.join(FLAGS.run_dir, "summary.json"), "w") as f:
        json.dump(summaries, f, indent=1)
    print(f"report: {_report.write(name, text, directory=directory)}")


def run():
    app.run(main, flags_parser=_cli.one_line_flags_parser)


if __name__ == "__main__":
    run()

r"""Looks-linear initialisation against shattered gradients (Balduzzi et al. 2017, Fig. 6).

    python -m experiments.looks_linear --data_dir=../shared/data       # 200 iterations
    python -m experiments.reproduce --claim=looks_linear                # to the end (CPU)

Trains, at each of ``--depths``, three MNIST convnets with the same seed and
data order, each a resumable ``keras-identity-train`` run: a feedforward ReLU
net (``plain_net(architecture="convolutional")``, He initialisation), the
same net with CReLU and the looks-linear initialisation (widths / sqrt(2),
``activation="crelu", kernel_initializer="looks_linear"``), and a ResNet
(``resnet(depth, dataset="mnist")``).  All take the same recipe and learning
rate and stop ``--iterations`` into it: the recipe's 30 epochs, each ``--interval``
iterations (a logged point), so ``--iterations`` equal to 30 x ``--interval`` trains
to the end of the schedule (lr /10 at 50% and 75%).  The report states the paper's claim
(ReLU nets get worse with depth; the looks-linear CReLU net trains about as
well as a ResNet), ours, the scale and a verdict, beside the notes' 1-D
measurement (the lag-1 autocorrelation of the input gradient at depth 50,
:func:`keras_identity.analysis.shattering_study`).
"""

import json
import os

from absl import app
from absl import flags

from experiments import _cli
from experiments import _report
from experiments import _runs
from experiments._curves import tail_mean
from experiments._verdicts import looks_linear_verdict

FLAGS = flags.FLAGS
flags.DEFINE_string("data_dir", None, "MNIST (an .npz or a tfds directory; default: the "
                    "built-in MNIST).")
flags.DEFINE_list("depths", ["10", "30"], "Depths (weight layers, 2n+2 for the ResNet).")
flags.DEFINE_integer("iterations", 200, "Training iterations of every net (batch 128); at "
                     "most the schedule's length: the recipe's epochs x --interval.")
flags.DEFINE_integer("interval", 25, "Iterations between two logged points: one of the "
                     "recipe's epochs, so the schedule is its epochs x --interval iterations.")
flags.DEFINE_float("learning_rate", 0.01, "The learning rate of every net (SGD, momentum "
                   "0.9; the paper: Adam with its auto-scheduler).")
flags.DEFINE_integer("test_examples", 1000, "Test images evaluated at each point (0: all).")
flags.DEFINE_integer("seed", 0, "Seed of every run (initialisation, data order).")
flags.DEFINE_integer("gradient_depth", 50, "Depth of the notes' 1-D nets (0: skip them).")
flags.DEFINE_string("run_dir", "runs/looks_linear", "Directory of the runs.")
flags.DEFINE_string("report_dir", None, "Where the report goes (default: docs/results/).")
flags.DEFINE_string("report", "looks_linear_mnist.md", "Report name.")

RECIPE = "highway_mnist_conv"
_CONV = {"architecture": "convolutional"}
KINDS = (
    ("relu", "ReLU, He init", ["--model=plain_net", "--model_kwargs=" + json.dumps(
        {**_CONV, "kernel_initializer": "he_normal"})]),
    ("crelu_ll", "CReLU, looks-linear", ["--model=plain_net", "--model_kwargs=" + json.dumps(
        {**_CONV, "activation": "crelu", "kernel_initializer": "looks_linear"})]),
    ("resnet", "ResNet", ["--model=resnet"]),
)
LAST_POINTS = 3


def nets():
    """``(key, label, depth, argv)`` of every run, depth by depth."""
    return [(f"{kind}{depth}", f"{label}, depth {depth}", int(depth),
             [*argv, f"--depth={depth}"]) for depth in FLAGS.depths
            for kind, label, argv in KINDS]


def plan():
    """The runs' schedule as the trainer plans it (:func:`keras_identity.recipes.resolve`):
    the recipe's epochs, each ``--interval`` iterations (a logged point)."""
    from keras_identity import recipes

    return recipes.resolve(recipes.RECIPES[RECIPE], num_train=60000,
                           learning_rate=FLAGS.learning_rate, steps_per_epoch=FLAGS.interval)


def schedule():
    """The schedule's length in iterations."""
    return plan().total_steps


def scale_text():
    """How far into the schedule the runs go, in words."""
    length = schedule()
    where = ("the whole schedule" if FLAGS.iterations == length else
             f"{100 * FLAGS.iterations / length:.0f}% of the schedule")
    steps = " and ".join(str(b) for b in plan().boundaries)
    return (f"{FLAGS.iterations} iterations ({FLAGS.iterations * 128 / 60000:.2f} epochs): "
            f"{where} of {length} iterations, lr /10 at {steps}")


def run_dir(key):
    return os.path.join(FLAGS.run_dir, key)


def train_argv(argv):
    return [*argv, "--dataset=mnist", f"--recipe={RECIPE}",
            f"--learning_rate={FLAGS.learning_rate:g}", f"--stop_at_step={FLAGS.iterations}",
            *_runs.shared_argv(FLAGS.interval, FLAGS.seed, FLAGS.test_examples, FLAGS.data_dir)]


def error(key):
    """The training error over the last logged points; 0.9 (chance) for a
    run that diverged."""
    if _runs.diverged(run_dir(key)):
        return 0.9
    return tail_mean(_runs.history(run_dir(key)), "train_error", LAST_POINTS)


def gradient_row():
    """The notes' 1-D nets at ``--gradient_depth``: lag-1 autocorrelations."""
    if not FLAGS.gradient_depth:
        return None
    import keras_identity as ki

    rows, _ = ki.analysis.shattering_study(depths=(FLAGS.gradient_depth,))
    return rows[0]


def write_report(gradients):
    from keras_identity.training import plot_errors

    depths = [int(d) for d in FLAGS.depths]
    runs = nets()
    errors = {key: error(key) for key, *_ in runs}
    images = LAST_POINTS * FLAGS.interval * 128
    verdict_text = looks_linear_verdict(errors, depths, images)
    deep = max(depths)
    window = LAST_POINTS * FLAGS.interval
    summary = (f"MNIST convnets, {FLAGS.iterations} iterations"
               + (" (the whole schedule)" if FLAGS.iterations == schedule() else "")
               + f", training error at depth "
               f"{deep}: ReLU {100 * errors[f'relu{deep}']:.1f}%, CReLU looks-linear "
               f"{100 * errors[f'crelu_ll{deep}']:.1f}%, ResNet "
               f"{100 * errors[f'resnet{deep}']:.1f}%"
               + (f"; 1-D lag-1 autocorrelation at depth {gradients['depth']}: "
                  f"{gradients['looks_linear']:.3f} (plain {gradients['plain']:.3f})"
                  if gradients else "") + "; " + verdict_text.split(":")[0])
    stem = os.path.splitext(FLAGS.report)[0]
    directory = FLAGS.report_dir or _report.RESULTS
    text = _report.header("Balduzzi et al. (2017) Fig. 6: looks-linear CReLU nets against "
                          "ReLU nets and ResNets (MNIST)", summary=summary)
    text += (
        "\n**The claim** (Balduzzi et al. 2017, Sec. 5 and Fig. 6, in the lecture notes): "
        "with the looks-linear initialisation (CReLU, neighbouring weight columns W and -W, "
        "so the net is linear at initialisation) a feedforward net's gradients do not "
        "shatter, and it trains about as well as a ResNet at depths where feedforward ReLU "
        "nets fail. CIFAR-10, thin convnets of depths up to 198, Adam, 10 runs a point: the "
        "ReLU nets get steadily worse with depth (below the 40% linear baseline at 198); the "
        "looks-linear net performs comparably to the ResNet.\n\n"
        f"**Ours**: MNIST convnets at depths {', '.join(FLAGS.depths)} (weight layers): the "
        f"plain convolutional net of the highway study (3x3 convolutions in three stages "
        f"with 2x2 max pooling, 23 maps, no batch normalisation) with ReLU and He "
        f"initialisation; the same net with CReLU and the looks-linear initialisation (16 "
        f"maps, doubled by CReLU: about the same parameters); and the MNIST ResNet (1x1 "
        f"conv0, basic units of 16 channels with batch normalisation). SGD with momentum 0.9 "
        f"at lr {FLAGS.learning_rate:g} for every net (the `highway_mnist_conv` recipe, weight "
        f"decay 5e-4, batch 128), {scale_text()}; seed {FLAGS.seed} for all (the same "
        f"data order), one seed. Training error: the mean over the last {window} iterations; "
        f"test error on "
        + (f"{FLAGS.test_examples} test images" if FLAGS.test_examples else "the test set")
        + ". A run whose loss becomes NaN counts as chance (90%).\n\n"
        f"**Verdict**: {verdict_text}.\n\n"
        f"| depth | net | trainable parameters | training error, last {window} iterations | "
        f"test error, last {window} iterations | images/s |\n"
        "| --- | --- | --- | --- | --- | --- |\n")
    for key, label, depth, _ in runs:
        rows = _runs.history(run_dir(key))
        test = ("diverged" if _runs.diverged(run_dir(key)) else
                f"{100 * tail_mean(rows, 'test_error', LAST_POINTS):.1f}%")
        text += (f"| {depth} | {label.rsplit(', depth', 1)[0]} | "
                 f"{_runs.parameters(run_dir(key))} | {100 * errors[key]:.1f}% | {test} | "
                 f"{_runs.median_speed(run_dir(key)):.1f} |\n")
    if gradients:
        text += (f"\n**The notes' 1-D nets** (200 units a layer, depth {gradients['depth']}, "
                 f"3 seeds, `keras_identity.analysis.shattering_study`): the lag-1 "
                 f"autocorrelation of the input gradient is {gradients['plain']:.3f} for the "
                 f"plain net (white noise: 0), {gradients['residual']:.3f} for the residual "
                 f"net and {gradients['looks_linear']:.3f} for the looks-linear CReLU net "
                 f"(a linear function's gradient: 1).\n")
    done = [(key, label) for key, label, *_ in runs if _runs.history(run_dir(key))]
    figure = os.path.join(FLAGS.run_dir, f"{stem}.png")
    plot_errors([run_dir(key) for key, _ in done], figure, [label for _, label in done],
                title="MNIST convnets: training (dashed) and test (bold) error")
    text += "\n" + _report.copy_figure(figure, f"{stem}.png", directory) + "\n"
    text += "\n## The runs\n\n| net | command |\n| --- | --- |\n"
    for key, label, _, argv in runs:
        text += f"| {label} | `{_runs.shown(run_dir(key), train_argv(argv))}` |\n"
    print(f"wrote {_report.write(FLAGS.report, text, directory)}", flush=True)


def main(argv):
    if len(argv) > 1:
        _cli.fail(f"unexpected arguments {argv[1:]}", 2)
    try:
        depths = [int(d) for d in FLAGS.depths]
    except ValueError:
        depths = []
    if len(depths) < 2 or not all(d >= 4 and d % 2 == 0 for d in depths):
        _cli.fail(f"--depths={','.join(FLAGS.depths)} is not valid; expected two or more even "
                  f"depths >= 4 (2n+2, the ResNet's), e.g. 10,30", 2)
    _cli.require_at_least(FLAGS, ("iterations", "interval"), 1)
    if FLAGS.iterations % FLAGS.interval:
        _cli.fail(f"--iterations={FLAGS.iterations} is not valid; expected a multiple of "
                  f"--interval={FLAGS.interval}", 2)
    if FLAGS.iterations > schedule():
        _cli.fail(f"--iterations={FLAGS.iterations} is not valid; expected at most the "
                  f"schedule's {schedule()} ({schedule() // FLAGS.interval} epochs x "
                  f"--interval={FLAGS.interval})", 2)
    _cli.require_at_least(FLAGS, ("test_examples", "gradient_depth"), 0)
    if FLAGS.learning_rate <= 0:
        _cli.fail(f"--learning_rate={FLAGS.learning_rate:g} is not valid; expected > 0", 2)
    for key, label, _, net_argv in nets():
        _runs.train(run_dir(key), train_argv(net_argv), label, FLAGS.iterations,
                    divergence_is_a_result=True)
    write_report(gradient_row())


def run():
    app.run(main, flags_parser=_cli.one_line_flags_parser)


if __name__ == "__main__":
    run()

r"""The degradation problem (He et al. 2015, Figs. 1, 4 and 6; in the lecture notes).

    python -m experiments.degradation --data_dir=../shared/data       # CPU scale

Trains plain CIFAR-10 nets of two depths (``resnet(depth,
shortcut="constant_scaling", shortcut_scale=0)``: He et al.'s plain nets,
the ResNets without their shortcuts) and their residual twins (original
units, option A shortcuts), each a resumable ``keras-identity-train`` run
of the `cifar` recipe stopped ``--iterations`` into its full schedule (the
learning rate is the full run's), all with the same seed and data order.
The report draws the four nets' training and test error on one plot (He et
al.'s Fig. 6 style) and gives a verdict on the claim: the deeper plain net
has the higher *training* error, its residual twin does not.
"""

import os

from absl import app
from absl import flags

from experiments import _cli
from experiments import _report
from experiments import _runs
from experiments._verdicts import degradation_verdict
from experiments._verdicts import left_chance
from experiments._verdicts import points_above
from experiments._curves import tail_mean

FLAGS = flags.FLAGS
flags.DEFINE_string("data_dir", None, "CIFAR-10 data (tfds directory or offline files).")
flags.DEFINE_list("depths", ["20", "56"], "The shallower and the deeper depth (6n+2).")
flags.DEFINE_integer("iterations", 2000, "Stop every run at this iteration of the recipe's "
                     "full schedule (64k iterations at batch 128).")
flags.DEFINE_integer("interval", 25, "Iterations between two logged points (the training "
                     "error is their mean, with augmentation).")
flags.DEFINE_integer("batch_size", 128, "Global batch size (the paper's: 128).")
flags.DEFINE_integer("test_examples", 500, "Test images evaluated at each point (0: all).")
flags.DEFINE_integer("seed", 0, "Seed of every run (initialisation, data order).")
flags.DEFINE_string("run_dir", "runs/degradation", "Directory of the runs.")
flags.DEFINE_string("report_dir", None, "Where the report goes (default: docs/results/).")
flags.DEFINE_string("report", "degradation_cifar10.md", "Report name.")

KINDS = (
    ("plain", "plain", ["--model=resnet", "--shortcut=constant_scaling",
                        "--shortcut_scale=0"]),
    ("resnet", "ResNet", ["--model=resnet"]),
)
LAST_POINTS = 3   # the training error compared: the mean of the last logged points


def nets():
    """``(key, label, argv)`` of every run: plain, then residual, shallow first."""
    return [(f"{kind}{depth}", f"{label}-{depth}", [*argv, f"--depth={depth}"])
            for kind, label, argv in KINDS for depth in FLAGS.depths]


def run_dir(key):
    return os.path.join(FLAGS.run_dir, key)


def train_argv(argv):
    return [*argv, "--dataset=cifar10", f"--batch_size={FLAGS.batch_size}",
            f"--stop_at_step={FLAGS.iterations}",
            *_runs.shared_argv(FLAGS.interval, FLAGS.seed, FLAGS.test_examples, FLAGS.data_dir)]


def write_report():
    from keras_identity.training import plot_errors
    from keras_identity import recipes

    shallow, deep = FLAGS.depths
    runs = [(key, label, argv) for key, label, argv in nets() if _runs.history(run_dir(key))]
    if len(runs) < 4:
        return
    rows = {key: _runs.history(run_dir(key)) for key, *_ in runs}
    errors = {key: tail_mean(r, "train_error", LAST_POINTS) for key, r in rows.items()}
    tests = {key: tail_mean(r, "test_error", LAST_POINTS) for key, r in rows.items()}
    quarter = max(LAST_POINTS, len(rows[runs[0][0]]) // 4)
    first_gaps = {kind: tail_mean(rows[f"{kind}{deep}"][:quarter], "train_error", LAST_POINTS)
                  - tail_mean(rows[f"{kind}{shallow}"][:quarter], "train_error", LAST_POINTS)
                  for kind in ("plain", "resnet")}
    verdict_text = degradation_verdict(errors, shallow, deep,
                                       LAST_POINTS * FLAGS.interval * FLAGS.batch_size,
                                       FLAGS.iterations, first_gaps)
    plan = recipes.resolve(recipes.get_recipe("cifar"), num_train=50_000,
                           batch_size=FLAGS.batch_size, depth=int(deep),
                           steps_per_epoch=FLAGS.interval)
    stem = os.path.splitext(FLAGS.report)[0]
    directory = FLAGS.report_dir or _report.RESULTS
    window = LAST_POINTS * FLAGS.interval
    summary = (f"{FLAGS.iterations} iterations at batch {FLAGS.batch_size}, training error "
               f"(last {window} iterations): plain-{shallow} {100 * errors[f'plain{shallow}']:.1f}%"
               f", plain-{deep} {100 * errors[f'plain{deep}']:.1f}%, ResNet-{shallow} "
               f"{100 * errors[f'resnet{shallow}']:.1f}%, ResNet-{deep} "
               f"{100 * errors[f'resnet{deep}']:.1f}%; " + verdict_text.split(":")[0])
    text = _report.header(f"The degradation problem: plain and residual nets of {shallow} and "
                          f"{deep} layers on CIFAR-10", summary=summary)
    text += (
        "\n**The claim** (He et al. 2015, Sec. 4.1-4.2, Figs. 1, 4 and 6, in the lecture "
        "notes): a deeper plain net has a *higher training error* than a shallower one (the "
        "degradation problem: not overfitting, an optimisation difficulty); with residual "
        "learning the deeper net is not worse. On CIFAR-10 (Fig. 6): plain-56's training "
        "error stays above plain-20's for all 64k iterations, while ResNet-56 ends below "
        "ResNet-20 (test errors 6.97% and 8.75%).\n\n"
        f"**Ours**: `resnet(depth)` (original units, option A shortcuts) and the same nets "
        f"with the shortcuts removed, depths {shallow} and {deep}; the `cifar` recipe at "
        f"batch {FLAGS.batch_size} (lr {plan.learning_rate:g}, momentum 0.9, weight decay "
        f"1e-4, pad-4 crop + flip), every run stopped after {FLAGS.iterations} of its "
        f"{plan.total_steps:,} iterations ({100 * FLAGS.iterations / plan.total_steps:.2f}% of "
        f"the schedule; the learning rate is the full run's), seed {FLAGS.seed} for all (the "
        f"same data order), one seed. Training error: the mean over the {FLAGS.interval} "
        f"iterations before each point, with augmentation, compared over the last {window} "
        f"iterations; test error on "
        + (f"{FLAGS.test_examples} test images" if FLAGS.test_examples else "the test set")
        + ".\n\n"
        f"**Verdict**: {verdict_text}.\n\n"
        + _curve_reading(rows, shallow, deep)
        + _chance_reading(runs, errors, window) +
        f"| net | trainable parameters | training error, last {window} iterations | test "
        f"error, last {window} iterations | images/s |\n| --- | --- | --- | --- | --- |\n")
    for key, label, _ in runs:
        text += (f"| {label} | {_runs.parameters(run_dir(key))} | {100 * errors[key]:.1f}% | "
                 f"{100 * tests[key]:.1f}% | {_runs.median_speed(run_dir(key)):.1f} |\n")
    text += ("\n## Training error at each logged point\n\n| iteration | "
             + " | ".join(label for _, label, _ in runs) + " |\n"
             + "| --- " * (len(runs) + 1) + "|\n")
    for index, row in enumerate(rows[runs[0][0]]):
        cells = [f"{100 * rows[key][index]['train_error']:.1f}%"
                 if index < len(rows[key]) else "-" for key, *_ in runs]
        text += f"| {row['step']} | " + " | ".join(cells) + " |\n"
    figure = os.path.join(FLAGS.run_dir, f"{stem}.png")
    plot_errors([run_dir(key) for key, *_ in runs], figure, [label for _, label, _ in runs],
                title=f"CIFAR-10, first {FLAGS.iterations} iterations: training (dashed) "
                      f"and test (bold) error")
    text += "\n" + _report.copy_figure(figure, f"{stem}.png", directory) + "\n"
    text += "\n## The runs\n\n| net | command |\n| --- | --- |\n"
    for key, label, argv in runs:
        text += f"| {label} | `{_runs.shown(run_dir(key), train_argv(argv))}` |\n"
    print(f"wrote {_report.write(FLAGS.report, text, directory)}", flush=True)


CHANCE = 0.9   # the training error of a net that has not started (10 classes)
STARTED = 0.85  # a net whose training error is below this has left chance


def _curve_reading(rows, shallow, deep):
    """What the whole curves show (He et al. compare them throughout, Fig. 6):
    where each net left chance, and at how many logged points the deeper net
    is above the shallower one."""
    parts = []
    for key, label in ((f"resnet{deep}", f"ResNet-{deep}"), (f"plain{deep}", f"plain-{deep}"),
                       (f"resnet{shallow}", f"ResNet-{shallow}"),
                       (f"plain{shallow}", f"plain-{shallow}")):
        step = left_chance(rows[key], STARTED)
        parts.append(f"{label} at iteration {step}" if step is not None else
                     f"{label} not within its {rows[key][-1]['step']} iterations")
    text = (f"**The curves**: the training error first falls below {100 * STARTED:.0f}% "
            f"(chance: 90%) for {', '.join(parts)}. ")
    for kind, label in (("plain", "plain"), ("resnet", "ResNet")):
        above, of = points_above(rows[f"{kind}{deep}"], rows[f"{kind}{shallow}"])
        text += (f"{label}-{deep}'s training error is above {label}-{shallow}'s at {above} of "
                 f"the {of} logged points" + ("; " if kind == "plain" else ".\n\n"))
    return text


def _chance_reading(runs, errors, window):
    """A sentence naming the nets still at chance (they have not started to
    train, so their gap says nothing yet), or nothing."""
    stuck = [label for key, label, _ in runs if errors[key] > CHANCE - 0.02]
    if not stuck:
        return ""
    return (f"Still at chance (training error within 2 points of 90% over the last {window} "
            f"iterations): {', '.join(stuck)}. "
            + ("They have" if len(stuck) > 1 else "It has") + " not started to train at this "
            "length, so the comparison needs more iterations (`--iterations`, or the paper's "
            "scale).\n\n")


def main(argv):
    if len(argv) > 1:
        _cli.fail(f"unexpected arguments {argv[1:]}", 2)
    try:
        depths = [int(d) for d in FLAGS.depths]
    except ValueError:
        depths = []
    if len(depths) != 2 or not all(d >= 8 and (d - 2) % 6 == 0 for d in depths) or (
            depths[0] >= depths[1]):
        _cli.fail(f"--depths={','.join(FLAGS.depths)} is not valid; expected two depths "
                  f"6n+2, the shallower first (e.g. 20,56)", 2)
    _cli.require_at_least(FLAGS, ("iterations", "interval", "batch_size"), 1)
    if FLAGS.test_examples < 0:
        _cli.fail(f"--test_examples={FLAGS.test_examples} is not valid; expected >= 0", 2)
    if FLAGS.iterations % FLAGS.interval:
        _cli.fail(f"--iterations={FLAGS.iterations} is not valid; expected a multiple of "
                  f"--interval={FLAGS.interval}", 2)
    for key, label, net_argv in nets():
        _runs.train(run_dir(key), train_argv(net_argv), label, FLAGS.iterations)
    write_report()


def run():
    app.run(main, flags_parser=_cli.one_line_flags_parser)


if __name__ == "__main__":
    run()

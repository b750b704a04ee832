r"""Fig. 1 of He et al. (2016): the original against the pre-activation ResNet-1001.

    python -m experiments.he_fig1 --data_dir=../shared/data --iterations=300 \
        --seed_iterations=100                       # the start of the curves (CPU)
    python -m experiments.he_fig1 --data_dir=... --batch_size=128 --iterations=0 \
        --seed_iterations=0 --interval=400 --chunk=64000 --test_examples=0
                                                    # the paper's 64k iterations (GPU)

Trains ``resnet(1001, unit="original")`` (Fig. 4(a), f = ReLU after the
addition) and ``preact_resnet(1001)`` (Fig. 4(e)) with the `cifar` recipe,
the same seed and so the same data order, and writes a report with their
training-loss curves against iterations (the paper's dashed lines), the loss
at fixed iterations and a verdict on the paper's statement (Sec. 4.2, "Ease
of optimization"): with the original unit "the training error is reduced
very slowly at the beginning of training", while the pre-activation net
"reduces the training loss very quickly".

``--iterations`` stops both runs that far into the recipe's full schedule
(``keras-identity-train --stop_at_step``: the learning rate is the full
run's, not a shortened one's).  A second seed of each net,
``--seed_iterations`` long, measures how far a seed alone moves the curves.
The runs take turns of ``--chunk`` iterations (every run reaches a turn's
iteration before any goes further), so that at any moment the nets have
trained equally long and the report, rewritten after every turn, compares
equal lengths.  Every run is a ``keras-identity-train`` run with its own
``--model_dir``: killed, the same command continues it.
"""

import math
import os

from absl import app
from absl import flags

from experiments import _cli
from experiments import _report
from experiments import _runs
from experiments._curves import loss_at
from experiments._curves import verdict

FLAGS = flags.FLAGS
flags.DEFINE_string("data_dir", None, "CIFAR-10 data (tfds directory or offline files).")
flags.DEFINE_integer("depth", 1001, "Depth of both nets (9n+2 bottleneck units: 164, 1001).")
flags.DEFINE_integer("batch_size", 64, "Global batch size (the paper: 128; its public "
                     "1001-layer code: 64). The recipe's learning rate scales with it.")
flags.DEFINE_integer("iterations", 300, "Stop both seed-0 runs at this iteration of the full "
                     "schedule (0: the whole schedule, 64k iterations at batch 128).")
flags.DEFINE_integer("seed_iterations", 100, "Length of the second seed's runs (0: none).")
flags.DEFINE_integer("interval", 25, "Iterations between two logged points (the training "
                     "loss is their mean; the test error is measured at each).")
flags.DEFINE_integer("chunk", 100, "Iterations a net trains before the other takes its turn "
                     "(each turn rebuilds the net: about a minute at 1001 layers on a CPU).")
flags.DEFINE_integer("test_examples", 250, "Test images evaluated at each point (0: all).")
flags.DEFINE_string("run_dir", "runs/he_fig1", "Directory of the runs.")
flags.DEFINE_string("report_dir", None, "Where the report goes (default: docs/results/).")
flags.DEFINE_string("report", None, "Report name under docs/results/ (default: "
                    "he_fig1_<depth>.md).")

# (key, label, keras-identity-train flags)
NETS = [
    ("original", "original unit, Fig. 4(a)", ["--model=resnet", "--unit=original"]),
    ("preact", "full pre-activation, Fig. 4(e)", ["--model=preact_resnet"]),
]
# The iterations at which the report's table reads the training loss.
CHECKPOINTS = (25, 50, 100, 200, 300, 400, 600, 800, 1000, 2000, 4000, 8000, 16000, 32000,
               64000, 128000)


def run_plan():
    """The `cifar` recipe resolved for --batch_size and --depth (as the trainer does)."""
    from keras_identity import recipes

    return recipes.resolve(recipes.get_recipe("cifar"), num_train=50_000,
                           batch_size=FLAGS.batch_size, depth=FLAGS.depth,
                           steps_per_epoch=FLAGS.interval)


def run_dir(key, seed):
    return os.path.join(FLAGS.run_dir, f"resnet{FLAGS.depth}_{key}_seed{seed}")


def train_argv(key, seed, stop):
    """The ``keras-identity-train`` flags of one run, up to iteration ``stop``
    (``None``: the whole schedule)."""
    argv = [*NETS_BY_KEY[key]["argv"], f"--depth={FLAGS.depth}", "--dataset=cifar10",
            f"--batch_size={FLAGS.batch_size}",
            *_runs.shared_argv(FLAGS.interval, seed, FLAGS.test_examples, FLAGS.data_dir)]
    return argv + ([f"--stop_at_step={stop}"] if stop else [])


NETS_BY_KEY = {key: {"label": label, "argv": argv} for key, label, argv in NETS}


def history(key, seed):
    return _runs.history(run_dir(key, seed))


def reached(key, seed):
    return _runs.reached(run_dir(key, seed))


def train_to(key, seed, stop):
    """Trains one run to iteration ``stop``; its output goes to train.log."""
    _runs.train(run_dir(key, seed), train_argv(key, seed, stop), f"{key} seed {seed}", stop)


def write_report():
    from keras_identity.training import plot_runs

    curves = {key: history(key, 0) for key, *_ in NETS}
    seed_curves = {key: history(key, 1) for key, *_ in NETS}
    common = sorted(set(r["step"] for r in curves["original"])
                    & set(r["step"] for r in curves["preact"]))
    verdict_text = verdict(curves, seed_curves, common)
    plan = run_plan()
    last = common[-1] if common else 0
    summary = (f"ResNet-{FLAGS.depth}, batch {FLAGS.batch_size}, first {last} iterations: "
               f"training loss {loss_at(curves['original'], last):.3f} (original) against "
               f"{loss_at(curves['preact'], last):.3f} (pre-activation); "
               + verdict_text.split(":")[0] if common else None)
    name = FLAGS.report or f"he_fig1_{FLAGS.depth}.md"
    directory = FLAGS.report_dir or _report.RESULTS
    stem = os.path.splitext(name)[0]
    text = _report.header(f"He et al. (2016) Fig. 1: original against pre-activation "
                          f"ResNet-{FLAGS.depth} on CIFAR-10", summary=summary)
    text += (
        f"\n**The paper** (Sec. 4.2, Fig. 1, ResNet-1001 on CIFAR-10, batch 128, 64k "
        f"iterations): \"Using the original design, the training error is reduced very "
        f"slowly at the beginning of training ... Our 1001-layer network reduces the training "
        f"loss very quickly.\" Final test errors 7.61% (original) and 4.92% (pre-activation), "
        f"Table 3.\n\n"
        f"**Ours**: ResNet-{FLAGS.depth} both ways (bottleneck units, the same widths), "
        f"the `cifar` recipe at batch {FLAGS.batch_size} (lr {plan.learning_rate:g}"
        + (f" after a warm-up at {plan.warmup_rate:g} for its first {plan.warmup_steps} "
           f"iterations, as the recipe sets for this depth" if plan.warmup_steps else "")
        + f"; momentum 0.9, weight decay 1e-4, pad-4 crop + flip), stopped "
        + (f"after {last} of its {plan.total_steps:,} iterations (the learning "
           f"rate is the full schedule's)" if last < plan.total_steps else "at the end of "
           f"its {plan.total_steps:,} iterations")
        + f". Both nets see the same images in the same order (seed 0); a second seed "
        f"(seed 1) runs {FLAGS.seed_iterations or 'no'} iterations of each. Training loss: "
        f"the mean over the {FLAGS.interval} iterations before each point (with "
        f"augmentation); test error on "
        + (f"{FLAGS.test_examples} test images" if FLAGS.test_examples else "the test set")
        + f". At batch {FLAGS.batch_size} one iteration is {FLAGS.batch_size / 128:g} of the "
        f"paper's; the paper's plot spans 64k iterations, so this is its first "
        f"{100 * last / plan.total_steps:.2f}%.\n\n"
        f"**Verdict**: {verdict_text}.\n")
    if common:
        chance = math.log(10)
        text += (f"\nA uniform guess has a loss of ln 10 = {chance:.3f}. At iteration {last} "
                 f"the original net is {_versus(loss_at(curves['original'], last), chance)} "
                 f"and the pre-activation net {_versus(loss_at(curves['preact'], last), chance)}"
                 f"; the original's first point ({curves['original'][0]['loss']:.2f} against "
                 f"{curves['preact'][0]['loss']:.2f}) shows the loss it starts from.\n")
    text += ("\n## Training loss at fixed iterations\n\n| iteration | original (a), seed 0 | "
             "pre-activation (e), seed 0 | original, seed 1 | pre-activation, seed 1 |\n"
             "| --- | --- | --- | --- | --- |\n")
    steps = [s for s in CHECKPOINTS if s in common] + ([last] if last and last not in
                                                         CHECKPOINTS else [])

    def cell(rows, step):
        value = loss_at(rows, step)
        return "-" if value is None else f"{value:.3f}"

    for step in steps:
        text += (f"| {step} | {cell(curves['original'], step)} | "
                 f"{cell(curves['preact'], step)} | {cell(seed_curves['original'], step)} | "
                 f"{cell(seed_curves['preact'], step)} |\n")
    text += "\n## The runs\n\n| run | trainable parameters | iterations | images/s | command |\n"
    text += "| --- | --- | --- | --- | --- |\n"
    for seed in (0, 1):
        for key, label, _ in NETS:
            rows = history(key, seed)
            if not rows:
                continue
            params = _runs.parameters(run_dir(key, seed))
            speed = _runs.median_speed(run_dir(key, seed))
            command = _runs.shown(run_dir(key, seed), train_argv(key, seed, rows[-1]["step"]))
            text += (f"| {label}, seed {seed} | {params} | {rows[-1]['step']} | "
                     f"{speed:.1f} | `{command}` |\n")
    runs = [(f"{NETS_BY_KEY[key]['label']}, seed {seed}", run_dir(key, seed))
            for seed in (0, 1) for key, *_ in NETS if history(key, seed)]
    if runs:
        figure = os.path.join(FLAGS.run_dir, f"{stem}_curves.png")
        plot_runs([r for _, r in runs], figure, labels=[label for label, _ in runs],
                  title=f"ResNet-{FLAGS.depth}, CIFAR-10: training loss (dashed), test error "
                        f"(solid)", log_loss=True)
        text += "\n" + _report.copy_figure(figure, f"{stem}_curves.png", directory) + "\n"
    text += (f"\nThe paper's scale (GPU): `python -m experiments.reproduce "
             f"--claim=he_fig1_1001 --scale=paper`.\n")
    print(f"wrote {_report.write(name, text, directory)}", flush=True)


def _versus(loss, chance):
    difference = loss - chance
    return f"{abs(difference):.3f} {'above' if difference > 0 else 'below'} it"


def main(argv):
    if len(argv) > 1:
        _cli.fail(f"unexpected arguments {argv[1:]}", 2)
    _cli.require_at_least(FLAGS, ("iterations", "seed_iterations"), 0)
    _cli.require_at_least(FLAGS, ("interval", "chunk", "batch_size", "depth"), 1)
    if FLAGS.test_examples < 0:
        _cli.fail(f"--test_examples={FLAGS.test_examples} is not valid; expected >= 0", 2)
    for name in ("iterations", "seed_iterations", "chunk"):
        if FLAGS[name].value % FLAGS.interval:
            _cli.fail(f"--{name}={FLAGS[name].value} is not valid; expected a multiple of "
                      f"--interval={FLAGS.interval}", 2)
    total = run_plan().total_steps
    if FLAGS.iterations > total:
        _cli.fail(f"--iterations={FLAGS.iterations} is not valid; expected at most the "
                  f"schedule's {total:,} iterations at --batch_size={FLAGS.batch_size} (0: "
                  f"all of them)", 2)
    if FLAGS.seed_iterations > (FLAGS.iterations or total):
        _cli.fail(f"--seed_iterations={FLAGS.seed_iterations} is not valid; expected at most "
                  f"--iterations={FLAGS.iterations or total}", 2)
    # Turns of --chunk iterations: every run reaches a target before any goes
    # further, so the second seed's runs come early and seed 0 goes on alone.
    lengths = {0: FLAGS.iterations or total, 1: FLAGS.seed_iterations}
    target = 0
    while target < lengths[0]:
        target = min(lengths[0], target + FLAGS.chunk)
        for seed, length in lengths.items():
            for key, *_ in NETS:
                if reached(key, seed) < min(length, target):
                    train_to(key, seed, min(length, target))
        write_report()


def run():
    app.run(main, flags_parser=_cli.one_line_flags_parser)


if __name__ == "__main__":
    run()

r"""Residual networks as ensembles of paths (Veit et al. 2016, in the lecture notes).

    python -m experiments.veit_deletion --data_dir=../shared/data      # CPU scale
    python -m experiments.veit_deletion --weights=mnist --test_examples=2000 --draws=3

Trains the lecture notes' MNIST ResNet (``resnet52_mnist``: a 1x1 ``conv0``,
25 basic units of 16 channels, 117,802 parameters) and its plain twin (the
same net with the shortcuts removed: ``--shortcut=constant_scaling
--shortcut_scale=0``), each a resumable ``keras-identity-train`` run with the
same seed and data order (or, with ``--weights``, builds each net that has
a preset of that name, trained to the end, from it), then deletes units of
each (:func:`keras_identity.analysis.deletion_study`): every unit on its own, and
``k`` units drawn at random for every ``k``.  The report states Veit et al.'s
claims (deleting one unit of a residual network barely changes its error; the
error grows smoothly with the units deleted; a plain network fails when one
layer goes), ours, the scale and a verdict, with the figure of
:func:`keras_identity.analysis.plot_deletions`.
"""

import os

from absl import app
from absl import flags

from experiments import _cli
from experiments import _report
from experiments import _runs
from experiments._verdicts import BARELY
from experiments._verdicts import COLLAPSE
from experiments._verdicts import deletion_verdict
from experiments._verdicts import mean_single_deletion
from experiments._verdicts import smoothness
from experiments._verdicts import worst_single_deletion

FLAGS = flags.FLAGS
flags.DEFINE_string("data_dir", None, "MNIST (an .npz or a tfds directory; default: the "
                    "built-in MNIST).")
flags.DEFINE_integer("train_steps", 480, "Training iterations of each net (batch 128).")
flags.DEFINE_integer("interval", 40, "Iterations between two logged points.")
flags.DEFINE_integer("test_examples", 500, "Test images of the deletion study (and of the "
                     "logged test error).")
flags.DEFINE_integer("draws", 2, "Random draws of k deleted units, for every k.")
flags.DEFINE_integer("seed", 0, "Seed of both runs (initialisation, data order) and of the "
                     "draws.")
flags.DEFINE_string("weights", None, "A preset's name (e.g. mnist, ki.models.presets()): "
                    "the nets that have one are built from it, trained to the end, instead "
                    "of trained here.")
flags.DEFINE_string("run_dir", "runs/veit_deletion", "Directory of the runs.")
flags.DEFINE_string("report_dir", None, "Where the report goes (default: docs/results/).")
flags.DEFINE_string("report", "veit_deletion_mnist.md", "Report name.")

# (key, label, keras-identity-train flags); the flags' --model is the net's
# named configuration (its preset's).
NETS = (
    ("residual", "ResNet (identity shortcuts)", ["--model=resnet52_mnist"]),
    ("plain", "plain twin (no shortcuts)", ["--model=resnet52_mnist_plain"]),
)


def preset(key):
    """The preset ``--weights`` of net ``key``, or ``None`` (then it is trained here)."""
    from keras_identity.models import pretrained

    name = dict((k, argv[0].split("=", 1)[1]) for k, _, argv in NETS)[key]
    found = [p for p in pretrained.presets()
             if p.weights == FLAGS.weights and p.configuration == name]
    return found[0] if found else None


def trained_as(key):
    """How net ``key`` was trained, for the report."""
    p = preset(key)
    if p is None:
        return (f"{FLAGS.train_steps} iterations at batch 128 "
                f"({FLAGS.train_steps * 128 / 60000:.2f} epochs of the `highway_mnist` recipe: "
                f"SGD, lr 0.1, momentum 0.9), seed {FLAGS.seed}")
    card = p.card
    return (f"the preset `{p.call}`, trained to the end ({card['recipe']['epochs']} epochs, "
            f"{card['recipe']['steps']:,} iterations of the `{card['recipe']['name']}` recipe; "
            f"its card: keras_identity/models/preset_files/{p.file[:-6]}.md)")


def run_dir(key):
    return os.path.join(FLAGS.run_dir, key)


def train_argv(argv):
    return [*argv, "--dataset=mnist", f"--train_steps={FLAGS.train_steps}",
            *_runs.shared_argv(FLAGS.interval, FLAGS.seed, FLAGS.test_examples, FLAGS.data_dir)]


def study(key, x_test, y_test):
    """The deletion study of one trained net, kept in its run directory
    (``deletions.json``) with what it was measured on: rewriting the report
    with the same model, test images, draws and seed reuses it."""
    import keras_identity as ki

    model_path = os.path.join(run_dir(key), "model.keras")
    p = preset(key)
    measured_on = {"model": p.sha256 if p else os.path.getmtime(model_path),
                   "test_examples": FLAGS.test_examples, "draws": FLAGS.draws,
                   "seed": FLAGS.seed}

    def measure():
        if p is None:
            model = ki.models.load_model(model_path)
            inputs = ki.layers.model_inputs(model, x_test)
        else:  # a preset takes inputs scaled to [0, 1] (its recipe's normalisation)
            model = ki.models.get_model(p.configuration, weights=p.weights)
            inputs = x_test / 255.0
        return ki.analysis.deletion_study(model, inputs, y_test, draws=FLAGS.draws,
                                          seed=FLAGS.seed)

    return _runs.kept_study(os.path.join(run_dir(key), "deletions.json"), measured_on,
                            measure)


def parameters(key):
    p = preset(key)
    return f"{p.card['parameters']:,}" if p else _runs.parameters(run_dir(key))


def halves(study):
    """The mean error with one unit deleted, over the first and the second
    half of the units."""
    errors = study["single"]
    middle = len(errors) // 2
    first = [e for e in errors[:middle] if e is not None]
    second = [e for e in errors[middle:] if e is not None]
    return sum(first) / len(first), sum(second) / len(second), middle


def write_report(results):
    import keras_identity as ki

    stem = os.path.splitext(FLAGS.report)[0]
    directory = FLAGS.report_dir or _report.RESULTS
    verdict_text = deletion_verdict(results)
    res = results["residual"]
    n_units = len(res["units"])
    length = {key: "trained to the end" if preset(key) else f"{FLAGS.train_steps} iterations"
              for key, *_ in NETS}
    scale = (length["residual"] if length["residual"] == length["plain"] else
             f"residual {length['residual']}, plain {length['plain']}")
    summary = (f"{n_units} units, {scale}, {FLAGS.test_examples} test "
               f"images: one unit deleted, test error {100 * res['baseline']:.2f}% -> "
               f"{100 * mean_single_deletion(res):.2f}% (residual) and "
               f"{100 * results['plain']['baseline']:.2f}% -> "
               f"{100 * mean_single_deletion(results['plain']):.2f}% (plain); "
               + verdict_text.split(":")[0])
    text = _report.header("Veit et al. (2016): deleting units of a residual and a plain net "
                          "(MNIST)", summary=summary)
    text += (
        "\n**The claim** (Veit et al. 2016, in the lecture notes): a residual network behaves "
        "like an ensemble of relatively shallow paths. Deleting a single unit of a trained "
        "ResNet barely changes its test error, the error grows smoothly with the number of "
        "units deleted, and deleting a layer of a plain network is fatal.\n\n"
        f"**Ours**: the notes' MNIST ResNet (`resnet52_mnist`: conv0 1x1, {n_units} basic "
        f"units of 16 channels, {parameters('residual')} parameters): "
        f"{trained_as('residual')}; its plain twin ({parameters('plain')} parameters): "
        f"{trained_as('plain')}. Deletions "
        f"on the first {FLAGS.test_examples} test images: a deleted residual unit outputs its "
        f"input (F = 0), a deleted plain unit passes its input on; {FLAGS.draws} random draws "
        f"of k units for every k. Veit et al. trained ResNet-110 and ImageNet ResNets to the "
        f"end; this is MNIST ({scale}).\n\n"
        f"**Verdict**: {verdict_text}. At this scale \"barely\" is at most "
        f"{100 * BARELY:g} points on average and \"fatal\" at least {100 * COLLAPSE:g}.\n\n"
        "| net | test error | one unit deleted: mean | worst | largest rise of the mean "
        "error from k to k+1 | mean error with k units deleted |\n"
        "| --- | --- | --- | --- | --- | --- |\n")
    for key, label, _ in NETS:
        s = results[key]
        rise, marks = smoothness(s)
        text += (f"| {label} | {100 * s['baseline']:.2f}% | "
                 f"{100 * mean_single_deletion(s):.2f}% | "
                 f"{100 * worst_single_deletion(s):.2f}% | {100 * rise:.2f} points | "
                 + ", ".join(f"k={k}: {100 * e:.1f}%" for k, e in marks.items()) + " |\n")
    res_first, res_second, middle = halves(res)
    plain_first, plain_second, _ = halves(results["plain"])
    text += (f"\nBy position: one of the first {middle} units deleted, the residual net's error "
             f"is {100 * res_first:.1f}% on average, one of the last {n_units - middle} "
             f"{100 * res_second:.1f}% (undeleted {100 * res['baseline']:.1f}%); the plain "
             f"net's {100 * plain_first:.1f}% and {100 * plain_second:.1f}% (undeleted "
             f"{100 * results['plain']['baseline']:.1f}%).\n")
    text += ("\n| unit | " + " | ".join(f"{label}: error with it deleted"
                                       for _, label, _ in NETS) + " |\n| --- | --- | --- |\n")
    for i, name in enumerate(res["units"]):
        cells = [f"{100 * results[key]['single'][i]:.2f}%"
                 if results[key]["single"][i] is not None else "kept" for key, *_ in NETS]
        text += f"| {name} | " + " | ".join(cells) + " |\n"
    figure = os.path.join(FLAGS.run_dir, f"{stem}.png")
    ki.analysis.plot_deletions({label: results[key] for key, label, _ in NETS}, figure,
                               title=f"{n_units}-unit nets on MNIST: units deleted")
    text += "\n" + _report.copy_figure(figure, f"{stem}.png", directory) + "\n"
    text += "\n## The runs\n\n| net | iterations | images/s | command |\n| --- | --- | --- | --- |\n"
    for key, label, argv in NETS:
        p = preset(key)
        if p is not None:
            text += (f"| {label} | {p.card['recipe']['steps']} (preset) | "
                     f"{p.card['recipe']['steps'] * p.card['recipe']['global_batch'] / p.card['training_seconds']:.1f} | "
                     f"`{p.card['command']}` |\n")
            continue
        text += (f"| {label} | {_runs.reached(run_dir(key))} | "
                 f"{_runs.median_speed(run_dir(key)):.1f} | "
                 f"`{_runs.shown(run_dir(key), train_argv(argv))}` |\n")
    print(f"wrote {_report.write(FLAGS.report, text, directory)}", flush=True)


def main(argv):
    if len(argv) > 1:
        _cli.fail(f"unexpected arguments {argv[1:]}", 2)
    _cli.require_at_least(FLAGS, ("train_steps", "interval", "test_examples", "draws"), 1)
    if FLAGS.train_steps % FLAGS.interval:
        _cli.fail(f"--train_steps={FLAGS.train_steps} is not valid; expected a multiple of "
                  f"--interval={FLAGS.interval}", 2)
    if FLAGS.weights is not None and not any(preset(key) for key, *_ in NETS):
        _cli.fail(f"--weights={FLAGS.weights} is not valid: neither net has a preset of that "
                  f"name (ki.models.presets())", 2)
    for key, label, net_argv in NETS:
        if preset(key) is None:
            _runs.train(run_dir(key), train_argv(net_argv), label, FLAGS.train_steps)
    import numpy as np

    import keras_identity as ki

    try:
        data = ki.data.load_dataset("mnist", FLAGS.data_dir)
    except ValueError as error:
        _cli.fail(error, 2)
    x_test = data.x_test[:FLAGS.test_examples].astype(np.float32)
    y_test = data.y_test[:FLAGS.test_examples]
    results = {}
    for key, label, _ in NETS:
        print(f"{label}: deleting units", flush=True)
        results[key] = study(key, x_test, y_test)
    write_report(results)


def run():
    app.run(main, flags_parser=_cli.one_line_flags_parser)


if __name__ == "__main__":
    run()

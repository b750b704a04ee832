r"""Veit et al. (2016) in their own setting: deleting units of CIFAR-10 ResNets.

    python -m experiments.veit_deletion_cifar --data_dir=../shared/data

Veit et al. deleted single units of a ResNet-110 trained on CIFAR-10 (their Fig. 3):
the error barely moved for every unit but the few that downsample, and grew smoothly with
the number of units deleted (Fig. 5).  This program runs the same study
(:func:`keras_identity.analysis.deletion_study`) on every CIFAR-10 preset of
``--weights`` (``ki.models.presets()``: the original ResNet-20 of Fig. 4(a) and the
pre-activation ResNet-20 of Fig. 4(e), and a plain twin if one is registered), on the
whole test split, and reports the single deletions with the downsampling units apart,
``k`` units drawn at random for every ``k``, a verdict per net and what the CIFAR nets
add to the MNIST study (``experiments.veit_deletion``).  Nothing is trained here: a
preset is a net trained to the end by ``keras-identity-train`` (its card says how).
"""

import json
import os

from absl import app
from absl import flags

from experiments import _cli
from experiments import _report
from experiments._verdicts import BARELY
from experiments._verdicts import smoothness

FLAGS = flags.FLAGS
flags.DEFINE_string("data_dir", None, "CIFAR-10 (an image folder or .tar.gz, or a folder "
                    "holding one, e.g. ../shared/data; default: tensorflow_datasets).")
flags.DEFINE_string("weights", "cifar10", "The presets' name (ki.models.presets()).")
flags.DEFINE_integer("test_examples", 10_000, "Test images of the study (the first ones).")
flags.DEFINE_integer("draws", 3, "Random draws of k deleted units, for every k.")
flags.DEFINE_integer("seed", 0, "Seed of the draws.")
flags.DEFINE_string("run_dir", "runs/veit_deletion_cifar", "Where each net's study is kept "
                    "(deletions.json) and the figure is drawn.")
flags.DEFINE_string("report_dir", None, "Where the report goes (default: docs/results/).")
flags.DEFINE_string("report", "veit_deletion_cifar10.md", "Report name.")
MNIST_REPORT = "veit_deletion_mnist.md"


def cifar_presets(weights):
    """The presets named ``weights`` of residual nets trained on CIFAR-10."""
    from keras_identity.models import pretrained

    return sorted((p for p in pretrained.presets() if p.weights == weights
                   and p.builder in ("resnet", "preact_resnet")
                   and p.card["data"]["dataset"] == "cifar10"),
                  key=lambda p: (p.builder != "resnet", p.configuration))


def label(preset):
    arguments = preset.arguments
    if arguments.get("shortcut_scale") == 0.0:
        return f"{preset.configuration} (plain twin)"
    unit = "pre-activation, Fig. 4(e)" if preset.builder == "preact_resnet" else (
        "original, Fig. 4(a)")
    return f"{preset.configuration} ({unit})"


def study(preset, x_test, y_test):
    """The deletion study of one preset, kept (``deletions.json``) with what
    it was measured on: the same weights, images, draws and seed reuse it."""
    import keras_identity as ki
    from keras_identity.storage import write_json

    directory = os.path.join(FLAGS.run_dir, preset.configuration)
    cache = os.path.join(directory, "deletions.json")
    measured_on = {"model": preset.sha256, "test_examples": len(y_test),
                   "draws": FLAGS.draws, "seed": FLAGS.seed}
    if os.path.exists(cache):
        with open(cache) as f:
            saved = json.load(f)
        if saved.get("measured_on") == measured_on:
            return saved["study"]
    builder = getattr(ki.models, preset.builder)
    # Its preprocessing in the model: the study feeds the test split's pixels as they are.
    model = builder(**preset.arguments, weights=preset.weights, include_preprocessing=True)
    result = ki.analysis.deletion_study(model, x_test, y_test, draws=FLAGS.draws,
                                        seed=FLAGS.seed, batch_size=500)
    os.makedirs(directory, exist_ok=True)
    write_json(cache, {"measured_on": measured_on, "study": result})
    return result


def split(result):
    """Single-deletion errors of the units that keep the shape and of those
    that downsample (their option-A or projection shortcut stays)."""
    keep = [e for e, s in zip(result["single"], result["changes_shape"])
            if e is not None and not s]
    down = [e for e, s in zip(result["single"], result["changes_shape"])
            if e is not None and s]
    return keep, down


def verdict(result):
    """Veit et al.'s single-deletion claim for one net: the units that keep
    the shape cost at most :data:`BARELY` on average, the downsampling ones more."""
    keep, down = split(result)
    base = result["baseline"]
    cost = sum(keep) / len(keep) - base
    down_cost = sum(down) / len(down) - base if down else None
    text = (f"one unit that keeps the shape deleted costs {100 * cost:+.2f} points on average "
            f"(worst {100 * (max(keep) - base):+.2f})"
            + (f", a downsampling unit {100 * down_cost:+.2f}" if down else ""))
    if cost <= BARELY and (down_cost is None or down_cost > cost):
        return "reproduces: " + text
    if cost <= BARELY:
        return "partly (the downsampling units cost no more): " + text
    return "not at this depth: " + text


def write_report(presets, results, n_images):
    import keras_identity as ki

    stem = os.path.splitext(FLAGS.report)[0]
    directory = FLAGS.report_dir or _report.RESULTS
    verdicts = {p.configuration: verdict(results[p.configuration]) for p in presets}
    summary = "; ".join(
        f"{p.configuration}: {100 * results[p.configuration]['baseline']:.2f}% -> "
        f"{100 * sum(split(results[p.configuration])[0]) / len(split(results[p.configuration])[0]):.2f}% "
        f"with one shape-keeping unit deleted ({verdicts[p.configuration].split(':')[0]})"
        for p in presets) + f"; {n_images:,} test images"
    text = _report.header("Veit et al. (2016) on CIFAR-10: deleting units of trained ResNets",
                          summary=summary)
    text += (
        "\n**The claim** (Veit et al. 2016, Figs. 3 and 5, in the lecture notes): deleting "
        "a single unit of a ResNet-110 trained on CIFAR-10 barely changes its test error, "
        "except for the few units that downsample; the error grows smoothly with the number "
        "of units deleted (a VGG net falls to chance when one layer goes).\n\n"
        f"**Ours**: the CIFAR-10 presets (`weights={FLAGS.weights!r}`), each trained to the "
        f"end by `keras-identity-train` (their cards: keras_identity/models/preset_files/), "
        f"on the first {n_images:,} images of the test split; a deleted unit outputs its "
        f"shortcut (F = 0: its input, or the option-A / projection shortcut of a "
        f"downsampling unit); {FLAGS.draws} random draws of k units for every k, seed "
        f"{FLAGS.seed}. ResNet-20 has 9 units (2 of them downsample) against ResNet-110's 54: "
        f"each unit is a larger share of the net. At this scale \"barely\" is at most "
        f"{100 * BARELY:g} points on average, as in the MNIST study.\n\n")
    text += "**Verdicts**:\n\n" + "".join(
        f"- {label(p)}: {verdicts[p.configuration]}.\n" for p in presets)
    text += ("\n| net | test error | one shape-keeping unit deleted: mean | worst | "
             "a downsampling unit deleted | largest rise of the mean error from k to k+1 | "
             "mean error with k units deleted |\n| --- | --- | --- | --- | --- | --- | --- |\n")
    for p in presets:
        s = results[p.configuration]
        keep, down = split(s)
        rise, marks = smoothness(s)
        text += (f"| {label(p)} | {100 * s['baseline']:.2f}% | "
                 f"{100 * sum(keep) / len(keep):.2f}% | {100 * max(keep):.2f}% | "
                 + (", ".join(f"{100 * e:.2f}%" for e in down) or "none") + " | "
                 f"{100 * rise:.2f} points | "
                 + ", ".join(f"k={k}: {100 * e:.1f}%" for k, e in marks.items()) + " |\n")
    first = results[presets[0].configuration]
    text += ("\n| unit | downsamples | " + " | ".join(f"{p.configuration}: error with it "
                                                     f"deleted" for p in presets)
             + " |\n| --- | --- |" + " --- |" * len(presets) + "\n")
    for i, name in enumerate(first["units"]):
        cells = [f"{100 * results[p.configuration]['single'][i]:.2f}%"
                 if results[p.configuration]["single"][i] is not None else "kept"
                 for p in presets]
        text += (f"| {name} | {'yes' if first['changes_shape'][i] else ''} | "
                 + " | ".join(cells) + " |\n")
    mnist = os.path.join(directory, MNIST_REPORT)
    mnist_summary = _report.read_header(mnist).get("summary") if os.path.exists(mnist) else None
    if mnist_summary:
        text += (f"\n**Against the MNIST study** ([{MNIST_REPORT}]({MNIST_REPORT}): the notes' "
                 f"25-unit MNIST ResNet and its plain twin): {mnist_summary}. The MNIST net "
                 f"has no downsampling unit and a 1x1 `conv0` of 16 channels; the CIFAR nets "
                 f"add Veit et al.'s own data, their downsampling units apart, and the "
                 f"original against the pre-activation unit.\n")
    figure = os.path.join(FLAGS.run_dir, f"{stem}.png")
    ki.analysis.plot_deletions({label(p): results[p.configuration] for p in presets}, figure,
                               title="CIFAR-10 ResNet-20s: units deleted")
    text += "\n" + _report.copy_figure(figure, f"{stem}.png", directory) + "\n"
    text += ("\n## The presets\n\n| net | recipe | epochs | precision | test error (card) | "
             "command |\n| --- | --- | --- | --- | --- | --- |\n")
    for p in presets:
        card = p.card
        text += (f"| `{p.call}` | {card['recipe']['name']} | {card['recipe']['epochs']} | "
                 f"{card.get('precision')} | {100 * card['test_error']:.2f}% | "
                 f"`{card['command']}` |\n")
    print(f"wrote {_report.write(FLAGS.report, text, directory)}", flush=True)


def main(argv):
    if len(argv) > 1:
        _cli.fail(f"unexpected arguments {argv[1:]}", 2)
    for name in ("test_examples", "draws"):
        if FLAGS[name].value < 1:
            _cli.fail(f"--{name}={FLAGS[name].value} is not valid; expected >= 1", 2)
    presets = cifar_presets(FLAGS.weights)
    if not presets:
        _cli.fail(f"--weights={FLAGS.weights} is not valid: no residual net trained on "
                  f"CIFAR-10 has a preset of that name (ki.models.presets())", 2)
    import numpy as np

    import keras_identity as ki

    try:
        data = ki.data.load_dataset("cifar10", FLAGS.data_dir)
    except ValueError as error:
        _cli.fail(error, 2)
    x_test = np.asarray(data.x_test[:FLAGS.test_examples], dtype=np.float32)
    y_test = np.asarray(data.y_test[:FLAGS.test_examples])
    results = {}
    for p in presets:
        print(f"{label(p)}: deleting units", flush=True)
        results[p.configuration] = study(p, x_test, y_test)
    write_report(presets, results, len(y_test))


if __name__ == "__main__":
    app.run(main, flags_parser=_cli.one_line_flags_parser)

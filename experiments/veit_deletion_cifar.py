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

import os

from absl import app
from absl import flags

from experiments import _cli
from experiments import _report
from experiments import _runs
from experiments._verdicts import BARELY
from experiments._verdicts import cifar_deletion_verdict
from experiments._verdicts import downsampling_split
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


def key(preset):
    """The preset's name in the report and the run directory."""
    return preset.configuration or preset.card["model"]


def label(preset):
    """The preset's row label: its name and its unit (or plain twin)."""
    arguments = preset.arguments
    if arguments.get("shortcut_scale") == 0.0:
        return f"{key(preset)} (plain twin)"
    unit = "pre-activation, Fig. 4(e)" if preset.builder == "preact_resnet" else (
        "original, Fig. 4(a)")
    return f"{key(preset)} ({unit})"


def study(preset, x_test, y_test, data):
    """The deletion study of one preset, kept (``deletions.json``) with what
    it was measured on: the same weights, data, images, draws and seed reuse it."""
    import keras_identity as ki

    measured_on = {"model": preset.sha256, "data": data, "test_examples": len(y_test),
                   "draws": FLAGS.draws, "seed": FLAGS.seed}

    def measure():
        builder = getattr(ki.models, preset.builder)
        # Its preprocessing in the model: the study feeds the test split's pixels as they are.
        model = builder(**preset.arguments, weights=preset.weights, include_preprocessing=True)
        return ki.analysis.deletion_study(model, x_test, y_test, draws=FLAGS.draws,
                                          seed=FLAGS.seed, batch_size=500)

    return _runs.kept_study(os.path.join(FLAGS.run_dir, key(preset), "deletions.json"),
                            measured_on, measure)


def mean(values):
    return sum(values) / len(values) if values else float("nan")


def write_report(presets, results, n_images):
    """The report: the claim, the verdict per net, the deletions, the figure."""
    import keras_identity as ki

    stem = os.path.splitext(FLAGS.report)[0]
    directory = FLAGS.report_dir or _report.RESULTS
    names = [key(p) for p in presets]
    verdicts = {n: cifar_deletion_verdict(results[n]) for n in names}
    summary = "; ".join(
        f"{n}: {100 * results[n]['baseline']:.2f}% -> "
        f"{100 * mean(downsampling_split(results[n])[0]):.2f}% with one shape-keeping unit "
        f"deleted ({verdicts[n].split(':')[0]})" for n in names) + (
        f"; {n_images:,} test images")
    sizes = ", ".join(f"{n}: {len(results[n]['units'])} units, "
                      f"{sum(results[n]['changes_shape'])} of them downsample" for n in names)
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
        f"{FLAGS.seed}. {sizes}, against ResNet-110's 54 units (2 downsample): each unit is "
        f"a larger share of the net. At this scale \"barely\" is at most {100 * BARELY:g} "
        f"points on average, as in the MNIST study, and a downsampling unit costs more when "
        f"it costs {100 * BARELY:g} points more than that.\n\n")
    text += "**Verdicts**:\n\n" + "".join(
        f"- {label(p)}: {verdicts[key(p)]}.\n" for p in presets)
    text += ("\n| net | test error | one shape-keeping unit deleted: mean | worst | "
             "a downsampling unit deleted | largest rise of the mean error from k to k+1 | "
             "mean error with k units deleted |\n| --- | --- | --- | --- | --- | --- | --- |\n")
    for p in presets:
        s = results[key(p)]
        keep, down = downsampling_split(s)
        rise, marks = smoothness(s)
        text += (f"| {label(p)} | {100 * s['baseline']:.2f}% | {100 * mean(keep):.2f}% | "
                 f"{100 * max(keep, default=float('nan')):.2f}% | "
                 + (", ".join(f"{100 * e:.2f}%" for e in down) or "none") + " | "
                 f"{100 * rise:.2f} points | "
                 + ", ".join(f"k={k}: {100 * e:.1f}%" for k, e in marks.items()) + " |\n")
    # One row per unit name, in the order the nets have them.
    units = []
    for n in names:
        units += [u for u in results[n]["units"] if u not in units]
    text += ("\n| unit | " + " | ".join(f"{n}: error with it deleted" for n in names)
             + " |\n| --- |" + " --- |" * len(names) + "\n")
    for unit in units:
        cells = []
        for n in names:
            s = results[n]
            if unit not in s["units"]:
                cells.append("-")
                continue
            i = s["units"].index(unit)
            error = s["single"][i]
            cells.append(("kept" if error is None else f"{100 * error:.2f}%")
                         + (" (downsamples)" if s["changes_shape"][i] else ""))
        text += f"| {unit} | " + " | ".join(cells) + " |\n"
    mnist = os.path.join(directory, MNIST_REPORT)
    mnist_summary = _report.read_header(mnist).get("summary") if os.path.exists(mnist) else None
    if mnist_summary:
        text += (f"\n**Against the MNIST study** ([{MNIST_REPORT}]({MNIST_REPORT}): the notes' "
                 f"25-unit MNIST ResNet and its plain twin): {mnist_summary}. The MNIST net "
                 f"has no downsampling unit and a 1x1 `conv0` of 16 channels; the CIFAR nets "
                 f"add Veit et al.'s own data, their downsampling units apart, and the "
                 f"original against the pre-activation unit.\n")
    figure = os.path.join(FLAGS.run_dir, f"{stem}.png")
    os.makedirs(FLAGS.run_dir, exist_ok=True)
    ki.analysis.plot_deletions({label(p): results[key(p)] for p in presets}, figure,
                               title="CIFAR-10 ResNets: units deleted")
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
    _cli.require_at_least(FLAGS, ("test_examples", "draws"), 1)
    presets = cifar_presets(FLAGS.weights)
    if not presets:
        _cli.fail(f"--weights={FLAGS.weights} is not valid: no residual net trained on "
                  f"CIFAR-10 has a preset of that name (ki.models.presets(); making one: "
                  f"docs/presets.md)", 2)
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
        results[key(p)] = study(p, x_test, y_test, data.fingerprint)
    write_report(presets, results, len(y_test))


def run():
    app.run(main, flags_parser=_cli.one_line_flags_parser)


if __name__ == "__main__":
    run()

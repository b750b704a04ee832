r"""Gate routing and lesions of a trained highway network (Srivastava et al. 2015, Figs. 2-4).

    python -m experiments.highway_gates                 # the highway-50 preset
    python -m experiments.highway_gates --model_path=runs/highway_net50_mnist/model.keras

Studies the highway-50 trained to the end on MNIST: the preset ``--weights`` (made by
``keras-identity-train`` on its defaults; ``ki.models.presets()``), or the ``.keras`` file
of a run of yours (``--model_path``).  Writes docs/results/highway_gates_mnist.md:
the transform-gate biases, the mean gate activity, one example's gates and
block outputs (Fig. 2), the class-specific deviations for digits 0 and 7
(Fig. 3), and the training-set error with each layer lesioned (Fig. 4).
"""

import os

from absl import app
from absl import flags

from experiments import _cli
from experiments import _report

FLAGS = flags.FLAGS
flags.DEFINE_string("weights", "mnist", "The preset of highway_net(depth=50) studied when "
                    "no --model_path is given.")
flags.DEFINE_string("model_path", None, "A trained highway net's .keras file (its run's "
                    "preprocessing.json beside it) instead of the preset.")
flags.DEFINE_integer("examples", 10_000, "Training images for the gate statistics.")
flags.DEFINE_string("run_dir", "runs/highway_gates", "Directory for the figures.")


def main(argv):
    if len(argv) > 1:
        _cli.fail(f"unexpected arguments {argv[1:]}", 2)
    import numpy as np

    import keras_identity as ki

    if FLAGS.model_path is not None and FLAGS["weights"].present:
        _cli.fail("--weights applies without --model_path (the preset is studied when no "
                  "model file is given)", 2)
    data = ki.data.load_dataset("mnist")
    try:
        if FLAGS.model_path is None:
            found = [p for p in ki.models.presets() if p.weights == FLAGS.weights
                     and p.configuration == "highway50_mnist"]
            if not found:
                raise ValueError(f"--weights={FLAGS.weights} is not valid; expected a preset "
                                 f"of highway50_mnist (ki.models.presets())")
            model = ki.models.highway_net(50, weights=FLAGS.weights)
            card = found[0].card
            studied = (f"the preset `highway_net(depth=50, weights={FLAGS.weights!r})`, "
                       f"trained to the end ({card['recipe']['epochs']} epochs of the "
                       f"`{card['recipe']['name']}` recipe, test error "
                       f"{100 * card['test_error']:.2f}%; its card: "
                       f"keras_identity/models/preset_files/{found[0].file[:-6]}.md)")
            x = data.x_train.astype(np.float32) / 255.0  # its recipe's normalisation
        else:
            model = ki.models.load_model(FLAGS.model_path)
            studied = f"`{FLAGS.model_path}`"
            prep = ki.data.load_preprocessing(os.path.join(os.path.dirname(FLAGS.model_path),
                                                           "preprocessing.json"))
            x = np.asarray(ki.layers.model_inputs(model, data.x_train.astype(np.float32),
                                                  prep["normalization"]))
    except (ValueError, OSError) as error:
        _cli.fail(error, 2)
    y = data.y_train
    stats = ki.analysis.gate_statistics(model, x[:FLAGS.examples], y[:FLAGS.examples])
    lesions = ki.analysis.lesion_study(model, x, y)
    os.makedirs(FLAGS.run_dir, exist_ok=True)
    gates_png = os.path.join(FLAGS.run_dir, "gates.png")
    lesions_png = os.path.join(FLAGS.run_dir, "lesions.png")
    ki.analysis.plot_gate_statistics(stats, gates_png, title=f"{model.name}: transform gates")
    ki.analysis.plot_lesions(lesions, lesions_png, title=f"{model.name}: lesioned training error")

    layers = len(stats.layers)
    mean_by_layer = stats.mean.mean(axis=1)
    errors = np.array(lesions["errors"])
    harmful = [name for name, e in zip(lesions["layers"], errors)
               if e > 2 * lesions["baseline"] + 0.005]
    class_spread = {c: float(np.abs(stats.class_mean[c] - stats.mean).mean())
                    for c in sorted(stats.class_mean)}
    table = ("| highway layers | mean transform-gate bias | mean gate activity T(x) | mean "
             "lesioned training error (%) | worst lesion (%) |\n| --- | --- | --- | --- | --- |\n")
    for part in np.array_split(np.arange(layers), 4):
        table += (f"| {stats.layers[part[0]]} to {stats.layers[part[-1]]} | "
                  f"{stats.biases[part].mean():.2f} | {mean_by_layer[part].mean():.3f} | "
                  f"{100 * errors[part].mean():.2f} | {100 * errors[part].max():.2f} |\n")
    initial = float(model.get_layer(stats.layers[0]).get_config()["transform_bias_init"])
    change = np.abs(np.diff(stats.outputs, axis=0)).mean(axis=1)  # per consecutive layer pair
    parts = np.array_split(change, 4)
    open_share = float((stats.example > 0.5).mean())
    first_q = [e for e in np.array_split(errors, 4)]
    most = max(class_spread, key=class_spread.get)
    trend = ("falls" if parts[-1].mean() < 0.8 * parts[0].mean() else
             "rises" if parts[-1].mean() > 1.25 * parts[0].mean() else "stays about the same")
    findings = f"""
Findings:

- The transform-gate biases moved little from their initial {initial:g} (mean now
  {stats.biases.mean():.2f}, range {stats.biases.min():.2f} to {stats.biases.max():.2f}); the
  paper saw its biases decrease further during training.
- The gates are mostly closed on average (mean T(x) = {stats.mean.mean():.3f}, against
  sigmoid({initial:g}) = {1 / (1 + np.exp(-initial)):.3f} at initialisation) and sparse for one
  example: {100 * open_share:.1f}% of its gates exceed 0.5 (Fig. 2, third column).
- Block outputs: the mean absolute change between consecutive layers {trend} from the first
  quarter of the layers ({parts[0].mean():.3f}) to the last ({parts[-1].mean():.3f}).
- Lesions (Fig. 4): the mean training error with one layer lesioned is
  {100 * first_q[0].mean():.2f}% for the first quarter of the layers and
  {100 * first_q[-1].mean():.2f}% for the last (unlesioned: {100 * lesions['baseline']:.2f}%).
  The paper found the same on MNIST: early layers matter, many later ones do not.
- Every digit class shifts the mean gate activity (Fig. 3); digit {most} the most.
"""
    summary = (f"b_T {initial:g} -> mean {stats.biases.mean():.2f} after training; mean T(x) "
               f"{stats.mean.mean():.3f}; {100 * open_share:.1f}% of one example's gates "
               f"open; one-layer lesions: {100 * first_q[0].mean():.2f}% (first quarter) vs "
               f"{100 * first_q[-1].mean():.2f}% (last) training error, "
               f"{100 * lesions['baseline']:.2f}% unlesioned")
    text = _report.header(f"Highway gates and lesions: {model.name} on MNIST", summary=summary)
    text += f"""
The model: {studied} ({layers} highway layers of {stats.mean.shape[1]} blocks after a
plain first layer). Gate statistics on {FLAGS.examples:,} training images; lesions on all
{len(y):,} (`keras_identity.analysis.gate_statistics`, `lesion_study`: a lesioned layer's
transform gates are forced to 0, so it copies its input).

Training error without lesion: {100 * lesions['baseline']:.2f}%. Layers whose lesion more than
doubles it (and adds at least 0.5 points): {', '.join(harmful) if harmful else 'none'}
(the highway layers are highway2 to highway{layers + 1}, after the plain layer). Mean absolute class-specific deviation of the gate activity from the overall
mean (Fig. 3), per digit: {', '.join(f'{c}: {v:.4f}' for c, v in class_spread.items())}.

{table}{findings}
{_report.copy_figure(gates_png, "highway_gates_mnist.png")}
{_report.copy_figure(lesions_png, "highway_lesions_mnist.png")}
"""
    print(f"wrote {_report.write('highway_gates_mnist.md', text)}")
    print(table)


def run():
    app.run(main, flags_parser=_cli.one_line_flags_parser)


if __name__ == "__main__":
    run()

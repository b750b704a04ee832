r"""Gradient propagation through ResNet-110 at initialisation (He et al. 2016, Eqns. 5 and 8),
and shattered gradients of plain and residual nets (Balduzzi et al. 2017).

    python -m experiments.signal_propagation --data_dir=../shared/data

For every shortcut of Table 1, ``||dE/dx_l|| / ||dE/dx_L||`` per unit on a
batch of CIFAR-10 test images, two ways: through the whole network, and
through the shortcut path alone (residual branches zeroed: the first term of
Eqn. 5 or Eqn. 8).  Writes docs/results/gradient_propagation.md and
docs/results/shattered_gradients.md.
"""

import math
import os

from absl import app
from absl import flags

from experiments import _cli
from experiments import _report

FLAGS = flags.FLAGS
flags.DEFINE_string("data_dir", None, "CIFAR-10 data (default: random normal images).")
flags.DEFINE_integer("depth", 110, "ResNet depth.")
flags.DEFINE_integer("batch", 64, "Images in the probe batch.")
flags.DEFINE_integer("seed", 0, "Seed of the weights.")
flags.DEFINE_string("run_dir", "runs/propagation", "Directory for the figures.")


def sigmoid(x):
    return 1.0 / (1.0 + math.exp(-x))


# (label, resnet arguments, expected per-unit factor of the shortcut path)
CONFIGS = [
    ("original (identity)", {}, "1"),
    ("full pre-activation (identity)", dict(unit="full_preactivation"), "1"),
    ("constant scaling 0.5", dict(shortcut="constant_scaling", shortcut_scale=0.5), "0.5"),
    ("constant scaling 0.5, pre-act.", dict(unit="full_preactivation",
                                            shortcut="constant_scaling", shortcut_scale=0.5),
     "0.5"),
    ("exclusive gating b_g=0", dict(shortcut="exclusive_gating", gate_bias_init=0.0),
     "~0.5"),
    ("exclusive gating b_g=-6", dict(shortcut="exclusive_gating", gate_bias_init=-6.0),
     f"~{1 - sigmoid(-6):.4f}"),
    ("shortcut-only gating b_g=0", dict(shortcut="shortcut_only_gating", gate_bias_init=0.0),
     "~0.5"),
    ("shortcut-only gating b_g=-6", dict(shortcut="shortcut_only_gating",
                                         gate_bias_init=-6.0), f"~{1 - sigmoid(-6):.4f}"),
    ("1x1 conv shortcut", dict(shortcut="conv1x1"), "random matrix"),
    ("dropout shortcut 0.5", dict(shortcut="dropout"), "0.5 in expectation, 1 in norm"),
]


def _inputs():
    import numpy as np

    if FLAGS.data_dir:
        import keras_identity as ki

        data = ki.data.load_dataset("cifar10", FLAGS.data_dir)
        norm = ki.data.Normalization.from_images("per_pixel_mean", data.x_train)
        return np.asarray(norm(data.x_test[:FLAGS.batch])), "CIFAR-10 test images"
    rng = np.random.default_rng(FLAGS.seed)
    return rng.normal(size=(FLAGS.batch, 32, 32, 3)).astype("float32"), "random images"


def _stage_factor(result):
    """Geometric mean per-unit factor of the gradient ratio inside the last stage:
    from the input of its second unit (the first one changes shape) to the input
    of its last unit (after it come the final activation and the classifier)."""
    stage = [i for i, n in enumerate(result.names[:-1]) if n.startswith("stage3_")]
    first, end = stage[1], stage[-1]
    ratio = result.relative_gradient[first] / result.relative_gradient[end]
    return ratio ** (1.0 / (end - first)) if ratio > 0 else 0.0, end - first


def propagation_report():
    import keras
    import numpy as np

    import keras_identity as ki

    x, source = _inputs()
    labels = np.random.default_rng(FLAGS.seed).integers(0, 10, len(x))
    full, path = {}, {}
    rows = []
    for label, kwargs, expected in CONFIGS:
        model = ki.models.resnet(FLAGS.depth, seed=FLAGS.seed, stage_mode="unrolled",
                                 **kwargs)
        full[label] = ki.analysis.signal_propagation(model, x, labels)
        path[label] = ki.analysis.signal_propagation(model, x, labels, residual_branches=False)
        factor, units = _stage_factor(path[label])
        rows.append((label, expected, factor, factor ** units, units,
                     path[label].relative_gradient[0], full[label].relative_gradient[0]))
        keras.backend.clear_session()
        print(f"  {label}: shortcut-path factor per unit {factor:.4g}", flush=True)
    os.makedirs(FLAGS.run_dir, exist_ok=True)
    fig_path = os.path.join(FLAGS.run_dir, "shortcut_path.png")
    fig_full = os.path.join(FLAGS.run_dir, "full_network.png")
    ki.analysis.plot_propagation(path, fig_path, f"ResNet-{FLAGS.depth} at initialisation: "
                                 "shortcut path only (F = 0)")
    ki.analysis.plot_propagation(full, fig_full, f"ResNet-{FLAGS.depth} at initialisation: "
                                 "whole network")
    units = rows[0][4]
    table = (f"| shortcut | expected factor per unit | measured factor per unit | product over "
             f"{units} units of stage 3 | shortcut path: unit 1 | whole network: unit 1 "
             f"|\n| --- | --- | --- | --- | --- | --- |\n")
    for label, expected, factor, product, _, path1, full1 in rows:
        table += (f"| {label} | {expected} | {factor:.4f} | {product:.3g} | {path1:.3g} | "
                  f"{full1:.3g} |\n")
    dropout = next((r for r in rows if r[0].startswith("dropout")), None)
    dropout_text = "" if dropout is None else (
        f"Here {dropout[5]:.3g} of the output's gradient norm reaches unit 1 on that path."
        if dropout[5] > 0 else f"Here no position of this batch survives all "
        f"{len(path[dropout[0]].names) - 1} masks: the path carries no gradient to unit 1.")
    shown = [r for r in rows if r[0] in ("original (identity)", "constant scaling 0.5",
                                         "exclusive gating b_g=0", "dropout shortcut 0.5")]
    summary = ("shortcut path, factor per unit / share of the output's gradient at unit 1: "
               + ", ".join(f"{r[0]} {r[2]:.3g} / {r[5]:.3g}" for r in shown))
    text = _report.header(f"Gradient propagation through ResNet-{FLAGS.depth} at "
                          "initialisation (Eqns. 5 and 8)", summary=summary)
    text += f"""
`keras_identity.analysis.signal_propagation` on a batch of {len(x)} {source} (BN with
batch statistics, cross-entropy against random labels), for each shortcut of Table 1
(original units unless marked pre-activation). Values are `||dE/dx_l|| / ||dE/dx_L||`,
the gradient at the input of unit l relative to the output of the last unit.

**Shortcut path only.** With every residual branch's last weight layer zeroed (F = 0),
what remains is the first term of Eqn. (5), `dE/dx_L · 1`, or of Eqn. (8),
`dE/dx_L · prod(h')`. Inside a stage the measured factor per unit is exactly the
shortcut's derivative: 1 for identity shortcuts, λ = 0.5 for constant scaling (so 0.5^k
after k units), about 1 - σ(b_g) for gates; a 1x1 convolution multiplies by a random
matrix whose gain compounds. The factor is measured inside stage 3, from the input of
its second unit to the input of its last; across the first unit of a stage, where
option A subsamples and pads or a shared BN-ReLU acts, h is not an identity, as the
paper notes. A dropout shortcut multiplies by a 0/1 mask per unit (expectation 0.5):
the signal survives only at the positions every mask kept, and the loss's gradient
flows back along exactly those positions, so between units its norm either stays the
same or, once no position survives, is 0. {dropout_text}

**Whole network.** At initialisation the residual branches add their own terms to the
gradient; with BN they grow towards the input, since a unit's branch gradient scales
with 1 / ||x_l|| and the signal grows with depth. The shortcut factors still decide
how much of the gradient reaches the first units unchanged.

{table}
{_report.copy_figure(fig_path, "gradient_propagation_shortcut_path.png")}
{_report.copy_figure(fig_full, "gradient_propagation_whole_network.png")}
"""
    print(f"wrote {_report.write('gradient_propagation.md', text)}")
    print(table)


def shattered_report():
    import keras_identity as ki

    from keras_identity.training.plots import pyplot

    depths = (1, 2, 4, 8, 16, 32, 50)
    rows, curves = ki.analysis.shattering_study(depths=depths)
    plt = pyplot()
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(10, 3.6))
    ax1.plot(depths, [r["plain"] for r in rows], "o-", label="plain (Dense-BN-ReLU)")
    ax1.plot(depths, [r["residual"] for r in rows], "o-", label="residual (pre-activation)")
    ax1.plot(depths, [r["looks_linear"] for r in rows], "o-",
             label="CReLU, looks-linear init (no skips)")
    ax1.set_xscale("log", base=2)
    ax1.set_xlabel("depth (blocks)")
    ax1.set_ylabel("lag-1 autocorrelation of df/dx")
    ax1.legend()
    ax1.grid(alpha=0.3)
    for label, acf in curves.items():
        ax2.plot(acf, label=label)
    ax2.set_xlabel("lag")
    ax2.set_ylabel("autocorrelation")
    ax2.legend()
    ax2.grid(alpha=0.3)
    fig.tight_layout()
    os.makedirs(FLAGS.run_dir, exist_ok=True)
    path = os.path.join(FLAGS.run_dir, "shattered.png")
    fig.savefig(path, dpi=110)
    plt.close(fig)
    table = ("| depth | plain | residual | CReLU, looks-linear |\n| --- | --- | --- | --- |\n"
             + "".join(f"| {r['depth']} | {r['plain']:.3f} | {r['residual']:.3f} | "
                       f"{r['looks_linear']:.3f} |\n" for r in rows))
    deepest = rows[-1]
    text = _report.header(
        "Shattered gradients: plain, residual and looks-linear CReLU nets",
        summary=f"lag-1 autocorrelation of df/dx at depth {deepest['depth']}: plain "
                f"{deepest['plain']:.3f}, residual {deepest['residual']:.3f}, looks-linear "
                f"CReLU {deepest['looks_linear']:.3f} (depth 1: {rows[0]['plain']:.3f} / "
                f"{rows[0]['residual']:.3f} / {rows[0]['looks_linear']:.3f})")
    text += f"""
Balduzzi et al. (2017), in the lecture notes: the gradient `df/dx` of a rectifier net from
R to R (200 units per layer, He initialisation, BN with batch statistics) over 256 inputs
in [-2, 2]. Its autocorrelation at lag 1 (mean of 3 seeds;
`keras_identity.analysis.shattering_study`) falls towards 0 (white noise) as plain nets
deepen and stays high for residual nets. Balduzzi et al.'s cure without skip connections,
CReLU with the looks-linear initialisation (`feedforward_1d(..., looks_linear=True)`: each
block CReLU-Dense, no BN), is linear at initialisation: its gradient is the same at every
input.

{table}
{_report.copy_figure(path, "shattered_gradients.png")}
"""
    print(f"wrote {_report.write('shattered_gradients.md', text)}")
    print(table)


def main(argv):
    if len(argv) > 1:
        _cli.fail(f"unexpected arguments {argv[1:]}", 2)
    propagation_report()
    shattered_report()


def run():
    app.run(main, flags_parser=_cli.one_line_flags_parser)


if __name__ == "__main__":
    run()

"""Signal propagation through the units of a network (He et al. 2016, Sec. 2-3).

For each unit l, the forward activation norm ``||x_l||`` and the backward
gradient norm ``||dE/dx_l||`` of its input, the latter relative to the
gradient at the network's last unit output ``x_L``.  With identity shortcuts
and identity after-addition activations, Eqn. (5) keeps a "1" in
``dx_L/dx_l``, so the relative gradient stays near 1 at any depth; scaling
the shortcuts by lambda multiplies that term by lambda per unit (Eqn. 8);
gates, 1x1 convolutions and dropout multiply it by their derivatives.
"""

import dataclasses

import keras
import numpy as np
from keras import ops

from keras_identity.analysis import _autodiff

from keras_identity.layers.highway import _HighwayBase
from keras_identity.models.stage import unroll
from keras_identity.layers.residual import ResidualUnit


def unit_layers(model):
    """The model's residual units and highway layers, in order.

    A model with looped stages (``ResidualStack``) has no layer per unit:
    pass ``keras_identity.models.unroll(model)``, as :func:`signal_propagation`
    does itself.
    """
    return [l for l in model.layers if isinstance(l, (ResidualUnit, _HighwayBase))]


@dataclasses.dataclass
class Propagation:
    """Per-unit norms; index ``-1`` is the last unit's output ``x_L``."""

    names: list
    forward_norm: np.ndarray
    gradient_norm: np.ndarray

    @property
    def relative_gradient(self):
        """``||dE/dx_l|| / ||dE/dx_L||``."""
        return self.gradient_norm / self.gradient_norm[-1]

    @property
    def relative_forward(self):
        return self.forward_norm / self.forward_norm[0]


def _per_example_norm(tensor):
    flat = np.asarray(tensor, np.float32).reshape(len(tensor), -1)
    return float(np.mean(np.linalg.norm(flat, axis=1)))


def signal_propagation(model, inputs, labels=None, layers=None, training=True, seed=0,
                       residual_branches=True):
    """Measures forward and backward signal norms at every unit's input.

    Args:
        model: a functional model (ResNet, highway net, ...); looped stages are measured on
            :func:`keras_identity.models.unroll`'s copy.
        inputs: a batch of model inputs.
        labels: integer labels for the cross-entropy loss E (default: random labels, a model
            at initialisation has no preference).
        layers: the layers whose inputs are probed (default: every ResidualUnit / highway
            layer); the last one's output is ``x_L``.
        training: run BN with batch statistics (as during training; at initialisation the
            moving statistics make BN an identity and the signal grows without bound).  The
            model's moving averages and other non-trainable state are restored afterwards.
        residual_branches: with False, every residual unit's last weight layer is zeroed
            while measuring (and restored), so F = 0 and only the shortcut path remains: the
            gradient ratio is then the first term of Eqn. (5) (1 for identity shortcuts) or
            of Eqn. (8) (the product of lambda, or of the gates' and convolutions'
            derivatives).

    Returns:
        A :class:`Propagation`.
    """
    if layers is None:
        # Looped stages run as their unrolled twin (same weights and function).
        model = unroll(model)
    layers = layers or unit_layers(model)
    if not layers:
        raise ValueError(f"model {model.name!r} has no residual units or highway layers; "
                         f"pass layers=[...].")
    inputs = ops.convert_to_tensor(inputs)
    if labels is None:
        classes = model.output_shape[-1]
        labels = np.random.default_rng(seed).integers(0, classes, int(inputs.shape[0]))
    probe = keras.Model(model.input, [l.input for l in layers] + [layers[-1].output])
    probabilities = model.layers[-1].get_config().get("activation") == "softmax"
    loss = keras.losses.SparseCategoricalCrossentropy(from_logits=not probabilities)
    state = [v.numpy() for v in model.non_trainable_variables]
    zeroed = [] if residual_branches else [
        l.convs[-1].kernel for l in layers if isinstance(l, ResidualUnit)]
    kernels = [k.numpy() for k in zeroed]
    try:
        for kernel in zeroed:
            kernel.assign(np.zeros(kernel.shape, kernel.dtype))
        activations = [np.asarray(a) for a in probe(inputs, training=training)]
        for variable, value in zip(model.non_trainable_variables, state):
            variable.assign(value)  # the gradients' pass sees the same statistics
        gradients = _autodiff.activation_gradients(
            model, layers, inputs, lambda prediction: loss(labels, prediction), training)
    finally:
        for variable, value in zip(model.non_trainable_variables, state):
            variable.assign(value)
        for kernel, value in zip(zeroed, kernels):
            kernel.assign(value)
    names = [l.name for l in layers] + [f"{layers[-1].name} (output)"]
    return Propagation(
        names=names,
        forward_norm=np.array([_per_example_norm(a) for a in activations]),
        gradient_norm=np.array([_per_example_norm(g) for g in gradients]))


def plot_propagation(results, path, title="", what="gradient"):
    """Relative gradient (or forward) norm against the unit index, one curve
    per entry of ``results`` ({label: Propagation}), log scale."""
    from keras_identity.training.plots import pyplot

    plt = pyplot()
    fig, ax = plt.subplots(figsize=(7, 4.2))
    for label, result in results.items():
        values = result.relative_gradient if what == "gradient" else result.relative_forward
        ax.semilogy(np.arange(1, len(values) + 1), values, label=label)
    ax.set_xlabel("unit l (the last point is the output x_L)")
    ax.set_ylabel("||dE/dx_l|| / ||dE/dx_L||" if what == "gradient"
                  else "||x_l|| / ||x_1||")
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=7)
    if title:
        ax.set_title(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)

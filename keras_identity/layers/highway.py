"""Highway layers of Srivastava, Greff & Schmidhuber, *Training Very Deep Networks*."""

import keras
from keras import ops

from keras_identity import _checks
from keras_identity import initializers

CARRY_GATES = ("coupled", "separate")


class _HighwayBase(keras.layers.Layer):
    """Shared machinery of the dense and convolutional highway layers.

    ``y = H(x) * T(x) + x * C(x)`` (Eqn. 2), with ``C = 1 - T`` (Eqn. 3) by
    default.  Subclasses say how the block state H and the gates read x.
    """

    _layout = ""
    _ranks = ()

    def __init__(self, activation="relu", transform_bias_init=-1.0, carry_gate="coupled",
                 carry_bias_init=None, use_bias=True, kernel_initializer="glorot_uniform",
                 kernel_regularizer=None, transform_gate_override=None, **kwargs):
        super().__init__(**kwargs)
        self.activation = keras.activations.get(activation)
        self.transform_bias_init = _checks.check_range("transform_bias_init",
                                                       transform_bias_init)
        self.carry_gate = _checks.check_choice("carry_gate", carry_gate, CARRY_GATES)
        if carry_bias_init is None:
            carry_bias_init = -self.transform_bias_init
        self.carry_bias_init = _checks.check_range("carry_bias_init", carry_bias_init)
        self.use_bias = bool(use_bias)
        self.kernel_initializer = initializers.get(kernel_initializer)
        self.kernel_regularizer = keras.regularizers.get(kernel_regularizer)
        self.transform_gate_override = transform_gate_override

    @property
    def transform_gate_override(self):
        """``None``, or a constant in [0, 1] that replaces T(x) (and C = 1 - T).

        0 closes every transform gate, so the layer copies its input (the
        lesion study of Fig. 4); 1 makes the layer a plain layer ``y = H(x)``.
        Set it on a built model and call the model again (eagerly, or after
        re-creating its compiled functions) to see the effect.
        """
        return self._transform_gate_override

    @transform_gate_override.setter
    def transform_gate_override(self, value):
        if value is not None:
            value = _checks.check_range("transform_gate_override", value, 0.0, 1.0)
        self._transform_gate_override = value

    def _projection(self, units, name, activation, dtype, bias_initializer="zeros"):
        raise NotImplementedError

    def build(self, input_shape):
        shape = _checks.check_rank(type(self).__name__, input_shape, self._ranks,
                                   self._layout)
        units = shape[-1]
        self.units = units
        self.block_state = self._projection(units, "h", self.activation, self.dtype_policy)
        self.transform_gate = self._projection(
            units, "transform_gate", "sigmoid", "float32",
            keras.initializers.Constant(self.transform_bias_init))
        self.carry = None
        if self.carry_gate == "separate":
            self.carry = self._projection(
                units, "carry_gate", "sigmoid", "float32",
                keras.initializers.Constant(self.carry_bias_init))
        for layer in self.layers:
            layer.build(shape)

    @property
    def layers(self):
        """The sub-layers: block state H, transform gate T and carry gate C."""
        if not hasattr(self, "block_state"):
            return []
        return [l for l in (self.block_state, self.transform_gate, self.carry) if l]

    def gates(self, inputs):
        """Returns ``(T(x), C(x))`` for ``inputs``, in float32."""
        if self._transform_gate_override is not None:
            t = ops.full(ops.shape(inputs), self._transform_gate_override, "float32")
            return t, 1.0 - t
        t = self.transform_gate(inputs)
        c = 1.0 - t if self.carry is None else self.carry(inputs)
        return t, c

    def call(self, inputs):
        h = self.block_state(inputs)
        t, c = self.gates(inputs)
        # Combine in float32: gates near 0 or 1 lose their resolution in
        # bfloat16 / float16.
        y = ops.cast(h, "float32") * t + ops.cast(inputs, "float32") * c
        return ops.cast(y, self.compute_dtype)

    def compute_output_shape(self, input_shape):
        return tuple(input_shape)

    def get_config(self):
        config = super().get_config()
        config.update(
            activation=keras.activations.serialize(self.activation),
            transform_bias_init=self.transform_bias_init, carry_gate=self.carry_gate,
            carry_bias_init=self.carry_bias_init, use_bias=self.use_bias,
            kernel_initializer=initializers.serialize(self.kernel_initializer),
            kernel_regularizer=keras.regularizers.serialize(self.kernel_regularizer)
            if self.kernel_regularizer is not None else None,
            transform_gate_override=self._transform_gate_override)
        return config


@keras.saving.register_keras_serializable(package="keras_identity")
class Highway(_HighwayBase):
    """A fully connected highway layer, Eqn. (3) of Srivastava et al. (2015).

    ``y = H(x) * T(x) + x * (1 - T(x))`` with block state ``H(x) = activation(W_H x + b_H)``
    and transform gate ``T(x) = sigmoid(W_T x + b_T)``, both as wide as x (one block per
    unit).  ``b_T`` starts at ``transform_bias_init``: a negative value biases the layer
    towards carrying its input (Sec. 2.2; the paper suggests -1, -2, -3 for depths around
    10, 20, 30).  With ``carry_gate="separate"`` the carry gate is learned too,
    ``y = H * T + x * C``, ``C = sigmoid(W_C x + b_C)`` (Eqn. 2), with ``b_C`` starting at
    ``carry_bias_init`` (default ``-transform_bias_init``, so that C starts close to 1 - T).

    Gates are computed and combined in float32 under mixed precision.  Backward pass,
    Eqn. (9): ``dH = T dy``, ``dT = (H - x) dy``, ``dx = (1 - T) dy`` plus the paths through
    H and T.

    Args:
        activation: activation of the block state H (the paper: ReLU or tanh).
        transform_bias_init: initial transform-gate bias b_T.
        carry_gate: ``"coupled"`` (C = 1 - T) or ``"separate"``.
        carry_bias_init: initial b_C of a separate carry gate.
        use_bias: give H a bias.
        kernel_initializer, kernel_regularizer: for H and the gates.
        transform_gate_override: ``None`` or a constant T in [0, 1]; 0 closes the layer (it
            copies its input), see the property of that name.
    """

    _layout = "(batch, ..., features)"
    _ranks = (2, 3, 4, 5)

    def _projection(self, units, name, activation, dtype, bias_initializer="zeros"):
        return keras.layers.Dense(
            units, activation=activation, use_bias=True if name != "h" else self.use_bias,
            kernel_initializer=self.kernel_initializer,
            kernel_regularizer=self.kernel_regularizer, bias_initializer=bias_initializer,
            name=f"{self.name}_{name}", dtype=dtype)


@keras.saving.register_keras_serializable(package="keras_identity")
class HighwayConv2D(_HighwayBase):
    """A convolutional highway layer (Srivastava et al. 2015, Sec. 2.1).

    Eqn. (3) with convolutional H and T: "the same sized receptive fields for both, and
    zero-padding to ensure that the block state and transform gate feature maps match the
    input size".  ``y = H(x) * T(x) + x * (1 - T(x))``, ``H = activation(conv_k(x))``,
    ``T = sigmoid(conv_k(x) + b_T)``.  The layer keeps the number of channels; change it
    with a plain layer between highway layers, as the paper does.

    Args:
        kernel_size: receptive field of H and T (an odd int).
        other arguments: as :class:`Highway`.
    """

    _layout = "(batch, height, width, channels)"
    _ranks = (4,)

    def __init__(self, kernel_size=3, **kwargs):
        super().__init__(**kwargs)
        self.kernel_size = _checks.check_positive_int("kernel_size", kernel_size)
        if self.kernel_size % 2 == 0:
            raise ValueError(f"kernel_size={kernel_size!r} is not valid; expected an odd "
                             f"size so that zero padding keeps the feature map size.")

    def _projection(self, units, name, activation, dtype, bias_initializer="zeros"):
        return keras.layers.Conv2D(
            units, self.kernel_size, padding="same", activation=activation,
            use_bias=True if name != "h" else self.use_bias,
            kernel_initializer=self.kernel_initializer,
            kernel_regularizer=self.kernel_regularizer, bias_initializer=bias_initializer,
            name=f"{self.name}_{name}", dtype=dtype)

    def get_config(self):
        config = super().get_config()
        config.update(kernel_size=self.kernel_size)
        return config


def highway_layers(model):
    """The highway layers of ``model``, in order."""
    return [l for l in model.layers if isinstance(l, _HighwayBase)]


def transform_gate_activations(model, inputs, batch_size=256):
    """Reads the transform gates T(x) of every highway layer of a model.

    Args:
        model: a functional model containing :class:`Highway` or :class:`HighwayConv2D`
            layers (e.g. ``highway_net``).
        inputs: a batch of model inputs (NumPy or tensor).
        batch_size: examples evaluated at a time.

    Returns:
        A dict from layer name to a float32 NumPy array of T(x), shaped like the layer's
        input, for every example of ``inputs`` (the Highway paper's Figs. 2-3 average these
        over examples or classes).
    """
    import numpy as np

    layers = highway_layers(model)
    if not layers:
        raise ValueError(f"model {model.name!r} has no Highway or HighwayConv2D layers.")
    feed = keras.Model(model.input, [layer.input for layer in layers])
    results = {layer.name: [] for layer in layers}
    n = int(ops.shape(inputs)[0])
    for start in range(0, n, batch_size):
        layer_inputs = feed(inputs[start:start + batch_size], training=False)
        if len(layers) == 1:
            layer_inputs = [layer_inputs]
        for layer, x in zip(layers, layer_inputs):
            results[layer.name].append(ops.convert_to_numpy(layer.gates(x)[0]))
    return {name: np.concatenate(parts) for name, parts in results.items()}

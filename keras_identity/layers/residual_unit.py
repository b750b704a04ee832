"""The Residual Unit of He et al., *Identity Mappings in Deep Residual Networks*.

One layer covers every unit the paper studies:

* ``unit=`` the five orderings of Fig. 4 / Table 2,
* ``shortcut=`` the six shortcuts of Fig. 2 / Table 1,
* ``block=`` basic (two 3x3), bottleneck (1x1, 3x3, 1x1) or single-layer
  (Table 3's "1-layer skip"),
* option A / option B shortcuts for units that change shape (He et al. 2015),
* the first-unit and last-unit activation rules of the paper's appendix, and
* stochastic depth (Huang et al. 2016, from the lecture notes).
"""

import keras
from keras import ops

from keras_identity import _checks
from keras_identity import initializers
from keras_identity.layers.fused_batch_normalization import FusedBatchNormalization
from keras_identity.layers.zero_pad_shortcut import ZeroPadShortcut

UNITS = (
    "original",                 # Fig. 4(a)
    "bn_after_addition",        # Fig. 4(b)
    "relu_before_addition",     # Fig. 4(c)
    "relu_only_preactivation",  # Fig. 4(d)
    "full_preactivation",       # Fig. 4(e)
)
PREACTIVATION_UNITS = ("relu_only_preactivation", "full_preactivation")
BLOCKS = ("basic", "bottleneck", "single")
SHORTCUTS = (
    "identity",              # Fig. 2(a)
    "constant_scaling",      # Fig. 2(b)
    "exclusive_gating",      # Fig. 2(c)
    "shortcut_only_gating",  # Fig. 2(d)
    "conv1x1",               # Fig. 2(e)
    "dropout",               # Fig. 2(f)
)
GATED_SHORTCUTS = ("exclusive_gating", "shortcut_only_gating")
PREACTIVATION_MODES = ("residual", "shared", "none")
DIMENSION_SHORTCUTS = ("A", "B")
BOTTLENECK_EXPANSION = 4


def set_weight_arguments(layer, *, use_bias, bn_momentum, bn_epsilon, kernel_initializer,
                         kernel_regularizer):
    """Validates and sets the convolution and BN arguments shared by
    :class:`ResidualUnit` and ``ResidualStack`` on ``layer``."""
    layer.use_bias = bool(use_bias)
    layer.bn_momentum = _checks.check_range("bn_momentum", bn_momentum, 0.0, 1.0)
    layer.bn_epsilon = _checks.check_range("bn_epsilon", bn_epsilon, 0.0, low_inclusive=False)
    layer.kernel_initializer = initializers.get(kernel_initializer,
                                                initializers.he_normal_fan_out)
    layer._kernel_initializer_arg = kernel_initializer
    layer.kernel_regularizer = keras.regularizers.get(kernel_regularizer)


def check_widths(filters, bottleneck_width, kernel_size):
    """Validates a unit's bottleneck width (default ``filters // 4``) and its
    odd kernel size; returns both."""
    if bottleneck_width is None:
        bottleneck_width = max(1, filters // BOTTLENECK_EXPANSION)
    bottleneck_width = _checks.check_positive_int("bottleneck_width", bottleneck_width)
    kernel_size = _checks.check_positive_int("kernel_size", kernel_size)
    if kernel_size % 2 == 0:
        raise ValueError(f"kernel_size={kernel_size!r} is not valid; expected an odd size so "
                         f"that the units keep the feature map size.")
    return bottleneck_width, kernel_size


@keras.saving.register_keras_serializable(package="keras_identity")
class ResidualUnit(keras.layers.Layer):
    """A Residual Unit, Eqns. (1)-(2): ``x_{l+1} = f(h(x_l) + F(x_l, W_l))``.

    ``F`` is a stack of K weight layers (``block``), ``h`` is the shortcut
    (``shortcut``, Fig. 2) and the placement of BN and ReLU around them is
    one of the orderings of Fig. 4 (``unit``):

    ======================== ===================================== ===========
    ``unit``                 residual function F, per weight layer  f
    ======================== ===================================== ===========
    original (a)             conv-BN-ReLU ... conv-BN               ReLU
    bn_after_addition (b)    conv-BN-ReLU ... conv                  BN, ReLU
    relu_before_addition (c) conv-BN-ReLU ... conv-BN-ReLU          identity
    relu_only_preact. (d)    ReLU-conv-BN ... ReLU-conv-BN          identity
    full_preactivation (e)   BN-ReLU-conv ... BN-ReLU-conv          identity
    ======================== ===================================== ===========

    Units (d) and (e) compute Eqn. (9), ``x_{l+1} = x_l + F(f^(x_l))``.

    Shortcuts (Table 1): ``identity`` ``h(x) = x`` (Eqns. 3-5);
    ``constant_scaling`` ``h(x) = lambda x`` (Eqns. 6-8), with
    ``scale_residual=True`` also scaling F by ``1 - lambda`` ("frozen
    gating") and ``shortcut_scale=0`` giving a plain (shortcut-free) unit;
    ``exclusive_gating`` ``(1 - g(x)) h + g(x) F``; ``shortcut_only_gating``
    ``(1 - g(x)) h + F``, where ``g(x) = sigmoid(W_g x + b_g)`` is a 1x1
    convolution whose bias starts at ``gate_bias_init``; ``conv1x1`` (option
    C); ``dropout`` (Bernoulli mask with rate ``shortcut_dropout_rate`` on the
    shortcut's output, not rescaled, so it imposes a scale whose expectation is
    ``1 - rate`` as the paper describes; at inference the shortcut is scaled
    by that expectation).

    When the unit changes shape (``strides > 1`` or a different number of
    channels), ``h`` first matches shapes by ``dimension_shortcut``: ``"A"``
    (subsample and zero-pad channels, no parameters) or ``"B"`` (1x1
    projection; followed by BN in the post-activation orderings (a)-(c) as in
    the original ResNet, bare in the pre-activation ones as in the authors'
    pre-activation code).  The gating, scaling and dropout variants act on
    that matched shortcut.

    Activation rules of the paper's appendix, for orderings (d) and (e):
    ``preactivation="shared"`` applies the unit's first activation before the
    split, so both branches see it (the first unit after a bare stem conv,
    and in the authors' code every unit that changes shape, whose projection
    then reads the pre-activated input); ``preactivation="none"`` omits it
    (the input is already activated, e.g. after the ImageNet stem);
    ``post_activation=True`` adds an activation after the addition (the last
    unit before pooling).

    Args:
        filters: output channels (for bottlenecks, the expanded width 4d).
        block: ``"basic"``, ``"bottleneck"`` or ``"single"``.
        unit: the Fig. 4 ordering, see above.
        shortcut: the Fig. 2 shortcut, see above.
        strides: stride of the unit (1 or 2 in the papers' nets).
        dimension_shortcut: ``"A"`` or ``"B"``, for units that change shape.
        bottleneck_width: width d of a bottleneck's 1x1/3x3 layers
            (default ``filters // 4``).
        kernel_size: size of the spatial (3x3) convolutions.
        stride_on_1x1: for bottlenecks, put the stride on the first 1x1 conv
            (the authors' code) rather than the 3x3 (fb.resnet.torch, "v1.5").
        preactivation: ``"residual"``, ``"shared"`` or ``"none"``, see above.
        post_activation: add the activation after the addition (last unit).
        shortcut_scale: lambda of ``constant_scaling``, >= 0.
        scale_residual: with ``constant_scaling``, scale F by ``1 - lambda``.
        gate_bias_init: initial b_g of the gated shortcuts.
        shortcut_dropout_rate: drop rate of the ``dropout`` shortcut, [0, 1).
        stochastic_depth_rate: probability, per example, of dropping F during
            training (Huang et al. 2016); F is rescaled by ``1/(1-rate)`` when
            kept, so inference uses the full unit unchanged.
        use_bias: give the convolutions biases (the papers' nets have none:
            BN follows or precedes every convolution).
        bn_momentum, bn_epsilon: BatchNormalization settings (the Torch
            defaults of the authors' code: 0.9 and 1e-5).
        kernel_initializer: defaults to He normal with fan-out, as the
            authors' code.
        kernel_regularizer: applied to every convolution kernel.
        seed: seed of the dropout / stochastic-depth masks.
    """

    def __init__(self, filters, *, block="basic", unit="original", shortcut="identity",
                 strides=1, dimension_shortcut="B", bottleneck_width=None, kernel_size=3,
                 stride_on_1x1=True, preactivation="residual", post_activation=False,
                 shortcut_scale=0.5, scale_residual=False, gate_bias_init=0.0,
                 shortcut_dropout_rate=0.5, stochastic_depth_rate=0.0, use_bias=False,
                 bn_momentum=0.9, bn_epsilon=1e-5, kernel_initializer=None,
                 kernel_regularizer=None, seed=None, **kwargs):
        super().__init__(**kwargs)
        self.filters = _checks.check_positive_int("filters", filters)
        self.block = _checks.check_choice("block", block, BLOCKS)
        self.unit = _checks.check_choice("unit", unit, UNITS)
        self.shortcut = _checks.check_choice("shortcut", shortcut, SHORTCUTS)
        self.strides = _checks.check_positive_int("strides", strides)
        self.dimension_shortcut = _checks.check_choice(
            "dimension_shortcut", dimension_shortcut, DIMENSION_SHORTCUTS)
        self.bottleneck_width, self.kernel_size = check_widths(filters, bottleneck_width,
                                                               kernel_size)
        self.stride_on_1x1 = bool(stride_on_1x1)
        self.preactivation = _checks.check_choice(
            "preactivation", preactivation, PREACTIVATION_MODES)
        self.post_activation = bool(post_activation)
        if self.unit not in PREACTIVATION_UNITS and (
                self.preactivation != "residual" or self.post_activation):
            raise ValueError(
                f"preactivation={preactivation!r} / post_activation={post_activation!r} "
                f"apply to the pre-activation units {PREACTIVATION_UNITS}; unit={unit!r} "
                f"takes preactivation='residual' and post_activation=False.")
        self.shortcut_scale = _checks.check_range("shortcut_scale", shortcut_scale, low=0.0)
        self.scale_residual = bool(scale_residual)
        if self.scale_residual and self.shortcut_scale > 1.0:
            raise ValueError(f"shortcut_scale={shortcut_scale!r} is not valid with "
                             f"scale_residual=True; expected a number in [0, 1] so that "
                             f"F is scaled by 1 - shortcut_scale >= 0.")
        self.gate_bias_init = _checks.check_range("gate_bias_init", gate_bias_init)
        self.shortcut_dropout_rate = _checks.check_range(
            "shortcut_dropout_rate", shortcut_dropout_rate, 0.0, 1.0, high_inclusive=False)
        self.stochastic_depth_rate = _checks.check_range(
            "stochastic_depth_rate", stochastic_depth_rate, 0.0, 1.0, high_inclusive=False)
        set_weight_arguments(self, use_bias=use_bias, bn_momentum=bn_momentum,
                             bn_epsilon=bn_epsilon, kernel_initializer=kernel_initializer,
                             kernel_regularizer=kernel_regularizer)
        self.seed = seed
        needs_rng = (self.stochastic_depth_rate > 0.0
                     or (self.shortcut == "dropout" and self.shortcut_dropout_rate > 0.0))
        self.seed_generator = keras.random.SeedGenerator(seed) if needs_rng else None

    # ------------------------------------------------------------------ build
    @property
    def is_preactivation(self):
        return self.unit in PREACTIVATION_UNITS

    @property
    def has_shortcut(self):
        """False for ``constant_scaling`` with lambda = 0: a plain unit."""
        return not (self.shortcut == "constant_scaling" and self.shortcut_scale == 0.0)

    def _weight_plan(self):
        """(kernel size, output channels, stride) of each weight layer of F."""
        k, s = self.kernel_size, self.strides
        if self.block == "basic":
            return [(k, self.filters, s), (k, self.filters, 1)]
        if self.block == "single":
            return [(k, self.filters, s)]
        d = self.bottleneck_width
        s1, s2 = (s, 1) if self.stride_on_1x1 else (1, s)
        return [(1, d, s1), (k, d, s2), (1, self.filters, 1)]

    def _conv(self, filters, kernel_size, strides, name, dtype=None, **kwargs):
        kwargs.setdefault("use_bias", self.use_bias)
        return keras.layers.Conv2D(
            filters, kernel_size, strides=strides,
            # A strided kxk convolution gets symmetric padding in ``call`` (as
            # Torch/Caffe pad), "same" would pad only bottom/right in TF.
            padding="same" if strides == 1 or kernel_size == 1 else "valid",
            kernel_initializer=self.kernel_initializer,
            kernel_regularizer=self.kernel_regularizer,
            name=f"{self.name}_{name}", dtype=dtype or self.dtype_policy, **kwargs)

    def _bn(self, name):
        return FusedBatchNormalization(
            momentum=self.bn_momentum, epsilon=self.bn_epsilon,
            name=f"{self.name}_{name}", dtype=self.dtype_policy)

    def build(self, input_shape):
        shape = _checks.check_rank(type(self).__name__, input_shape, (4,),
                                   "(batch, height, width, channels)")
        in_channels = shape[-1]
        self._in_channels = in_channels
        plan = self._weight_plan()
        widths_in = [in_channels] + [c for _, c, _ in plan[:-1]]

        self.convs, self.bns = [], []
        ordered = []
        channels = list(input_shape)
        for i, (k, c, s) in enumerate(plan):
            conv = self._conv(c, k, s, f"conv{i + 1}")
            if self.unit == "full_preactivation":
                # BN precedes its convolution; the first one is the shared /
                # omitted pre-activation when ``preactivation != "residual"``.
                if not (i == 0 and self.preactivation == "none"):
                    bn = self._bn(f"bn{i + 1}")
                    bn.build(tuple(channels[:-1]) + (widths_in[i],))
                    self.bns.append(bn)
                    ordered.append(bn)
                conv.build(tuple(channels[:-1]) + (widths_in[i],))
                ordered.append(conv)
            else:
                conv.build(tuple(channels[:-1]) + (widths_in[i],))
                ordered.append(conv)
                if not (self.unit == "bn_after_addition" and i == len(plan) - 1):
                    bn = self._bn(f"bn{i + 1}")
                    bn.build(tuple(channels[:-1]) + (c,))
                    self.bns.append(bn)
                    ordered.append(bn)
            self.convs.append(conv)

        out_shape = self.compute_output_shape(shape)
        self.after_addition_bn = None
        if self.unit == "bn_after_addition":
            self.after_addition_bn = self._bn(f"bn{len(plan)}")
            self.after_addition_bn.build(out_shape)
            ordered.append(self.after_addition_bn)
        self.post_bn = None
        if self.post_activation and self.unit == "full_preactivation":
            self.post_bn = self._bn("post_bn")
            self.post_bn.build(out_shape)

        # Shortcut h(x).
        changes_shape = self.strides != 1 or in_channels != self.filters
        self.projection = self.projection_bn = self.zero_pad = None
        if self.has_shortcut and (self.shortcut == "conv1x1" or (
                changes_shape and self.dimension_shortcut == "B")):
            self.projection = self._conv(self.filters, 1, self.strides, "shortcut_conv")
            self.projection.build(shape)
            ordered.append(self.projection)
            if not self.is_preactivation:
                self.projection_bn = self._bn("shortcut_bn")
                self.projection_bn.build(out_shape)
                ordered.append(self.projection_bn)
        elif self.has_shortcut and changes_shape:
            self.zero_pad = ZeroPadShortcut(self.filters, self.strides,
                                            name=f"{self.name}_shortcut_pad",
                                            dtype=self.dtype_policy)
            self.zero_pad.build(shape)
            ordered.append(self.zero_pad)

        # Gate g(x) = sigmoid(W_g x + b_g), a 1x1 convolution kept in float32.
        self.gate = None
        if self.shortcut in GATED_SHORTCUTS:
            self.gate = self._conv(
                self.filters, 1, self.strides, "gate", dtype="float32", use_bias=True,
                activation="sigmoid",
                bias_initializer=keras.initializers.Constant(self.gate_bias_init))
            self.gate.build(shape)
            ordered.append(self.gate)
        if self.post_bn is not None:
            ordered.append(self.post_bn)
        self._ordered_layers = ordered

    @property
    def layers(self):
        """The unit's sub-layers (for ``model.summary(expand_nested=True)``)."""
        return list(getattr(self, "_ordered_layers", []))

    # ------------------------------------------------------------------- call
    def _apply_conv(self, conv, x):
        k, s = conv.kernel_size[0], conv.strides[0]
        if s > 1 and k > 1:
            p = (k - 1) // 2
            x = ops.pad(x, [[0, 0], [p, p], [p, p], [0, 0]])
        return conv(x)

    def _residual(self, x, training):
        unit = self.unit
        last = len(self.convs) - 1
        shared = unit == "full_preactivation" and self.preactivation == "shared"
        bns = iter(self.bns[1:] if shared else self.bns)  # bn1 ran before the split
        for i, conv in enumerate(self.convs):
            if unit == "full_preactivation":
                if i == 0 and self.preactivation != "residual":
                    pass  # pre-activation applied before the split, or not at all
                else:
                    x = ops.relu(next(bns)(x, training=training))
                x = self._apply_conv(conv, x)
            elif unit == "relu_only_preactivation":
                if not (i == 0 and self.preactivation != "residual"):
                    x = ops.relu(x)
                x = next(bns)(self._apply_conv(conv, x), training=training)
            else:
                x = self._apply_conv(conv, x)
                if unit == "bn_after_addition" and i == last:
                    break
                x = next(bns)(x, training=training)
                if i < last or unit == "relu_before_addition":
                    x = ops.relu(x)
        return x

    def _shortcut(self, x, training):
        if self.projection is not None:
            x = self._apply_conv(self.projection, x)
            if self.projection_bn is not None:
                x = self.projection_bn(x, training=training)
        elif self.zero_pad is not None:
            x = self.zero_pad(x)
        if self.shortcut == "dropout" and self.shortcut_dropout_rate > 0.0:
            keep = 1.0 - self.shortcut_dropout_rate
            if training:
                mask = keras.random.uniform(ops.shape(x), seed=self.seed_generator,
                                            dtype=x.dtype) >= self.shortcut_dropout_rate
                x = x * ops.cast(mask, x.dtype)
            else:
                x = x * ops.cast(keep, x.dtype)
        return x

    def _drop_path(self, residual, training):
        rate = self.stochastic_depth_rate
        if not training or rate == 0.0:
            return residual
        batch = ops.shape(residual)[0]
        keep = keras.random.uniform((batch, 1, 1, 1), seed=self.seed_generator,
                                    dtype=residual.dtype) >= rate
        return residual * ops.cast(keep, residual.dtype) / ops.cast(1.0 - rate,
                                                                    residual.dtype)

    def call(self, inputs, training=None):
        x = inputs
        if self.is_preactivation and self.preactivation == "shared":
            if self.unit == "full_preactivation":
                x = self.bns[0](x, training=training)
            x = ops.relu(x)
        residual = self._drop_path(self._residual(x, training), training)

        if not self.has_shortcut:
            # lambda = 0: a plain unit (with scale_residual, F is scaled by 1 - 0).
            y = residual
        else:
            h = self._shortcut(x, training)
            if self.gate is not None:
                # Combine in float32: 1 - g(x) close to 1 is not representable
                # in bfloat16 / float16.
                g = self.gate(x)
                one_minus_g = 1.0 - g
                h32 = ops.cast(h, "float32")
                if self.shortcut == "exclusive_gating":
                    y = one_minus_g * h32 + g * ops.cast(residual, "float32")
                else:
                    y = one_minus_g * h32 + ops.cast(residual, "float32")
                y = ops.cast(y, self.compute_dtype)
            elif self.shortcut == "constant_scaling":
                lam = self.shortcut_scale
                f_scale = 1.0 - lam if self.scale_residual else 1.0
                y = ops.cast(lam, h.dtype) * h + ops.cast(f_scale, residual.dtype) * residual
            else:
                y = h + residual

        if self.unit == "original":
            y = ops.relu(y)
        elif self.unit == "bn_after_addition":
            y = ops.relu(self.after_addition_bn(y, training=training))
        elif self.post_activation:
            if self.post_bn is not None:
                y = self.post_bn(y, training=training)
            y = ops.relu(y)
        return y

    def compute_output_shape(self, input_shape):
        b, h, w, _ = tuple(input_shape)
        s = self.strides
        return (b, None if h is None else -(-h // s), None if w is None else -(-w // s),
                self.filters)

    def get_config(self):
        config = super().get_config()
        config.update(
            filters=self.filters, block=self.block, unit=self.unit,
            shortcut=self.shortcut, strides=self.strides,
            dimension_shortcut=self.dimension_shortcut,
            bottleneck_width=self.bottleneck_width, kernel_size=self.kernel_size,
            stride_on_1x1=self.stride_on_1x1, preactivation=self.preactivation,
            post_activation=self.post_activation, shortcut_scale=self.shortcut_scale,
            scale_residual=self.scale_residual, gate_bias_init=self.gate_bias_init,
            shortcut_dropout_rate=self.shortcut_dropout_rate,
            stochastic_depth_rate=self.stochastic_depth_rate, use_bias=self.use_bias,
            bn_momentum=self.bn_momentum, bn_epsilon=self.bn_epsilon,
            kernel_initializer=(None if self._kernel_initializer_arg is None
                                else initializers.serialize(self.kernel_initializer)),
            kernel_regularizer=keras.regularizers.serialize(self.kernel_regularizer)
            if self.kernel_regularizer is not None else None,
            seed=self.seed)
        return config

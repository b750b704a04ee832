"""The Residual Unit of He et al., *Identity Mappings in Deep Residual Networks*.

:class:`ResidualUnit` is an ordering (Fig. 4, :mod:`.orderings`) run over a
block's weight layers (:mod:`.blocks`) with a shortcut (Fig. 2 and options
A/B, :mod:`.shortcuts`), plus the first-unit and last-unit activation rules
of the paper's appendix and stochastic depth (Huang et al. 2016).
"""

import keras
from keras import ops

from keras_identity import _checks
from keras_identity import initializers
from keras_identity.layers.fused_batch_normalization import FusedBatchNormalization
from keras_identity.layers.residual import blocks
from keras_identity.layers.residual import orderings
from keras_identity.layers.residual import shortcuts


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


def weight_config(layer):
    """The ``get_config`` entries written by :func:`set_weight_arguments`."""
    return dict(
        use_bias=layer.use_bias, bn_momentum=layer.bn_momentum, bn_epsilon=layer.bn_epsilon,
        kernel_initializer=(None if layer._kernel_initializer_arg is None
                            else initializers.serialize(layer.kernel_initializer)),
        kernel_regularizer=keras.regularizers.serialize(layer.kernel_regularizer)
        if layer.kernel_regularizer is not None else None)


def check_preactivation(unit, preactivation, post_activation):
    """The first/last-unit rules apply to the pre-activation orderings only."""
    _checks.check_choice("preactivation", preactivation, orderings.PREACTIVATION_MODES)
    if unit not in orderings.PREACTIVATION_UNITS and (
            preactivation != "residual" or post_activation):
        raise ValueError(
            f"preactivation={preactivation!r} / post_activation={post_activation!r} "
            f"apply to the pre-activation units {orderings.PREACTIVATION_UNITS}; unit="
            f"{unit!r} takes preactivation='residual' and post_activation=False.")
    return preactivation


@keras.saving.register_keras_serializable(package="keras_identity")
class ResidualUnit(keras.layers.Layer):
    """A Residual Unit, Eqns. (1)-(2): ``x_{l+1} = f(h(x_l) + F(x_l, W_l))``.

    ``F`` is a stack of K weight layers (``block``, :mod:`.blocks`), ``h`` is the shortcut
    (``shortcut``, Fig. 2, :mod:`.shortcuts`) and the placement of BN and ReLU around them
    is one of the orderings of Fig. 4 (``unit``, :mod:`.orderings`); units (d) and (e)
    compute Eqn. (9), ``x_{l+1} = x_l + F(f^(x_l))``.  The unit runs its ordering's program
    (:func:`.orderings.unit_program`) with its sub-layers, and its shortcut's
    :func:`.shortcuts.add`; a looped :class:`ResidualStack` runs the same definitions.

    When the unit changes shape (``strides > 1`` or a different number of channels), ``h``
    first matches shapes by ``dimension_shortcut``: ``"A"`` (subsample and zero-pad
    channels, no parameters) or ``"B"`` (1x1 projection; followed by BN in the
    post-activation orderings (a)-(c) as in the original ResNet, bare in the pre-activation
    ones as in the authors' pre-activation code).  The gating, scaling and dropout variants
    act on that matched shortcut.

    Activation rules of the paper's appendix, for orderings (d) and (e):
    ``preactivation="shared"`` applies the unit's first activation before the split, so both
    branches see it (the first unit after a bare stem conv, and in the authors' code every
    unit that changes shape, whose projection then reads the pre-activated input);
    ``preactivation="none"`` omits it (the input is already activated, e.g. after the
    ImageNet stem); ``post_activation=True`` adds an activation after the addition (the last
    unit before pooling).

    Args:
        filters: output channels (for bottlenecks, the expanded width 4d).
        block: ``"basic"``, ``"bottleneck"`` or ``"single"``.
        unit: the Fig. 4 ordering (``"original"``, ``"bn_after_addition"``,
            ``"relu_before_addition"``, ``"relu_only_preactivation"``,
            ``"full_preactivation"``).
        shortcut: the Fig. 2 shortcut (``"identity"``, ``"constant_scaling"``,
            ``"exclusive_gating"``, ``"shortcut_only_gating"``, ``"conv1x1"``,
            ``"dropout"``; its arguments below), or an object of :mod:`.shortcuts` carrying
            its arguments, e.g. ``shortcuts.ExclusiveGating(gate_bias_init=-6.0)``.
        strides: stride of the unit (1 or 2 in the papers' nets).
        dimension_shortcut: ``"A"`` or ``"B"``, for units that change shape.
        bottleneck_width: width d of a bottleneck's 1x1/3x3 layers (default
            ``filters // 4``).
        kernel_size: size of the spatial (3x3) convolutions.
        stride_on_1x1: for bottlenecks, put the stride on the first 1x1 conv (the authors'
            code) rather than the 3x3 (fb.resnet.torch, "v1.5").
        preactivation: ``"residual"``, ``"shared"`` or ``"none"``, see above.
        post_activation: add the activation after the addition (last unit).
        shortcut_scale: lambda of ``constant_scaling``, >= 0 (default 0.5).
        scale_residual: with ``constant_scaling``, scale F by ``1 - lambda``.
        gate_bias_init: initial b_g of the gated shortcuts (default 0).
        shortcut_dropout_rate: drop rate of the ``dropout`` shortcut, [0, 1) (default 0.5).
        stochastic_depth_rate: probability, per example, of dropping F during training
            (Huang et al. 2016); F is rescaled by ``1/(1-rate)`` when kept, so inference
            uses the full unit unchanged.
        use_bias: give the convolutions biases (the papers' nets have none: BN follows or
            precedes every convolution).
        bn_momentum, bn_epsilon: BatchNormalization settings (the Torch defaults of the
            authors' code: 0.9 and 1e-5).
        kernel_initializer: defaults to He normal with fan-out, as the authors' code.
        kernel_regularizer: applied to every convolution kernel.
        seed: seed of the dropout / stochastic-depth masks.

    The four shortcut arguments apply to their shortcuts only; giving one to another
    shortcut raises a ``ValueError`` naming the shortcuts it needs.
    """

    def __init__(self, filters, *, block="basic", unit="original", shortcut="identity",
                 strides=1, dimension_shortcut="B", bottleneck_width=None, kernel_size=3,
                 stride_on_1x1=True, preactivation="residual", post_activation=False,
                 shortcut_scale=None, scale_residual=None, gate_bias_init=None,
                 shortcut_dropout_rate=None, stochastic_depth_rate=0.0, use_bias=False,
                 bn_momentum=0.9, bn_epsilon=1e-5, kernel_initializer=None,
                 kernel_regularizer=None, seed=None, **kwargs):
        super().__init__(**kwargs)
        self.filters = _checks.check_positive_int("filters", filters)
        self.block = _checks.check_choice("block", block, blocks.BLOCKS)
        self.unit = _checks.check_choice("unit", unit, orderings.UNITS)
        shortcuts.set_arguments(
            self, shortcut, shortcut_scale=shortcut_scale, scale_residual=scale_residual,
            gate_bias_init=gate_bias_init, shortcut_dropout_rate=shortcut_dropout_rate)
        self.strides = _checks.check_positive_int("strides", strides)
        self.dimension_shortcut = _checks.check_choice(
            "dimension_shortcut", dimension_shortcut, shortcuts.DIMENSION_SHORTCUTS)
        self.bottleneck_width, self.kernel_size = blocks.check_widths(
            filters, bottleneck_width, kernel_size)
        self.stride_on_1x1 = bool(stride_on_1x1)
        self.preactivation = check_preactivation(self.unit, preactivation, post_activation)
        self.post_activation = bool(post_activation)
        self.stochastic_depth_rate = _checks.check_range(
            "stochastic_depth_rate", stochastic_depth_rate, 0.0, 1.0, high_inclusive=False)
        set_weight_arguments(self, use_bias=use_bias, bn_momentum=bn_momentum,
                             bn_epsilon=bn_epsilon, kernel_initializer=kernel_initializer,
                             kernel_regularizer=kernel_regularizer)
        self.seed = seed
        needs_rng = self.stochastic_depth_rate > 0.0 or self._shortcut.random
        self.seed_generator = keras.random.SeedGenerator(seed) if needs_rng else None
        self._program = orderings.unit_program(
            self.unit, blocks.LAYERS_PER_UNIT[self.block], self.preactivation,
            self.post_activation)

    # ------------------------------------------------------------------ build
    @property
    def is_preactivation(self):
        return self.unit in orderings.PREACTIVATION_UNITS

    @property
    def has_shortcut(self):
        """False for ``constant_scaling`` with lambda = 0: a plain unit."""
        return self._shortcut.has_shortcut

    @property
    def changes_shape(self):
        """Whether the output's shape differs from the input's (stride or
        width; known once built)."""
        return getattr(self, "_changes_shape", self.strides != 1)

    @property
    def deleted(self):
        """Whether the unit is deleted, as in Veit et al. (2016)'s lesion
        study: F is taken as 0, so the unit outputs ``f(h(x))``, what its
        shortcut carries (x for identity shortcuts; a unit that changes shape
        still changes it, through its projection or option-A shortcut).  A
        unit without a shortcut (a plain unit, lambda = 0) passes its input on
        instead, which needs an unchanged shape.  Set it on a built model and
        call the model again eagerly, or after re-creating its compiled
        functions (``model.make_predict_function(force=True)``).
        """
        return getattr(self, "_deleted", False)

    @deleted.setter
    def deleted(self, value):
        if value and not self.has_shortcut and self.changes_shape:
            raise ValueError(f"unit {self.name!r} has no shortcut and changes the shape; it "
                             f"cannot be deleted (nothing would carry its input on).")
        self._deleted = bool(value)

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
        layers = blocks.weight_layers(
            self.block, self.filters, in_channels, bottleneck_width=self.bottleneck_width,
            kernel_size=self.kernel_size, strides=self.strides,
            stride_on_1x1=self.stride_on_1x1)
        channels = orderings.bn_channels(self._program, layers, in_channels)
        out_shape = self.compute_output_shape(shape)
        spatial = tuple(shape[:-1])

        # The sub-layers in program order.  (Attribute names and this order
        # are the paths of the weights in .keras files; the private maps by
        # program index have string keys, as TensorFlow's trackables need.)
        self.convs, self.bns, ordered, after_addition = [], [], [], []
        self._bn_layers = {}
        added = False
        for step in self._program:
            if step[0] == "conv":
                layer = layers[step[1]]
                conv = self._conv(layer.out_channels, layer.kernel_size, layer.strides,
                                  f"conv{step[1] + 1}")
                conv.build(spatial + (layer.in_channels,))
                self.convs.append(conv)
                ordered.append(conv)
            elif step[0] == "bn":
                index = step[1]
                bn = self._bn("post_bn" if index == orderings.POST else f"bn{index + 1}")
                bn.build(tuple(out_shape[:-1]) + (channels[index],))
                self._bn_layers[str(index)] = bn
                if added:
                    after_addition.append(bn)
                else:
                    self.bns.append(bn)
                    ordered.append(bn)
            elif step == orderings.ADD:
                added = True
        self.after_addition_bn = self._bn_layers.get(str(len(layers) - 1)) if (
            self.unit == "bn_after_addition") else None
        self.post_bn = self._bn_layers.get(orderings.POST)
        if self.after_addition_bn is not None:
            ordered.append(self.after_addition_bn)

        # The shortcut h(x) (Fig. 2; options A / B when the shape changes),
        # its sub-layers made by the shortcut (attribute order: weight paths).
        changes_shape = self.strides != 1 or in_channels != self.filters
        self._changes_shape = changes_shape
        made = self._shortcut.unit_layers(
            self._conv, self._bn, self.filters, self.strides, changes_shape=changes_shape,
            dimension_shortcut=self.dimension_shortcut, preactivation=self.is_preactivation,
            name=self.name, dtype=self.dtype_policy)
        self.projection, self.projection_bn = made["projection"], made["projection_bn"]
        self.zero_pad, self.gate = made["zero_pad"], made["gate"]
        for layer, layer_input in ((self.projection, shape), (self.projection_bn, out_shape),
                                   (self.zero_pad, shape), (self.gate, shape)):
            if layer is not None:
                layer.build(layer_input)
                ordered.append(layer)
        if self.post_bn is not None:
            ordered.append(self.post_bn)
        self._ordered_layers = ordered
        self._convs_by_index = {str(step[1]): conv for step, conv in zip(
            [s for s in self._program if s[0] == "conv"], self.convs)}

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

    def _project(self, x, training):
        """Options A / B, or Fig. 2(e)'s 1x1 convolution (with its BN)."""
        if self.projection is not None:
            x = self._apply_conv(self.projection, x)
            if self.projection_bn is not None:
                x = self.projection_bn(x, training=training)
        elif self.zero_pad is not None:
            x = self.zero_pad(x)
        return x

    def _run(self, program, x, training, add=None):
        return orderings.run(
            program, x, conv=lambda i, t: self._apply_conv(self._convs_by_index[str(i)], t),
            bn=lambda i, t: self._bn_layers[str(i)](t, training=training), add=add)

    def _residual(self, x, training):
        """F(x): the program's steps before the addition (after its split)."""
        steps = self._program[:self._program.index(orderings.ADD)]
        if orderings.SPLIT in steps:
            steps = steps[steps.index(orderings.SPLIT) + 1:]
        return self._run(steps, x, training)

    def call(self, inputs, training=None):
        random = training and self.seed_generator is not None
        uniform = shortcuts.seeded_uniform(self.seed_generator.next()) if random else None
        project = None
        if self.projection is not None or self.zero_pad is not None:
            project = lambda x: self._project(x, training)  # noqa: E731

        if self.deleted and not self.has_shortcut:
            return inputs

        def add(x, f):
            if self.deleted:
                f = ops.zeros_like(f)
            return shortcuts.add(
                self._shortcut, x, f, training=training, project=project, gate=self.gate,
                uniform=uniform, stochastic_depth_rate=self.stochastic_depth_rate or None)

        return self._run(self._program, inputs, training, add)

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
            post_activation=self.post_activation, **self._shortcut.config(),
            stochastic_depth_rate=self.stochastic_depth_rate, **weight_config(self),
            seed=self.seed)
        return config

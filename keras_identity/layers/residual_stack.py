"""A run of identical Residual Units computed by one loop over stacked weights.

A stage of a deep ResNet is one unit that changes shape followed by ``n - 1``
units of the same shape (He et al. 2016, Eqn. 4: ``x_L = x_l + sum F(x_i)``).
Built as ``n - 1`` layers, the traced graph, the XLA program and the time to
build, trace and compile all grow with depth: ResNet-1001 has 333 units.
:class:`ResidualStack` holds the weights of those units stacked along a
leading axis of length ``num_units`` and applies them with a single
``tf.while_loop``, so the graph of a stage has the size of one unit
whatever its depth (the idea of Flax's ``nn.scan``).  The computation is the
same as ``num_units`` :class:`ResidualUnit` layers; ``keras_identity.models.
transfer_weights`` moves weights between the two forms.
"""

import keras
from keras import ops

from keras_identity import _checks
from keras_identity import initializers
from keras_identity.layers import unit_loop
from keras_identity.layers.fused_batch_normalization import update_moving_statistics
from keras_identity.layers.residual_unit import BLOCKS
from keras_identity.layers.residual_unit import check_widths
from keras_identity.layers.residual_unit import set_weight_arguments
from keras_identity.layers.residual_unit import UNITS

_WEIGHT_KINDS = ("kernel", "bias", "gamma", "beta", "moving_mean", "moving_variance")


@keras.saving.register_keras_serializable(package="keras_identity")
class ResidualStack(keras.layers.Layer):
    """``num_units`` identical Residual Units (Eqns. 1-2, 4) in one loop.

    Every unit has an identity shortcut, stride 1 and as many input as output
    channels; each computes ``x_{l+1} = f(x_l + F(x_l))`` with F and f as in
    :class:`ResidualUnit` for the same ``unit`` and ``block`` (Fig. 4):
    ``full_preactivation`` is Eqn. (9), ``x_{l+1} = x_l + F(f^(x_l))``.  The
    weights of unit ``j`` are slice ``j`` of each stacked variable
    (``conv2_kernel`` has shape ``(num_units, 3, 3, d, d)``), so the layer's
    graph (and XLA program) does not grow with ``num_units``.

    In training, the loop's backward pass is written out
    (:mod:`keras_identity.layers.unit_loop`: a second loop from the last unit
    to the first applying the convolution, BN and ReLU gradient kernels to the
    tensors the forward loop stored) rather than left to TensorFlow's
    while-loop differentiation, which traces slower and runs a little slower.
    Each unit's BatchNormalization uses its batch moments and
    the moving statistics of all units are updated after the loop with the
    rule of ``keras.layers.BatchNormalization``
    (``moving = moving * momentum + batch * (1 - momentum)``); at inference
    the moving statistics are used.

    Args:
        filters: channels of the units' input and output (for bottlenecks,
            the expanded width 4d).
        num_units: number of units in the stack.
        block: ``"basic"``, ``"bottleneck"`` or ``"single"``.
        unit: the Fig. 4 ordering (as :class:`ResidualUnit`).
        first_unit: the 1-based index of the first unit in its stage; unit
            ``j`` of the stack corresponds to the unrolled layer
            ``stage{s}_unit{first_unit + j}`` (used by ``transfer_weights``).
        bottleneck_width: width d of a bottleneck's 1x1/3x3 layers
            (default ``filters // 4``).
        kernel_size: size of the spatial convolutions.
        use_bias: give the convolutions biases.
        bn_momentum, bn_epsilon: BatchNormalization settings.
        kernel_initializer: applied to each unit's kernel separately (so
            fan-in/fan-out are those of one unit); default He normal with
            fan-out, as :class:`ResidualUnit`.
        kernel_regularizer: applied to every stacked kernel (a sum over
            units, as for the unrolled layers with an additive penalty).
        recompute: what the backward pass computes again rather than keeps
            (see :mod:`~keras_identity.layers.unit_loop`): ``"none"`` (or
            ``False``) keeps every tensor the gradient reads; ``"bn_relu"``
            recomputes each BN-ReLU output from the BN's input, halving a
            pre-activation bottleneck stage's activation memory for one
            BN-ReLU pass per BN; ``"unit"`` (or ``True``) keeps only each
            unit's input and runs the unit forward again, one feature map
            per unit for one more forward pass of compute.
    """

    def __init__(self, filters, num_units, *, block="basic", unit="full_preactivation",
                 first_unit=2, bottleneck_width=None, kernel_size=3, use_bias=False,
                 bn_momentum=0.9, bn_epsilon=1e-5, kernel_initializer=None,
                 kernel_regularizer=None, recompute="none", **kwargs):
        super().__init__(**kwargs)
        self.filters = _checks.check_positive_int("filters", filters)
        self.num_units = _checks.check_positive_int("num_units", num_units)
        self.block = _checks.check_choice("block", block, BLOCKS)
        self.unit = _checks.check_choice("unit", unit, UNITS)
        self.first_unit = _checks.check_positive_int("first_unit", first_unit)
        self.bottleneck_width, self.kernel_size = check_widths(filters, bottleneck_width,
                                                               kernel_size)
        set_weight_arguments(self, use_bias=use_bias, bn_momentum=bn_momentum,
                             bn_epsilon=bn_epsilon, kernel_initializer=kernel_initializer,
                             kernel_regularizer=kernel_regularizer)
        self.recompute = unit_loop.check_recompute(recompute)
        if keras.backend.backend() != "tensorflow":
            raise ValueError(f"{type(self).__name__} needs the TensorFlow backend; the "
                             f"backend is {keras.backend.backend()!r}.")

    # ------------------------------------------------------------------ build
    def _weight_plan(self):
        """(kernel size, input channels, output channels) of each layer of F."""
        k, c, d = self.kernel_size, self.filters, self.bottleneck_width
        if self.block == "basic":
            return [(k, c, c), (k, c, c)]
        if self.block == "single":
            return [(k, c, c)]
        return [(1, c, d), (k, d, d), (1, d, c)]

    def _bn_channels(self):
        """Name and channels of each stacked BatchNormalization, in unit order."""
        plan = self._weight_plan()
        if self.unit == "full_preactivation":
            return [(f"bn{i + 1}", cin) for i, (_, cin, _) in enumerate(plan)]
        # After each convolution; for bn_after_addition the last one follows
        # the addition (it has the unit's output channels all the same).
        return [(f"bn{i + 1}", cout) for i, (_, _, cout) in enumerate(plan)]

    def _stacked_kernel(self, shape):
        """Initialises each unit's kernel as ``kernel_initializer`` would."""
        init = self.kernel_initializer

        def initializer(stacked_shape, dtype=None):
            n = stacked_shape[0]
            if isinstance(init, keras.initializers.VarianceScaling):
                # One draw for all units: with the units' kernels stacked on
                # the first receptive-field axis both fans grow n-fold, which
                # ``scale * n`` undoes (per-unit draws cost seconds at depth 1001).
                combined = keras.initializers.VarianceScaling(
                    scale=init.scale * n, mode=init.mode, distribution=init.distribution,
                    seed=init.seed)
                values = combined((n * shape[0],) + tuple(shape[1:]), dtype=dtype)
                return ops.reshape(values, stacked_shape)
            return ops.stack([init(shape, dtype=dtype) for _ in range(n)])
        return initializer

    def build(self, input_shape):
        shape = _checks.check_rank(type(self).__name__, input_shape, (4,),
                                   "(batch, height, width, channels)")
        if shape[-1] != self.filters:
            raise ValueError(
                f"{type(self).__name__} '{self.name}' needs inputs with filters="
                f"{self.filters} channels (its units keep the shape); got input_shape="
                f"{tuple(shape)}.")
        n = self.num_units
        self.conv_kernels, self.conv_biases = [], []
        for i, (k, cin, cout) in enumerate(self._weight_plan()):
            self.conv_kernels.append(self.add_weight(
                name=f"conv{i + 1}_kernel", shape=(n, k, k, cin, cout),
                initializer=self._stacked_kernel((k, k, cin, cout)),
                regularizer=self.kernel_regularizer))
            self.conv_biases.append(self.add_weight(
                name=f"conv{i + 1}_bias", shape=(n, cout), initializer="zeros")
                if self.use_bias else None)
        self.bn_weights = []
        for name, c in self._bn_channels():
            self.bn_weights.append((
                self.add_weight(name=f"{name}_gamma", shape=(n, c), initializer="ones",
                                autocast=False),
                self.add_weight(name=f"{name}_beta", shape=(n, c), initializer="zeros",
                                autocast=False),
                self.add_weight(name=f"{name}_moving_mean", shape=(n, c),
                                initializer="zeros", trainable=False, autocast=False),
                self.add_weight(name=f"{name}_moving_variance", shape=(n, c),
                                initializer="ones", trainable=False, autocast=False)))

    # ------------------------------------------------------------------- call
    def call(self, inputs, training=None):
        training = bool(training) and self.trainable
        dtype = self.compute_dtype
        kernels = [ops.cast(k, dtype) for k in self.conv_kernels]
        biases = [None if b is None else ops.cast(b, dtype) for b in self.conv_biases]
        bns = [tuple(ops.convert_to_tensor(w) for w in ws) for ws in self.bn_weights]
        program = unit_loop.unit_program(self.unit, len(kernels))
        if not training:
            return unit_loop.inference_loop(program, inputs, kernels, biases, bns,
                                            self.bn_epsilon)
        y, stats = unit_loop.train_loop(program, inputs, kernels, biases,
                                        [ws[:2] for ws in bns], self.bn_epsilon,
                                        recompute=self.recompute)
        for (_, _, moving_mean, moving_variance), moments in zip(self.bn_weights, stats):
            update_moving_statistics(moving_mean, moving_variance, moments, self.bn_momentum)
        return y

    def compute_output_shape(self, input_shape):
        return tuple(input_shape)

    # ---------------------------------------------------------- weight access
    def unit_weights(self, index):
        """The weights of unit ``index`` (0-based) as ``{name: numpy array}``.

        Names are those of the unrolled :class:`ResidualUnit`'s sub-layers
        without the unit prefix: ``"conv1/kernel"``, ``"bn1/gamma"``, ...
        """
        return {name: ops.convert_to_numpy(variable[index])
                for name, variable in self._named_variables().items()}

    def set_unit_weights(self, index, weights):
        """Sets unit ``index`` from ``{name: array}`` as :meth:`unit_weights`."""
        for name, variable in self._named_variables().items():
            if name not in weights:
                raise ValueError(f"Unit {index} of '{self.name}' needs weight {name!r}; "
                                 f"got {sorted(weights)}.")
            value = ops.convert_to_numpy(variable).copy()
            value[index] = weights[name]
            variable.assign(value)

    def _named_variables(self):
        named = {}
        for i, (kernel, bias) in enumerate(zip(self.conv_kernels, self.conv_biases)):
            named[f"conv{i + 1}/kernel"] = kernel
            if bias is not None:
                named[f"conv{i + 1}/bias"] = bias
        for (name, _), ws in zip(self._bn_channels(), self.bn_weights):
            for kind, w in zip(_WEIGHT_KINDS[2:], ws):
                named[f"{name}/{kind}"] = w
        return named

    def get_config(self):
        config = super().get_config()
        config.update(
            filters=self.filters, num_units=self.num_units, block=self.block,
            unit=self.unit, first_unit=self.first_unit,
            bottleneck_width=self.bottleneck_width, kernel_size=self.kernel_size,
            use_bias=self.use_bias, bn_momentum=self.bn_momentum, bn_epsilon=self.bn_epsilon,
            recompute=self.recompute,
            kernel_initializer=(None if self._kernel_initializer_arg is None
                                else initializers.serialize(self.kernel_initializer)),
            kernel_regularizer=keras.regularizers.serialize(self.kernel_regularizer)
            if self.kernel_regularizer is not None else None)
        return config

"""A run of identical Residual Units computed by one loop over stacked weights.

A stage of a deep ResNet is one unit that changes shape followed by ``n - 1``
units of the same shape (He et al. 2016, Eqn. 4: ``x_L = x_l + sum F(x_i)``).
Built as ``n - 1`` layers, the traced graph, the XLA program and the time to
build, trace and compile all grow with depth: ResNet-1001 has 333 units.
:class:`ResidualStack` holds the weights of those units stacked along a
leading axis of length ``num_units`` and applies them with a single
``tf.while_loop``, so the graph of a stage has the size of one unit
whatever its depth (the idea of Flax's ``nn.scan``).  Each unit runs the
same definitions as a :class:`ResidualUnit` (its ordering's program, its
block's weight layers, its shortcut's addition), so the computation is that
of ``num_units`` unrolled units; ``keras_identity.models.transfer_weights``
moves weights between the two forms.
"""

import keras
import numpy as np
from keras import ops

from keras_identity import _checks
from keras_identity.layers.fused_batch_normalization import update_moving_statistics
from keras_identity.layers.residual import blocks
from keras_identity.layers.residual import orderings
from keras_identity.layers.residual import shortcuts
from keras_identity.layers.residual.unit import set_weight_arguments
from keras_identity.layers.residual.unit import weight_config

_BN_KINDS = ("gamma", "beta", "moving_mean", "moving_variance")
RECOMPUTE = ("none", "bn_relu", "unit")


def check_recompute(recompute):
    """``recompute`` if it is one of :data:`RECOMPUTE`.

    Raises:
        ValueError: for any other value.
    """
    return _checks.check_choice("recompute", recompute, RECOMPUTE)


def _loop():
    """The loop over units for the backend: TensorFlow's ``while_loop`` with
    the written-out gradient, or JAX's ``lax.scan`` with rematerialisation."""
    backend = keras.backend.backend()
    if backend == "tensorflow":
        from keras_identity.layers.residual import _tf_loop

        return _tf_loop
    if backend == "jax":
        from keras_identity.layers.residual import _jax_loop

        return _jax_loop
    raise ValueError(f"ResidualStack's loop runs on the TensorFlow and JAX backends; the "
                     f"backend is {backend!r} (build the model with stage_mode='unrolled').")


@keras.saving.register_keras_serializable(package="keras_identity")
class ResidualStack(keras.layers.Layer):
    """``num_units`` identical Residual Units (Eqns. 1-2, 4) in one loop.

    Every unit has stride 1 and as many input as output channels; each computes
    ``x_{l+1} = f(h(x_l) + F(x_l))`` with F, f and h as in :class:`ResidualUnit` for the
    same ``unit``, ``block`` and ``shortcut`` (Figs. 2 and 4): ``full_preactivation`` with
    the identity is Eqn. (9), ``x_{l+1} = x_l + F(f^(x_l))``.  The weights of unit ``j`` are
    slice ``j`` of each stacked variable (``conv2_kernel`` has shape
    ``(num_units, 3, 3, d, d)``, a gate's ``gate_kernel`` ``(num_units, 1, 1, c, c)``), so
    the layer's graph (and XLA program) does not grow with ``num_units``.

    On TensorFlow the backward pass in training is written out (:mod:`._tf_loop`: a second
    loop, last unit to first), rather than left to TensorFlow's while-loop differentiation,
    which traces slower and runs a little slower; on JAX, JAX differentiates the scan and
    ``recompute`` selects a ``jax.checkpoint`` policy (:mod:`._jax_loop`).  Each unit's BN
    uses its batch moments; the moving statistics of all units are updated after the loop
    with ``keras.layers.BatchNormalization``'s rule
    (``moving = moving * momentum + batch * (1 - momentum)``), and used at inference.

    Args:
        filters: channels of the units' input and output (for bottlenecks, the expanded
            width 4d).
        num_units: number of units in the stack.
        block: ``"basic"``, ``"bottleneck"`` or ``"single"``.
        unit: the Fig. 4 ordering (as :class:`ResidualUnit`).
        shortcut: the Fig. 2 shortcut (as :class:`ResidualUnit`), with its arguments
            ``shortcut_scale``, ``scale_residual``, ``gate_bias_init``,
            ``shortcut_dropout_rate``.
        stochastic_depth_rates: one drop rate per unit (Huang et al. 2016), or ``None``.
        first_unit: the 1-based index of the first unit in its stage; unit ``j`` of the
            stack corresponds to the unrolled layer ``stage{s}_unit{first_unit + j}`` (used
            by ``transfer_weights``).
        bottleneck_width: width d of a bottleneck's 1x1/3x3 layers (default
            ``filters // 4``).
        kernel_size: size of the spatial convolutions.
        use_bias: give the convolutions biases.
        bn_momentum, bn_epsilon: BatchNormalization settings.
        kernel_initializer: applied to each unit's kernel separately (so fan-in/fan-out are
            those of one unit); default He normal with fan-out, as :class:`ResidualUnit`.
        kernel_regularizer: applied to every stacked kernel (a sum over units, as for the
            unrolled layers with an additive penalty).
        recompute: what the backward pass computes again rather than keeps: ``"none"``,
            nothing; ``"bn_relu"``, each BN-ReLU output from the BN's input (half a
            pre-activation bottleneck stage's activation memory, for one BN-ReLU pass per
            BN); ``"unit"``, all but each unit's input, running the unit forward again (one
            feature map per unit, for one more forward pass of compute).
        seed: seed of the random masks; unit ``j`` draws what an unrolled unit seeded
            ``seed + j`` draws.
    """

    def __init__(self, filters, num_units, *, block="basic", unit="full_preactivation",
                 shortcut="identity", shortcut_scale=None, scale_residual=None,
                 gate_bias_init=None, shortcut_dropout_rate=None,
                 stochastic_depth_rates=None, first_unit=2, bottleneck_width=None,
                 kernel_size=3, use_bias=False, bn_momentum=0.9, bn_epsilon=1e-5,
                 kernel_initializer=None, kernel_regularizer=None, recompute="none",
                 seed=None, **kwargs):
        super().__init__(**kwargs)
        self.filters = _checks.check_positive_int("filters", filters)
        self.num_units = _checks.check_positive_int("num_units", num_units)
        self.block = _checks.check_choice("block", block, blocks.BLOCKS)
        self.unit = _checks.check_choice("unit", unit, orderings.UNITS)
        shortcuts.set_arguments(
            self, shortcut, shortcut_scale=shortcut_scale, scale_residual=scale_residual,
            gate_bias_init=gate_bias_init, shortcut_dropout_rate=shortcut_dropout_rate)
        self.stochastic_depth_rates = None
        if stochastic_depth_rates is not None:
            rates = [_checks.check_range("stochastic_depth_rates", r, 0.0, 1.0,
                                         high_inclusive=False)
                     for r in stochastic_depth_rates]
            if len(rates) != self.num_units:
                raise ValueError(f"stochastic_depth_rates has {len(rates)} rates; expected "
                                 f"one per unit, num_units={self.num_units}.")
            self.stochastic_depth_rates = rates if any(rates) else None
        self.first_unit = _checks.check_positive_int("first_unit", first_unit)
        self.bottleneck_width, self.kernel_size = blocks.check_widths(
            filters, bottleneck_width, kernel_size)
        set_weight_arguments(self, use_bias=use_bias, bn_momentum=bn_momentum,
                             bn_epsilon=bn_epsilon, kernel_initializer=kernel_initializer,
                             kernel_regularizer=kernel_regularizer)
        self.recompute = check_recompute(recompute)
        self.seed = seed
        needs_rng = self.stochastic_depth_rates is not None or self._shortcut.random
        self.seed_generator = keras.random.SeedGenerator(seed) if needs_rng else None
        self._program = orderings.unit_program(self.unit, blocks.LAYERS_PER_UNIT[self.block])
        _loop()

    # ------------------------------------------------------------------ build
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

    def _add_conv(self, name, kernel_size, cin, cout, use_bias=None, **kwargs):
        n = self.num_units
        kernel = self.add_weight(
            name=f"{name}_kernel", shape=(n, kernel_size, kernel_size, cin, cout),
            initializer=self._stacked_kernel((kernel_size, kernel_size, cin, cout)),
            regularizer=self.kernel_regularizer, **kwargs)
        use_bias = self.use_bias if use_bias is None else use_bias
        bias = self.add_weight(name=f"{name}_bias", shape=(n, cout), initializer="zeros") \
            if use_bias else None
        return kernel, bias

    def _add_bn(self, name, channels):
        n = self.num_units
        return tuple(self.add_weight(
            name=f"{name}_{kind}", shape=(n, channels),
            initializer="ones" if kind in ("gamma", "moving_variance") else "zeros",
            trainable=kind in ("gamma", "beta"), autocast=False) for kind in _BN_KINDS)

    def build(self, input_shape):
        shape = _checks.check_rank(type(self).__name__, input_shape, (4,),
                                   "(batch, height, width, channels)")
        if shape[-1] != self.filters:
            raise ValueError(
                f"{type(self).__name__} '{self.name}' needs inputs with filters="
                f"{self.filters} channels (its units keep the shape); got input_shape="
                f"{tuple(shape)}.")
        c = self.filters
        layers = blocks.weight_layers(self.block, c, c, bottleneck_width=self.bottleneck_width,
                                      kernel_size=self.kernel_size)
        self.conv_kernels, self.conv_biases = [], []
        for i, layer in enumerate(layers):
            kernel, bias = self._add_conv(f"conv{i + 1}", layer.kernel_size,
                                          layer.in_channels, layer.out_channels)
            self.conv_kernels.append(kernel)
            self.conv_biases.append(bias)
        channels = orderings.bn_channels(self._program, layers, c)
        self._bn_names = [f"bn{i + 1}" for i in sorted(channels)]
        self.bn_weights = [self._add_bn(f"bn{i + 1}", channels[i]) for i in sorted(channels)]
        # The shortcut's own weights (Fig. 2(c)-(e)), after those of F.
        self.shortcut_weights = self._shortcut.stack_weights(
            self._add_conv, self._add_bn, self.add_weight, c,
            preactivation=self.unit in orderings.PREACTIVATION_UNITS)

    # ------------------------------------------------------------------- call
    def _addition(self, loop, training):
        """The units' addition for the loop (``None``: ``x + F``)."""
        shortcut, rates = self._shortcut, self.stochastic_depth_rates
        if isinstance(shortcut, shortcuts.Identity) and rates is None:
            return None
        if shortcut.gated and rates is None and loop.WRITES_GATE_GRADIENT:
            return loop.GateAddition(shortcut, *(ops.convert_to_tensor(
                self.shortcut_weights[f"gate/{kind}"]) for kind in ("kernel", "bias")))
        dtype = self.compute_dtype
        # In training the shortcut's BN uses batch moments: no moving statistics.
        names = [name for name in self.shortcut_weights
                 if not (training and name.startswith("shortcut_bn/moving"))]
        weights = [ops.cast(self.shortcut_weights[n], dtype) if n == "shortcut_conv/kernel"
                   or n == "shortcut_conv/bias" else ops.convert_to_tensor(
                       self.shortcut_weights[n]) for n in names]
        seed = self.seed_generator.next() if training and self.seed_generator else None
        rate_tensor = None if rates is None else ops.convert_to_tensor(
            np.asarray(rates, "float32"))
        has_bn = "shortcut_bn/gamma" in self.shortcut_weights
        epsilon = self.bn_epsilon

        def apply(j, unit_weights, x, f, training):
            w = dict(zip(names, unit_weights))
            moments = []
            project = shortcut.unit_project(w, loop.conv, epsilon, training, moments)
            gate = shortcut.unit_gate(w, loop.conv)
            uniform = None
            if seed is not None:
                uniform = shortcuts.seeded_uniform(
                    seed + ops.cast(ops.stack([j, 0]), seed.dtype))
            y = shortcuts.add(shortcut, x, f, training=training, project=project, gate=gate,
                              uniform=uniform,
                              stochastic_depth_rate=None if rates is None else rate_tensor[j])
            return y, moments

        return shortcuts.LoopAddition(apply, weights, num_moments=int(training and has_bn),
                                      needs_values=shortcut.needs_values)

    def call(self, inputs, training=None):
        loop = _loop()
        training = bool(training) and self.trainable
        dtype = self.compute_dtype
        kernels = [ops.cast(k, dtype) for k in self.conv_kernels]
        biases = [None if b is None else ops.cast(b, dtype) for b in self.conv_biases]
        bns = [tuple(ops.convert_to_tensor(w) for w in ws) for ws in self.bn_weights]
        addition = self._addition(loop, training)
        if not training:
            return loop.inference_loop(self._program, inputs, kernels, biases, bns,
                                       self.bn_epsilon, addition)
        y, stats = loop.train_loop(self._program, inputs, kernels, biases,
                                   [ws[:2] for ws in bns], self.bn_epsilon,
                                   recompute=self.recompute, addition=addition)
        moving = [ws[2:] for ws in self.bn_weights]
        if addition is not None and addition.num_moments:
            moving.append((self.shortcut_weights["shortcut_bn/moving_mean"],
                           self.shortcut_weights["shortcut_bn/moving_variance"]))
        for (moving_mean, moving_variance), moments in zip(moving, stats):
            update_moving_statistics(moving_mean, moving_variance, moments, self.bn_momentum)
        return y

    def compute_output_shape(self, input_shape):
        return tuple(input_shape)

    # ---------------------------------------------------------- weight access
    def unit_weights(self, index):
        """The weights of unit ``index`` (0-based) as ``{name: numpy array}``.

        Names are those of the unrolled :class:`ResidualUnit`'s sub-layers
        without the unit prefix: ``"conv1/kernel"``, ``"bn1/gamma"``,
        ``"gate/bias"``, ...
        """
        return {name: ops.convert_to_numpy(variable[index])
                for name, variable in self.stacked_variables().items()}

    def set_unit_weights(self, index, weights):
        """Sets unit ``index`` from ``{name: array}`` as :meth:`unit_weights`."""
        for name, variable in self.stacked_variables().items():
            if name not in weights:
                raise ValueError(f"Unit {index} of '{self.name}' needs weight {name!r}; "
                                 f"got {sorted(weights)}.")
            value = ops.convert_to_numpy(variable).copy()
            value[index] = weights[name]
            variable.assign(value)

    def stacked_variables(self):
        """``{name: variable}`` of every stacked weight, names as in
        :meth:`unit_weights` (slice ``j`` of a variable is unit ``j``'s)."""
        named = {}
        for i, (kernel, bias) in enumerate(zip(self.conv_kernels, self.conv_biases)):
            named[f"conv{i + 1}/kernel"] = kernel
            if bias is not None:
                named[f"conv{i + 1}/bias"] = bias
        for name, ws in zip(self._bn_names, self.bn_weights):
            for kind, w in zip(_BN_KINDS, ws):
                named[f"{name}/{kind}"] = w
        named.update(self.shortcut_weights)
        return named

    def get_config(self):
        config = super().get_config()
        config.update(
            filters=self.filters, num_units=self.num_units, block=self.block,
            unit=self.unit, shortcut=self.shortcut, **self._shortcut.config(),
            stochastic_depth_rates=self.stochastic_depth_rates, first_unit=self.first_unit,
            bottleneck_width=self.bottleneck_width, kernel_size=self.kernel_size,
            recompute=self.recompute, seed=self.seed, **weight_config(self))
        return config

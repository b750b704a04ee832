"""Fig. 2 (a)-(f): the shortcut h and how Eqn. (1) adds it to F; options A and B.

Each shortcut of Fig. 2 / Table 1 is one class below whose docstring gives its equation
and which makes its weights for both forms of a unit (the unrolled
:class:`ResidualUnit`, the stacked units of a :class:`ResidualStack`); :func:`add` is
Eqn. (1)'s addition ``h(x_l) + F(x_l)`` of one unit, written once for both forms, each
supplying its random numbers (``uniform``).

==================== ============ ======================================== ``shortcut``
figure       y = h(x) + F(x) becomes ==================== ============
======================================== identity             Fig. 2(a)    ``x + F``
constant_scaling     Fig. 2(b)    ``lambda x + F`` (or ``+ (1 - lambda) F``)
exclusive_gating     Fig. 2(c)    ``(1 - g(x)) x + g(x) F`` shortcut_only_gating Fig.
2(d)    ``(1 - g(x)) x + F`` conv1x1              Fig. 2(e)    ``W_s x + F`` dropout
Fig. 2(f)    ``m * x + F``, m ~ Bernoulli(1 - rate) ==================== ============
========================================

When a unit changes shape, ``x`` is first matched to F's shape by option A
(:class:`ZeroPadShortcut`, no parameters) or option B (a 1x1 projection) of He et al.
(2015), Sec. 3.3; ``dimension_shortcut`` picks one.
"""

import keras
from keras import ops

from keras_identity import _checks
from keras_identity.layers.fused_batch_normalization import fused_batch_norm
from keras_identity.layers.residual import _random

DIMENSION_SHORTCUTS = ("A", "B")
# Arguments of the shortcut variants and their values when not given.
DEFAULTS = {"shortcut_scale": 0.5, "scale_residual": False, "gate_bias_init": 0.0,
            "shortcut_dropout_rate": 0.5}
# The random draws of one unit per call, each with its own index: the
# stochastic-depth mask and the dropout shortcut's mask.
STOCHASTIC_DEPTH_DRAW, DROPOUT_DRAW = 0, 1
MAX_DRAWS = 2


class Shortcut:
    """Base of the Fig. 2 shortcuts: ``y = h(x) + F(x)``.

    Class attributes: ``name`` (the ``shortcut=`` value), ``figure``,
    ``parameters`` (the arguments that apply to it), ``projects`` (a 1x1
    convolution on every unit), ``gated`` (a gate ``g(x) = sigmoid(W_g x +
    b_g)``, a 1x1 convolution with bias kept in float32).
    """

    name = None
    figure = None
    parameters = ()
    projects = False
    gated = False

    def __init__(self, **values):
        unknown = sorted(set(values) - set(self.parameters))
        if unknown:
            takes = ", ".join(self.parameters) or "no arguments"
            raise ValueError(f"{type(self).__name__} ({self.figure}) takes {takes}; got "
                             f"{', '.join(unknown)}.")
        for parameter in self.parameters:
            setattr(self, parameter, values.get(parameter, DEFAULTS[parameter]))

    def __repr__(self):
        values = ", ".join(f"{k}={v!r}" for k, v in self.config().items())
        return f"{type(self).__name__}({values})"

    @property
    def has_shortcut(self):
        """False for a shortcut that is absent (lambda = 0): a plain unit."""
        return True

    @property
    def random(self):
        """Whether training draws random numbers (dropout masks)."""
        return False

    @property
    def needs_values(self):
        """Whether the addition's gradient reads ``x`` and F's output (it is
        non-linear in them or has weights); the looped form keeps them."""
        return self.projects or self.gated

    def config(self):
        """The values of :attr:`parameters`."""
        return {parameter: getattr(self, parameter) for parameter in self.parameters}

    def drop(self, h, training, uniform):
        """The shortcut's random mask (only Fig. 2(f) has one)."""
        return h

    # ------------------------------------------- weights, in both forms of a unit
    def unit_layers(self, make_conv, make_bn, filters, strides, *, changes_shape,
                    dimension_shortcut, preactivation, name, dtype):
        """``{"projection", "projection_bn", "zero_pad", "gate"}``: the
        sub-layers of ``h`` in one :class:`ResidualUnit` (``None`` where
        absent), made by the unit's ``make_conv(filters, kernel_size, strides,
        name, **kwargs)`` and ``make_bn(name)``: a 1x1 projection (and BN in
        orderings (a)-(c)) for Fig. 2(e) and option B, else option A."""
        layers = dict.fromkeys(("projection", "projection_bn", "zero_pad", "gate"))
        if not self.has_shortcut:
            return layers
        if self.projects or (changes_shape and dimension_shortcut == "B"):
            layers["projection"] = make_conv(filters, 1, strides, "shortcut_conv")
            if not preactivation:
                layers["projection_bn"] = make_bn("shortcut_bn")
        elif changes_shape:
            layers["zero_pad"] = ZeroPadShortcut(filters, strides, name=f"{name}_shortcut_pad",
                                                 dtype=dtype)
        return layers

    def stack_weights(self, add_conv, add_bn, add_weight, channels, preactivation):
        """``{name: variable}``: the weights of ``h`` in a :class:`ResidualStack`,
        stacked over its units and named as the unit's (``"gate/kernel"``),
        made by the stack's ``add_conv``, ``add_bn`` and ``add_weight``."""
        weights = {}
        if self.projects:
            kernel, bias = add_conv("shortcut_conv", 1, channels, channels)
            weights["shortcut_conv/kernel"] = kernel
            if bias is not None:
                weights["shortcut_conv/bias"] = bias
            if not preactivation:
                kinds = ("gamma", "beta", "moving_mean", "moving_variance")
                for kind, w in zip(kinds, add_bn("shortcut_bn", channels)):
                    weights[f"shortcut_bn/{kind}"] = w
        return weights

    def unit_project(self, w, conv, epsilon, training, moments):
        """Fig. 2(e)'s ``W_s x`` (and BN, whose batch moments go to ``moments``)
        of one looped unit with its slices ``w`` of :meth:`stack_weights`."""
        if not self.projects:
            return None

        def project(t):
            h = conv(t, w["shortcut_conv/kernel"])
            if "shortcut_conv/bias" in w:
                h = h + w["shortcut_conv/bias"]
            if "shortcut_bn/gamma" in w:
                h, m = fused_batch_norm(h, w["shortcut_bn/gamma"], w["shortcut_bn/beta"],
                                        w.get("shortcut_bn/moving_mean"),
                                        w.get("shortcut_bn/moving_variance"), epsilon, training)
                if training:
                    moments.append(m)
            return h
        return project

    def unit_gate(self, w, conv):
        """``g(x)`` of one looped unit (gated shortcuts), else ``None``."""
        return None

    def combine(self, h, f, g=None):
        """Eqn. (1)'s sum of the shortcut ``h`` and the residual ``f``."""
        return h + f


class Identity(Shortcut):
    """Fig. 2(a), the identity shortcut: ``h(x) = x``, ``x_{l+1} = x_l + F(x_l)``
    (Eqns. 3-5: signal and gradient pass unchanged between any two units)."""

    name, figure = "identity", "Fig. 2(a)"


class ConstantScaling(Shortcut):
    """Fig. 2(b), constant scaling: ``h(x) = lambda x``, Eqns. (6)-(8).

    ``y = lambda x + F``; with ``scale_residual=True`` also ``F`` is scaled,
    ``y = lambda x + (1 - lambda) F`` (Table 1's "frozen gating").  Over k
    units the shortcut path multiplies the signal and the gradient by
    ``lambda^k`` (Eqn. 8).  ``shortcut_scale = 0`` removes the shortcut: a
    plain unit.
    """

    name, figure = "constant_scaling", "Fig. 2(b)"
    parameters = ("shortcut_scale", "scale_residual")

    def __init__(self, **values):
        super().__init__(**values)
        self.shortcut_scale = _checks.check_range("shortcut_scale", self.shortcut_scale,
                                                  low=0.0)
        self.scale_residual = bool(self.scale_residual)
        if self.scale_residual and self.shortcut_scale > 1.0:
            raise ValueError(f"shortcut_scale={self.shortcut_scale!r} is not valid with "
                             f"scale_residual=True; expected a number in [0, 1] so that "
                             f"F is scaled by 1 - shortcut_scale >= 0.")

    @property
    def has_shortcut(self):
        return self.shortcut_scale != 0.0

    def combine(self, h, f, g=None):
        lam = self.shortcut_scale
        f_scale = 1.0 - lam if self.scale_residual else 1.0
        return ops.cast(lam, h.dtype) * h + ops.cast(f_scale, f.dtype) * f


class _Gating(Shortcut):
    parameters = ("gate_bias_init",)
    gated = True

    def __init__(self, **values):
        super().__init__(**values)
        self.gate_bias_init = _checks.check_range("gate_bias_init", self.gate_bias_init)

    def unit_layers(self, make_conv, make_bn, filters, strides, **kwargs):
        # g(x) = sigmoid(W_g x + b_g): a 1x1 convolution kept in float32.
        layers = super().unit_layers(make_conv, make_bn, filters, strides, **kwargs)
        layers["gate"] = make_conv(
            filters, 1, strides, "gate", dtype="float32", use_bias=True, activation="sigmoid",
            bias_initializer=keras.initializers.Constant(self.gate_bias_init))
        return layers

    def stack_weights(self, add_conv, add_bn, add_weight, channels, preactivation):
        weights = super().stack_weights(add_conv, add_bn, add_weight, channels, preactivation)
        kernel, _ = add_conv("gate", 1, channels, channels, use_bias=False, autocast=False,
                             dtype="float32")
        weights["gate/kernel"] = kernel
        weights["gate/bias"] = add_weight(
            name="gate_bias", shape=(kernel.shape[0], channels), autocast=False,
            dtype="float32", initializer=keras.initializers.Constant(self.gate_bias_init))
        return weights

    @staticmethod
    def gate(x, kernel, bias, conv):
        """``g(x) = sigmoid(W_g x + b_g)`` in float32 with one unit's weights."""
        return ops.sigmoid(conv(ops.cast(x, "float32"), kernel) + bias)

    def unit_gate(self, w, conv):
        return lambda t: self.gate(t, w["gate/kernel"], w["gate/bias"], conv)

    def combine(self, h, f, g=None):
        # In float32: 1 - g(x) close to 1 is not representable in bfloat16.
        y = self.gated_sum(ops.cast(h, "float32"), ops.cast(f, "float32"), g)
        return ops.cast(y, f.dtype)

    def gated_sum(self, h, f, g):
        """The figure's sum of ``h`` and ``f`` with the gate ``g`` (float32)."""
        raise NotImplementedError

    def gated_sum_vjp(self, h, f, g, dy):
        """``(dh, df, dg)``: :meth:`gated_sum`'s gradients for ``dy`` (the
        looped stage's written-out backward pass uses them)."""
        raise NotImplementedError


class ExclusiveGating(_Gating):
    """Fig. 2(c), exclusive gating: ``y = (1 - g(x)) x + g(x) F(x)``.

    ``g(x) = sigmoid(W_g x + b_g)`` is a 1x1 convolution with bias, its bias
    starting at ``gate_bias_init`` (Table 1: b_g = -6 trains best).  The
    gate, as in highway networks, decides per element between the shortcut
    and F.
    """

    name, figure = "exclusive_gating", "Fig. 2(c)"

    def gated_sum(self, h, f, g):
        return (1.0 - g) * h + g * f

    def gated_sum_vjp(self, h, f, g, dy):
        df = g * dy
        return dy - df, df, dy * (f - h)


class ShortcutOnlyGating(_Gating):
    """Fig. 2(d), shortcut-only gating: ``y = (1 - g(x)) x + F(x)``, with the
    gate ``g(x) = sigmoid(W_g x + b_g)`` of Fig. 2(c) on the shortcut only."""

    name, figure = "shortcut_only_gating", "Fig. 2(d)"

    def gated_sum(self, h, f, g):
        return (1.0 - g) * h + f

    def gated_sum_vjp(self, h, f, g, dy):
        return dy - g * dy, dy, -dy * h


class Conv1x1(Shortcut):
    """Fig. 2(e), 1x1 convolution shortcut: ``h(x) = W_s x`` on every unit
    (option C of He et al. 2015), followed by BN in the post-activation
    orderings (a)-(c)."""

    name, figure = "conv1x1", "Fig. 2(e)"
    projects = True


class Dropout(Shortcut):
    """Fig. 2(f), dropout shortcut: ``y = m * x + F`` with ``m ~ Bernoulli(1 -
    rate)`` per element, not rescaled, so that it imposes a scale whose
    expectation is ``1 - rate`` (``shortcut_dropout_rate``); at inference
    ``y = (1 - rate) x + F``."""

    name, figure = "dropout", "Fig. 2(f)"
    parameters = ("shortcut_dropout_rate",)

    def __init__(self, **values):
        super().__init__(**values)
        self.shortcut_dropout_rate = _checks.check_range(
            "shortcut_dropout_rate", self.shortcut_dropout_rate, 0.0, 1.0,
            high_inclusive=False)

    @property
    def random(self):
        return self.shortcut_dropout_rate > 0.0

    def drop(self, h, training, uniform):
        rate = self.shortcut_dropout_rate
        if rate == 0.0:
            return h
        if not training:
            return h * ops.cast(1.0 - rate, h.dtype)
        return h * ops.cast(uniform(ops.shape(h), h.dtype, DROPOUT_DRAW) >= rate, h.dtype)


_CLASSES = (Identity, ConstantScaling, ExclusiveGating, ShortcutOnlyGating, Conv1x1, Dropout)
SHORTCUTS = tuple(cls.name for cls in _CLASSES)
GATED_SHORTCUTS = tuple(cls.name for cls in _CLASSES if cls.gated)
PARAMETERS = tuple(DEFAULTS)


def applies_to(parameter):
    """The shortcuts that take ``parameter``."""
    return tuple(cls.name for cls in _CLASSES if parameter in cls.parameters)


def get(shortcut, **values):
    """The :class:`Shortcut` named ``shortcut`` with its parameters.

    ``shortcut`` is a name of :data:`SHORTCUTS` (the shorthand, with its
    arguments in ``values``) or a :class:`Shortcut` object such as
    ``ExclusiveGating(gate_bias_init=-6.0)``, which carries its own.
    ``values`` holds the shortcut arguments the caller was given; ``None``
    means not given.

    Raises:
        ValueError: for an unknown shortcut, a bad value, an argument that
            does not apply to ``shortcut`` (naming the shortcuts it needs), or
            one given beside a :class:`Shortcut` object.
    """
    if isinstance(shortcut, Shortcut):
        for parameter, value in values.items():
            if value is not None:
                raise ValueError(f"{parameter}={value!r} is given beside shortcut={shortcut!r}, "
                                 f"which sets its own arguments; give it to the shortcut.")
        return shortcut
    _checks.check_choice("shortcut", shortcut, SHORTCUTS)
    cls = _CLASSES[SHORTCUTS.index(shortcut)]
    for parameter, value in values.items():
        if parameter not in DEFAULTS:
            raise TypeError(f"unknown shortcut argument {parameter!r}")
        if value is not None and parameter not in cls.parameters:
            needs = " or ".join(repr(s) for s in applies_to(parameter))
            raise ValueError(f"{parameter}={value!r} does not apply to shortcut={shortcut!r}; "
                             f"it is an argument of shortcut={needs}.")
    return cls(**{k: v for k, v in values.items() if v is not None})


def set_arguments(layer, shortcut, **values):
    """Validates a layer's ``shortcut`` and its arguments (:func:`get`) and sets
    ``layer.shortcut`` (its name), ``layer._shortcut`` (the :class:`Shortcut`) and one
    attribute per argument of :data:`DEFAULTS` (``None`` where it does not
    apply)."""
    layer._shortcut = get(shortcut, **values)
    layer.shortcut = layer._shortcut.name
    for parameter in PARAMETERS:
        setattr(layer, parameter, getattr(layer._shortcut, parameter, None))


def add(shortcut, x, f, *, training, project=None, gate=None, uniform=None,
        stochastic_depth_rate=None):
    """Eqn. (1)'s ``h(x_l) + F(x_l)`` of one unit with ``shortcut``.

    Args:
        shortcut: a :class:`Shortcut`.
        x: what the shortcut reads (the unit input, or its shared
            pre-activation).
        f: the residual branch's output F.
        training: whether random masks apply.
        project: callable matching ``x`` to F (option A or B, or Fig. 2(e)'s
            1x1 convolution); ``None`` for the plain identity.
        gate: callable ``g(x)`` of the gated shortcuts (float32).
        uniform: callable ``(shape, dtype, draw)`` drawing uniform numbers in
            [0, 1) for draw ``draw`` of the call (:func:`seeded_uniform`).
        stochastic_depth_rate: drop rate of F (Huang et al. 2016; per
            example, F rescaled by ``1 / (1 - rate)`` when kept), or ``None``.
    """
    if training and stochastic_depth_rate is not None:
        batch = ops.shape(f)[0]
        draw = uniform((batch, 1, 1, 1), f.dtype, STOCHASTIC_DEPTH_DRAW)
        keep = draw >= ops.cast(stochastic_depth_rate, f.dtype)
        f = f * ops.cast(keep, f.dtype) / ops.cast(1.0 - stochastic_depth_rate, f.dtype)
    if not shortcut.has_shortcut:
        return f
    h = x if project is None else project(x)
    h = shortcut.drop(h, training, uniform)
    return shortcut.combine(h, f, gate(x) if shortcut.gated else None)


def seeded_uniform(seed):
    """A ``uniform`` for :func:`add` drawing from the seed state ``seed`` of
    one call, a ``(2,)`` integer tensor ``(s, t)`` as a
    ``keras.random.SeedGenerator`` gives (``t`` counts calls): draw k uses
    ``(s, MAX_DRAWS * t + k)``, so no two draws of a generator repeat and a
    mask does not depend on which other masks a unit draws."""

    def uniform(shape, dtype, draw):
        state = ops.stack([seed[0], seed[1] * MAX_DRAWS + draw])
        return _random.uniform(shape, state, dtype)
    return uniform


# ----------------------------------------------------------------- option A
def _pair(name, value):
    pair = (value, value) if isinstance(value, int) else tuple(value)
    if len(pair) != 2 or not all(isinstance(v, int) and not isinstance(v, bool) and v >= 1
                                 for v in pair):
        raise ValueError(f"{name}={value!r} is not valid; expected a positive integer "
                         f"or a pair of positive integers.")
    return pair


@keras.saving.register_keras_serializable(package="keras_identity")
class ZeroPadShortcut(keras.layers.Layer):
    """Shortcut option A of He et al. (2015), Sec. 3.3 (lecture notes, p. 11).

    When a residual unit halves the feature map and widens it from C to C'
    channels, option A keeps the shortcut an identity: it reads one pixel in
    every ``strides`` (the same grid a strided 1x1 convolution reads: pixels
    0, s, 2s, ...) and appends C' - C channels of zeros.  It has no
    parameters, so a ResNet with option A has exactly the parameters of its
    plain counterpart.

    Args:
        filters: C', the number of output channels; must be >= the input's.
        strides: subsampling step, an int or a pair (rows, columns).
    """

    def __init__(self, filters, strides=1, **kwargs):
        super().__init__(**kwargs)
        self.filters = _checks.check_positive_int("filters", filters)
        self.strides = _pair("strides", strides)

    def build(self, input_shape):
        shape = _checks.check_rank(type(self).__name__, input_shape, (4,),
                                   "(batch, height, width, channels)")
        if shape[-1] > self.filters:
            raise ValueError(
                f"{type(self).__name__} (option A) can only add channels: filters="
                f"{self.filters} is smaller than the input's {shape[-1]} channels; use "
                f"dimension_shortcut='B' (projection) to reduce channels.")

    def call(self, inputs):
        sh, sw = self.strides
        x = inputs
        if sh > 1 or sw > 1:
            # A 1x1 pooling window is the strided slice x[:, ::sh, ::sw]; its
            # output size is written as a strided convolution's, so the two
            # branches agree on symbolic sizes too (JAX export of H, W = None).
            x = ops.average_pool(x, 1, (sh, sw), "valid")
        extra = self.filters - x.shape[-1]
        if extra:
            x = ops.pad(x, [[0, 0], [0, 0], [0, 0], [0, extra]])
        return x

    def compute_output_shape(self, input_shape):
        b, h, w, _ = input_shape
        sh, sw = self.strides
        return (b, None if h is None else -(-h // sh), None if w is None else -(-w // sw),
                self.filters)

    def get_config(self):
        config = super().get_config()
        config.update(filters=self.filters, strides=self.strides)
        return config


class LoopAddition:
    """A looped unit's addition (the ``add`` step) other than ``x + F``.

    ``apply(j, weights, x, f, training)`` returns ``(y, moments)`` for unit
    ``j`` with its slices ``weights`` of the stacked ``weights``; ``moments``
    lists the batch moments of its BNs in training (``num_moments`` of them).
    ``needs_values``: the gradient reads ``x`` and ``f``.  Its gradient is
    taken by automatic differentiation of the step (both loops, TensorFlow
    and JAX, run it; only TensorFlow's gated sums have a written gradient).
    """

    written = False
    keeps_gate = False

    def __init__(self, apply, weights, num_moments=0, needs_values=True):
        self.apply, self.weights = apply, list(weights)
        self.num_moments, self.needs_values = num_moments, needs_values

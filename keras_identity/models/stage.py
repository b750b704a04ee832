"""The one place where models create their residual units.

Every ResNet builder adds its stages through :func:`residual_stage`, which
realises a stage of ``num_units`` units in one of two exchangeable forms
(``stage_mode``):

* ``"unrolled"``: one :class:`ResidualUnit` layer per unit
  (``stage2_unit3``), the form every analysis tool can look inside;
* ``"scan"``: the first unit (the one that changes shape) as a
  :class:`ResidualUnit`, the other ``num_units - 1`` as one
  :class:`ResidualStack` (``stage2_units2to18``) that loops over stacked
  weights, so building, tracing and compiling do not grow with depth.

Both forms run the same definitions (ordering, block, shortcut) for every
shortcut of Fig. 2.  :func:`transfer_weights` copies weights between models
of either form and :func:`unroll` turns a looped model into its unrolled
twin (for the analysis tools).
"""

import keras
import numpy as np

from keras_identity import _checks
from keras_identity.layers.residual import ResidualStack
from keras_identity.layers.residual import ResidualUnit
from keras_identity.layers.residual import check_recompute
from keras_identity.layers.residual.shortcuts import PARAMETERS

STAGE_MODES = ("unrolled", "scan", "auto")
# "auto" loops over a stage from this many units on (ResNet-110 and -164
# have 18 per stage, ResNet-1001 has 111); see docs/performance.md for the
# measurements behind the default.
AUTO_SCAN_MIN_UNITS = 12
# ResidualUnit arguments that a stack's units (stride 1, same shape, not the
# first of their stage) do not take.
_UNIT_ONLY = ("dimension_shortcut", "stride_on_1x1", "preactivation", "post_activation",
              "stochastic_depth_rate", "seed")
# Seeds of the units of stage s: seed + _SEED_STRIDE * s + index.
_SEED_STRIDE = 1000


def unit_seed(seed, stage, index):
    """The seed of unit ``index`` (0-based) of stage ``stage``: distinct per
    unit, so that no two units draw the same masks; unit j of a stack draws
    with ``stack seed + j`` (see ``ResidualStack``)."""
    return None if seed is None else seed + _SEED_STRIDE * stage + index


def scan_unsupported_reason(unit_kwargs):
    """Why a stage with these unit arguments cannot be looped, or ``None``."""
    backend = keras.backend.backend()
    if backend not in ("tensorflow", "jax"):
        return f"the {backend!r} backend (the looped stages run on TensorFlow and JAX)"
    if unit_kwargs.get("post_activation"):
        return "post_activation=True (the last-unit rule; the looped units are not last)"
    return None


def check_stage_mode(stage_mode, recompute="none"):
    """Validates ``stage_mode`` and its combination with ``recompute`` (see
    :func:`keras_identity.layers.residual.check_recompute`); returns
    ``(stage_mode, recompute)``.

    Raises:
        ValueError: for an unknown mode or ``recompute`` value, or any
            recomputation with ``"unrolled"`` (it is done by the looped
            stages).
    """
    _checks.check_choice("stage_mode", stage_mode, STAGE_MODES)
    check_recompute(recompute)
    if recompute != "none" and stage_mode == "unrolled":
        raise ValueError(f"recompute={recompute!r} is not valid with stage_mode='unrolled'; "
                         f"recomputation is done by the looped stages, use "
                         f"stage_mode='scan' or 'auto'.")
    return stage_mode, recompute


def resolve_stage_mode(stage_mode, num_units, unit_kwargs, recompute="none"):
    """Returns ``"unrolled"`` or ``"scan"`` for one stage (arguments as
    validated by :func:`check_stage_mode`).

    Recomputation (``recompute`` other than ``"none"``) is implemented by the
    looped layer, so it makes ``"auto"`` loop every stage of more than one
    unit.

    Raises:
        ValueError: ``"scan"`` (or ``recompute``) with a unit the loop does
            not support.
    """
    reason = scan_unsupported_reason(unit_kwargs)
    if recompute != "none":
        if reason is not None:
            raise ValueError(f"recompute={recompute!r} is not valid with {reason}.")
        return "scan"
    if stage_mode == "scan" and reason is not None:
        raise ValueError(f"stage_mode='scan' is not valid with {reason}; use "
                         f"stage_mode='unrolled' or 'auto'.")
    if stage_mode == "auto":
        return "scan" if reason is None and num_units >= AUTO_SCAN_MIN_UNITS else "unrolled"
    return stage_mode


def residual_stage(x, *, stage, num_units, filters, strides, unit_kwargs,
                   first_unit_kwargs=None, stochastic_depth_rates=None,
                   stage_mode="unrolled", recompute="none"):
    """Adds stage ``stage`` (1-based) of ``num_units`` residual units to ``x``.

    Args:
        x: the stage's input (a KerasTensor of a functional model).
        stage: the stage's number, used in the layer names (``stage2_unit3``; the unit's
            weight layers are ``stage2_unit3_conv1`` ...).
        num_units: units in the stage.
        filters: output channels of every unit.
        strides: stride of the first unit; the others keep the size.
        unit_kwargs: :class:`ResidualUnit` arguments shared by all units (``seed`` is the
            model's: each unit gets :func:`unit_seed`).
        first_unit_kwargs: overrides for the first unit (the unit that changes shape, and
            that may share its pre-activation).
        stochastic_depth_rates: one drop rate per unit, or ``None``.
        stage_mode: ``"unrolled"``, ``"scan"`` or ``"auto"`` (see the module).
        recompute: ``"none"``, ``"bn_relu"`` or ``"unit"``: what the looped units recompute
            in the backward pass rather than keep (see :class:`ResidualStack`); other than
            ``"none"`` it loops the stage.

    Returns:
        The stage's output.
    """
    stage_mode, recompute = check_stage_mode(stage_mode, recompute)
    mode = resolve_stage_mode(stage_mode, num_units, unit_kwargs, recompute)
    looped = mode == "scan" and num_units > 1
    seed = unit_kwargs.get("seed")
    for index in range(1 if looped else num_units):
        kwargs = dict(unit_kwargs)
        if index == 0 and first_unit_kwargs:
            kwargs.update(first_unit_kwargs)
        if stochastic_depth_rates is not None:
            kwargs["stochastic_depth_rate"] = stochastic_depth_rates[index]
        kwargs["seed"] = unit_seed(seed, stage, index)
        x = ResidualUnit(filters, strides=strides if index == 0 else 1,
                         name=f"stage{stage}_unit{index + 1}", **kwargs)(x)
    if looped:
        stack_kwargs = {k: v for k, v in unit_kwargs.items() if k not in _UNIT_ONLY}
        x = ResidualStack(
            filters, num_units - 1, first_unit=2, recompute=recompute,
            stochastic_depth_rates=None if stochastic_depth_rates is None
            else list(stochastic_depth_rates[1:]), seed=unit_seed(seed, stage, 1),
            name=f"stage{stage}_units2to{num_units}", **stack_kwargs)(x)
    return x


# ----------------------------------------------------------------- weights
def _stack_unit_name(stack, index):
    """The unrolled layer name (``stage2_unit5``) of unit ``index`` of a stack."""
    return f"{stack.name.rsplit('_units', 1)[0]}_unit{stack.first_unit + index}"


def _keyed_variables(layer):
    """``((layer name, weight name), variable)`` for a layer that is not a
    :class:`ResidualStack`; a unit's weights are named by sub-layer."""
    if isinstance(layer, ResidualUnit):
        for sub in layer.layers:
            suffix = sub.name[len(layer.name) + 1:]
            for w in sub.weights:
                yield (layer.name, f"{suffix}/{w.name}"), w
    else:
        for i, w in enumerate(layer.weights):
            yield (layer.name, f"{i}/{w.name}"), w


def _unit_weight_table(model):
    """``{(unit or layer name, weight name): array}`` for every weight.

    Units of a :class:`ResidualStack` appear under the names their unrolled
    layers have (``stage2_unit5``), so tables of both forms share keys.
    """
    table = {}
    for layer in model.layers:
        if isinstance(layer, ResidualStack):
            stacked = {name: np.asarray(v.numpy())
                       for name, v in layer.stacked_variables().items()}
            for j in range(layer.num_units):
                for name, value in stacked.items():
                    table[(_stack_unit_name(layer, j), name)] = value[j]
        else:
            for key, w in _keyed_variables(layer):
                table[key] = np.asarray(w.numpy())
    return table


def transfer_weights(source, target, ignore_source_layers=()):
    """Copies every weight of ``source`` into ``target``, across stage modes.

    The two models must be the same network (same builder arguments) built with any
    ``stage_mode``: a looped stage's unit ``j`` receives the weights of the unrolled layer
    ``stage{s}_unit{j}`` and the other way round, BN moving statistics included.  Weights of
    the source layers named in ``ignore_source_layers`` may have no place in the target (a
    classifier left out of a backbone).

    Raises:
        ValueError: naming the first weight that is missing or whose shape differs.
    """
    table = _unit_weight_table(source)
    used = set()

    def take(key, shape):
        if key not in table:
            raise ValueError(f"transfer_weights: the source model has no weight {key[1]!r} "
                             f"for '{key[0]}'; are the models built with the same "
                             f"arguments?")
        value = table[key]
        if tuple(value.shape) != tuple(shape):
            raise ValueError(f"transfer_weights: weight {key[1]!r} of '{key[0]}' has shape "
                             f"{tuple(value.shape)} in the source, {tuple(shape)} in the "
                             f"target.")
        used.add(key)
        return value

    for layer in target.layers:
        if isinstance(layer, ResidualStack):
            for name, variable in layer.stacked_variables().items():
                unit_shape = tuple(variable.shape[1:])
                variable.assign(np.stack([
                    take((_stack_unit_name(layer, j), name), unit_shape)
                    for j in range(layer.num_units)]))
        else:
            for key, w in _keyed_variables(layer):
                w.assign(take(key, w.shape))
    unused = sorted(k for k in set(table) - used if k[0] not in ignore_source_layers)
    if unused:
        raise ValueError(f"transfer_weights: the target model has no place for "
                         f"{len(unused)} source weights, e.g. {unused[0][1]!r} of "
                         f"'{unused[0][0]}'; are the models built with the same arguments?")
    return target


def stack_unit_config(stack, index):
    """The :class:`ResidualUnit` arguments of unit ``index`` of ``stack``."""
    config = stack.get_config()
    kwargs = {k: config[k] for k in (
        "block", "unit", "shortcut", "bottleneck_width", "kernel_size", "use_bias",
        "bn_momentum", "bn_epsilon", "kernel_initializer", "kernel_regularizer")}
    kwargs.update({k: config[k] for k in PARAMETERS if k in config})
    rates = stack.stochastic_depth_rates
    kwargs["stochastic_depth_rate"] = 0.0 if rates is None else rates[index]
    kwargs["seed"] = None if stack.seed is None else stack.seed + index
    return dict(filters=stack.filters, dtype=stack.dtype_policy,
                name=_stack_unit_name(stack, index), **kwargs)


def unroll(model):
    """``model`` with each looped stage replaced by its unrolled units.

    Returns ``model`` itself when it has no :class:`ResidualStack`;
    otherwise a new functional model, the same network with one
    :class:`ResidualUnit` per unit, holding copies of ``model``'s weights
    (:func:`transfer_weights`).
    """
    if not any(isinstance(l, ResidualStack) for l in model.layers):
        return model

    def call(layer, *args, **kwargs):
        if not isinstance(layer, ResidualStack):
            return layer(*args, **kwargs)
        x = args[0]
        for j in range(layer.num_units):
            x = ResidualUnit(**stack_unit_config(layer, j))(x)
        return x

    clone = keras.models.clone_model(model, call_function=call)
    return transfer_weights(model, clone)

"""The search space of a tuning run and the hyper-model that builds its trials.

He et al. (2016), Sec. 3.1: "we conduct hyper-parameter search on the initial
value of b_g in the range of 0 to -10 with a decrement step of -1 on the
training set by cross-validation".  Srivastava et al. (2015), Sec. 3.1 (the
MNIST depth study, Fig. 1): "a random search of 100 runs for both plain and
highway networks ... initial learning rate, momentum, learning rate
exponential decay factor & activation function (either rectified linear or
tanh). For highway networks, an additional hyperparameter was the initial
value for the transform gate bias (between -1 and -10)."

Each dimension is a list of values (``hp.Choice``) or a :class:`Range`
(``hp.Float``, for the random, Bayesian and Hyperband tuners).
"""

import dataclasses
import math

import keras_tuner

from keras_identity import _checks
from keras_identity.layers.residual import GATED_SHORTCUTS
from keras_identity.models import registry
from keras_identity.training import numerics
from keras_identity.training import run_setup
from keras_identity.training import trained_model
from keras_identity.training.config import ConfigError

DEFAULT_GATE_BIASES = tuple(float(b) for b in range(0, -11, -1))  # 0, -1, ..., -10

# Search dimension -> where its value goes: the builder (model_kwargs) or the
# TrainConfig field of the same name.
DIMENSIONS = ("gate_bias_init", "learning_rate", "momentum", "lr_decay", "activation",
              "weight_decay", "depth")
BUILDER_DIMENSIONS = ("gate_bias_init", "activation")
# Plural names of the SearchConfig fields / command-line flags.
FLAG_NAMES = {"gate_bias_init": "gate_biases", "learning_rate": "learning_rates",
              "momentum": "momentums", "lr_decay": "lr_decays", "activation": "activations",
              "weight_decay": "weight_decays", "depth": "depths"}
# What each numeric dimension allows.
_LIMITS = {
    "gate_bias_init": dict(),
    "learning_rate": dict(low=0.0, low_inclusive=False),
    "momentum": dict(low=0.0, high=1.0, high_inclusive=False),
    "lr_decay": dict(low=0.0, high=1.0, low_inclusive=False),
    "weight_decay": dict(low=0.0),
}


@dataclasses.dataclass(frozen=True)
class Range:
    """A continuous dimension ``[low, high]``, sampled uniformly or, with
    ``log``, log-uniformly (``hp.Float``)."""

    low: float
    high: float
    log: bool = False

    def describe(self):
        return {"low": self.low, "high": self.high, "log": self.log}

    def __str__(self):
        return f"{self.low:g}:{self.high:g}" + (" (log)" if self.log else "")


def parse_range(name, text, log=False):
    """``"low:high"`` -> :class:`Range` (either order); one line naming
    ``name`` otherwise."""
    parts = text.split(":")
    try:
        low, high = sorted(float(p) for p in parts)
        if len(parts) != 2 or not (math.isfinite(low) and math.isfinite(high)) or low == high:
            raise ValueError
    except ValueError:
        raise ValueError(f"{name}={text!r} is not valid; expected comma-separated values or "
                         f"one range low:high.") from None
    if log and low <= 0:
        raise ValueError(f"{name}={text!r} is not valid; a log-uniform range needs low > 0.")
    return Range(low, high, log)


def dimension_values(name, values):
    """A dimension's values in their type (``depth`` int, ``activation``
    str, the others float), or its :class:`Range` unchanged."""
    if isinstance(values, Range):
        return values
    convert = {"depth": int, "activation": str}.get(name, float)
    return tuple(convert(v) for v in values)


def has_gate_bias(config):
    """Whether ``config``'s model has an initial gate bias (b_T of highway
    layers, b_g of gated ResNet shortcuts)."""
    family = config.family
    if family in ("resnet", "preact_resnet"):
        return config.model_kwargs.get("shortcut") in GATED_SHORTCUTS
    return family == "highway_net"


def _model_words(config):
    shortcut = config.model_kwargs.get("shortcut")
    return (f"model={config.model!r}" + (f" with shortcut={shortcut!r}" if shortcut else ""))


def check_tunable(config, space=None):
    """Raises ``ConfigError`` unless ``space`` (dimension -> values or
    :class:`Range`; default: the gate bias alone) applies to ``config``'s
    model."""
    try:
        _check_space(config, space)
    except ConfigError:
        raise
    except ValueError as error:
        raise ConfigError(str(error)) from None


def gate_bias_fixed(config):
    """Whether ``config.model_kwargs`` sets the initial gate bias itself."""
    return "gate_bias_init" in config.model_kwargs or \
        "transform_bias_init" in config.model_kwargs


def _check_space(config, space):
    space = {"gate_bias_init": DEFAULT_GATE_BIASES} if space is None else space
    if isinstance(space.get("depth"), Range) or isinstance(space.get("activation"), Range):
        raise ConfigError("depths and activations take lists of values, not ranges.")
    if not space:
        what = ("" if has_gate_bias(config) else
                f"{_model_words(config)} has no gate bias to search; ")
        raise ConfigError(f"the search space is empty: {what}give at least one of "
                          f"gate_biases, learning_rates, momentums, lr_decays, "
                          f"activations, weight_decays, depths.")
    for name in space:
        if name == "depth":   # the configuration's depth is the default one
            continue
        given = ((gate_bias_fixed(config) if name == "gate_bias_init" else
                  name in config.model_kwargs)
                 if name in BUILDER_DIMENSIONS else getattr(config, name) is not None)
        if given:
            raise ConfigError(f"{name} is both fixed and searched ({FLAG_NAMES[name]}); "
                              f"give one of them.")
    if "gate_bias_init" in space and not has_gate_bias(config):
        if config.family in ("resnet", "preact_resnet"):
            shortcut = config.model_kwargs.get("shortcut")
            raise ConfigError(
                f"shortcut={shortcut!r} has no gate bias to tune; expected one of "
                f"{', '.join(repr(s) for s in GATED_SHORTCUTS)}.")
        raise ConfigError(
            f"gate_biases applies to models with a gate bias (highway_net, a ResNet with a "
            f"gated shortcut); model={config.model!r} has no gate bias.")
    if "activation" in space:
        builder = registry.builder_of(config.model)
        if "activation" not in builder.parameters:
            raise ConfigError(
                f"activations applies to highway_net and plain_net; {builder.name} has a "
                f"fixed activation.")
        for value in space["activation"]:
            _checks.check_choice("activations", value, ("relu", "tanh"))
    for name, limits in _LIMITS.items():
        values = space.get(name)
        for value in (values.low, values.high) if isinstance(values, Range) else values or ():
            _checks.check_range(FLAG_NAMES[name], value, **limits)
    for value in space.get("depth") or ():
        _checks.check_positive_int("depths", value)
    if "lr_decay" in space:
        config.check_exponential_schedule("lr_decays")


class TrainingHyperModel(keras_tuner.HyperModel):
    """Builds ``config``'s model and optimizer with the values a trial draws.

    Args:
        config: a :class:`TrainConfig` naming the model, dataset and recipe.
        data: the :class:`ImageDataset` the models are built for.
        recipe, plan: the search's recipe and :class:`~keras_identity.recipes.RunPlan`
            (its epochs and steps per epoch; each trial's own plan is :meth:`trial_plan`).
        space: dimension -> tuple of values or :class:`Range`; dimensions are
            ``gate_bias_init`` (b_g of gated ResNet shortcuts, b_T of highway layers),
            ``learning_rate``, ``momentum``, ``lr_decay`` (exponential-schedule recipes),
            ``activation`` (highway and plain nets), ``weight_decay`` and ``depth``.
            Default: the gate bias over the paper's 0, -1, ..., -10.
        normalization: the training set's ``Normalization``; each trial's model includes it
            and takes pixel values.
    """

    def __init__(self, config, data, recipe, plan, space=None, normalization=None,
                 **kwargs):
        super().__init__(**kwargs)
        space = {"gate_bias_init": DEFAULT_GATE_BIASES} if space is None else dict(space)
        unknown = sorted(set(space) - set(DIMENSIONS))
        if unknown:
            raise ValueError(f"unknown search dimensions {unknown}; expected some of "
                             f"{', '.join(DIMENSIONS)}.")
        check_tunable(config, space)
        self.config = config
        self.data = data
        self.recipe = recipe
        self.plan = plan
        self.normalization = normalization
        self.space = {name: dimension_values(name, space[name]) for name in DIMENSIONS
                      if isinstance(space.get(name), Range) or space.get(name)}
        for depth in self.space.get("depth", ()):
            dataclasses.replace(config, depth=depth).validate()

    def declare(self, hp):
        """Declares the space on ``hp``; returns the chosen values."""
        values = {}
        for name, dimension in self.space.items():
            if isinstance(dimension, Range):
                values[name] = hp.Float(name, dimension.low, dimension.high,
                                        sampling="log" if dimension.log else "linear")
            else:
                values[name] = hp.Choice(name, list(dimension),
                                         ordered=name != "activation")
        return values

    def trial_config(self, hp):
        """The :class:`TrainConfig` of the trial ``hp`` describes (the gate
        bias goes to the builder as b_g or b_T, see
        ``keras_identity.models.registry.kwargs_from_flags``)."""
        return apply_values(self.config, self.declare(hp))

    def trial_plan(self, config):
        """The :class:`~keras_identity.recipes.RunPlan` of the trial config
        ``config`` (:meth:`trial_config`): its recipe resolved with its
        values (depth, learning rate, batch) as ``keras-identity-train``
        resolves a run's (:func:`keras_identity.training.run_setup.resolve_plan`),
        on the search's training split: a trial at depth 110 of the ``cifar``
        recipe warms up as a run at depth 110 does, whatever the
        configuration's depth."""
        return run_setup.resolve_plan(config, self.data.num_train)

    def build(self, hp):
        """The trial's model, compiled, built from the seed: the dtype
        policy, the seeds (Python's, NumPy's, the backend's and Keras's
        generators) and TensorFlow's op determinism are set again here, so a
        trial's weights and data stream depend on its values and
        ``config.seed`` only, not on the trials its process ran before
        (Keras Tuner's ``clear_session`` before each build also clears the
        dtype policy)."""
        config = self.trial_config(hp)
        numerics.setup_precision_and_seed(config.precision, config.seed, config.deterministic)
        plan = self.trial_plan(config)
        model = trained_model.build_model(config, self.data, seed=config.seed,
                                          normalization=self.normalization)
        recipe = config.get_recipe()
        optimizer = trained_model.make_optimizer(recipe, plan,
                                                 *config.momentum_and_decay(recipe))
        return trained_model.compile_model(model, optimizer, config.jit_compile)

    # Set by the search (keras_identity.tuning.search.run_search): how a trial
    # resumes and stops (a keras_identity.tuning.progress.TrialProgress); None:
    # a plain Keras fit.
    progress = None

    def fit(self, hp, model, *args, **kwargs):
        """A trial's fit: with :attr:`progress`, checkpointed inside and at the
        end of every epoch, stopped by the stop signals, and resumed from its
        checkpoint when the search retries the trial (a search that was
        stopped); else Keras's own."""
        if self.progress is None:
            return super().fit(hp, model, *args, **kwargs)
        if kwargs.get("initial_epoch"):
            # Hyperband's later rounds start from an earlier round's weights:
            # stopped by a signal, they restart from their start.
            return self.progress.fit_unsaved(super().fit, hp, model, *args, **kwargs)
        return self.progress.fit(model, epochs=kwargs["epochs"],
                                 validation_data=kwargs.get("validation_data"),
                                 callbacks=kwargs.get("callbacks", []),
                                 verbose=kwargs.get("verbose", 0))


def apply_values(config, values):
    """``config`` with a trial's values: the gate bias and the activation go
    to the builder, the others to the ``TrainConfig`` fields of their name."""
    values = dict(values)
    builder_values = {k: values.pop(k) for k in BUILDER_DIMENSIONS if k in values}
    model_kwargs = dict(config.model_kwargs)
    if "gate_bias_init" in builder_values:
        model_kwargs.update(registry.kwargs_from_flags(
            config.model, gate_bias_init=builder_values["gate_bias_init"]))
    if "activation" in builder_values:
        model_kwargs["activation"] = builder_values["activation"]
    return dataclasses.replace(config, model_kwargs=model_kwargs, **values)

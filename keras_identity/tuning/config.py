"""The search's configuration and identity: :class:`SearchConfig` (the
``keras-identity-tune`` flags: the space, the tuner, the objective, and their
checks), the tuners and objectives it may name, how a trial's values are
told in words (:func:`describe_values`), and what a search directory's trials
depend on (:func:`search_identity`, kept in ``search.json``:
:func:`check_same_search` refuses a directory that holds another search)."""

import dataclasses
import json

import keras_tuner

from keras_identity import storage
from keras_identity.training import config as train_config
from keras_identity.training import run_files
from keras_identity.tuning.hypermodel import DEFAULT_GATE_BIASES
from keras_identity.tuning.hypermodel import DIMENSIONS
from keras_identity.tuning.hypermodel import FLAG_NAMES
from keras_identity.tuning.hypermodel import Range
from keras_identity.tuning.hypermodel import check_tunable
from keras_identity.tuning.hypermodel import dimension_values
from keras_identity.tuning.hypermodel import gate_bias_fixed
from keras_identity.tuning.hypermodel import has_gate_bias

TUNERS = ("grid", "random", "bayesian", "hyperband")
# What a trial is judged by: the best epoch's value of a Keras metric.
# val_error: He et al.'s cross-validation; train_error / train_loss:
# Srivastava et al.'s "best training set error" (Fig. 1 plots the loss).
OBJECTIVES = {
    "val_error": keras_tuner.Objective("val_accuracy", direction="max"),
    "train_error": keras_tuner.Objective("accuracy", direction="max"),
    "train_loss": keras_tuner.Objective("cross_entropy", direction="min"),
}


@dataclasses.dataclass
class SearchConfig:
    """A hyper-parameter search (the ``keras-identity-tune`` flags).

    ``train`` holds the model, dataset, recipe and trial length (its ``epochs``) and
    ``model_dir``, where the tuner keeps its state: running the same search again continues
    it.

    The space: each of ``gate_biases``, ``learning_rates``, ``momentums``, ``lr_decays``,
    ``activations``, ``weight_decays`` and ``depths`` is a tuple of values or a
    :class:`Range` (random, Bayesian, Hyperband).  ``gate_biases=None`` means the paper's 0,
    -1, ..., -10 for a model with a gate bias (unless ``model_kwargs`` fixes it) and no
    gate-bias dimension otherwise.  ``objective`` is ``"val_error"`` (the best epoch's
    validation error), ``"train_error"`` or ``"train_loss"`` (the best epoch's training
    error or cross-entropy).
    """

    train: train_config.TrainConfig
    tuner: str = "grid"
    max_trials: int = None
    validation_split: float = 0.1
    gate_biases: tuple = None
    learning_rates: tuple = None
    weight_decays: tuple = None
    depths: tuple = None
    retrain_best: bool = False
    retrain_epochs: int = None
    momentums: tuple = None
    lr_decays: tuple = None
    activations: tuple = None
    objective: str = "val_error"

    @property
    def space(self):
        """Dimension -> tuple of values or :class:`Range` (dimensions not
        searched left out)."""
        space = {}
        for name in DIMENSIONS:
            values = getattr(self, FLAG_NAMES[name])
            if (name == "gate_bias_init" and values is None and has_gate_bias(self.train)
                    and not gate_bias_fixed(self.train)):
                values = DEFAULT_GATE_BIASES
            if values is None:
                continue
            if not isinstance(values, Range):
                values = tuple(values)
                if name == "depth":
                    values = tuple(int(v) if isinstance(v, float) and v.is_integer() else v
                                   for v in values)
            space[name] = values
        return space

    def validate(self):
        try:
            self.train.validate()
            for name in DIMENSIONS:
                values = getattr(self, FLAG_NAMES[name])
                if values is not None and not isinstance(values, Range) and not len(values):
                    raise ValueError(f"{FLAG_NAMES[name]} is empty; expected at least one "
                                     f"value.")
            space = self.space
            check_tunable(self.train, space)
            if self.tuner not in TUNERS:
                raise ValueError(f"tuner={self.tuner!r} is not valid; expected one of: "
                                 f"{', '.join(repr(t) for t in TUNERS)}.")
            if self.objective not in OBJECTIVES:
                raise ValueError(f"objective={self.objective!r} is not valid; expected one of: "
                                 f"{', '.join(repr(o) for o in OBJECTIVES)}.")
            if self.train.strategy == "multi_worker":
                raise ValueError("strategy='multi_worker' is not supported for a search; "
                                 "use 'auto', 'mirrored' or 'tpu' (Keras Tuner distributes "
                                 "trials with its own KERASTUNER_* variables).")
            if self.max_trials is not None and self.max_trials < 1:
                raise ValueError(f"max_trials={self.max_trials!r} is not valid; expected an "
                                 f"integer >= 1.")
            ranges = [FLAG_NAMES[n] for n, v in space.items() if isinstance(v, Range)]
            if ranges and self.tuner == "grid":
                raise ValueError(f"{', '.join(ranges)}: a range low:high needs "
                                 f"tuner='random', 'bayesian' or 'hyperband'; the grid takes "
                                 f"lists of values.")
            if ranges and self.tuner in ("random", "bayesian") and self.max_trials is None:
                raise ValueError(f"{', '.join(ranges)}: a range has no end of values; give "
                                 f"max_trials.")
            if not 0.0 < self.validation_split < 1.0:
                raise ValueError(f"validation_split={self.validation_split!r} is not valid; "
                                 f"expected a number in (0, 1).")
            if self.train.epochs is None:
                raise ValueError("a search needs epochs (per trial).")
        except train_config.ConfigError:
            raise
        except ValueError as error:
            raise train_config.ConfigError(str(error)) from None
        return self

    @property
    def space_size(self):
        """Configurations in the space (``None`` with a range)."""
        size = 1
        for values in self.space.values():
            if isinstance(values, Range):
                return None
            size *= len(values)
        return size

    def describe_space(self):
        return ", ".join(f"{name} {list(v) if not isinstance(v, Range) else v}"
                         for name, v in self.space.items())


def describe_values(values):
    """A trial's values in words: ``gate bias -2, depth 20``."""
    return ", ".join(f"{'gate bias' if k == 'gate_bias_init' else k} "
                     f"{v:g}" if isinstance(v, float) else f"{k} {v}"
                     for k, v in values.items())


SEARCH_FILE = "search.json"


def search_identity(search, setup):
    """What a search directory's trials depend on: the identity of a
    training run of the search's configuration
    (:func:`keras_identity.training.run_files.run_identity`, on ``setup``, the
    search's :class:`~keras_identity.training.run_setup.RunSetup`: every flag
    that changes what a step computes, by the same list a run's resume
    checks) and the search's own settings: its space, tuner, objective,
    trial length and validation split (``max_trials`` may grow: more trials
    of the same search)."""
    space = search.space

    def dimension(name):
        values = dimension_values(name, space.get(name, ()))
        return values.describe() if isinstance(values, Range) else list(values)

    identity = run_files.run_identity(search.train, setup.data, setup.recipe, setup.plan,
                                      setup.normalization, setup.augmentation)
    identity.update({FLAG_NAMES[name]: dimension(name) for name in DIMENSIONS})
    identity.update({"tuner": search.tuner, "objective": search.objective,
                     "epochs": search.train.epochs,
                     "validation_split": search.validation_split})
    return identity


def check_same_search(directory, identity):
    """Refuses a search directory that holds another search (one line naming
    what differs); records the identity of a new one."""
    path = storage.join(directory, SEARCH_FILE)
    if storage.exists(path):
        try:
            before = storage.read_json(path)
        except (OSError, ValueError) as error:
            raise ValueError(f"{path} is not readable ({type(error).__name__}); use a new "
                             f"--model_dir.") from None
        diffs = run_files.differences(before, identity)
        if diffs:
            raise ValueError(f"model_dir={directory!r} holds another search "
                             f"({'; '.join(diffs)}); a search continues only with its own "
                             f"space and data; use a new --model_dir for this one.")
        return
    storage.check_writable(directory)
    if storage.listdir(directory):
        raise ValueError(f"model_dir={directory!r} is not empty and holds no {SEARCH_FILE} "
                         f"(not a search directory); use a new --model_dir.")
    storage.write_text(path, json.dumps(identity, indent=1))

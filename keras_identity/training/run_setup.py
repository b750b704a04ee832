"""The one way from a :class:`~keras_identity.training.config.TrainConfig`
to what a run needs, for a training run and a search alike.

:func:`set_up` sets the precision and seed (:mod:`numerics`), picks the
strategy (:mod:`strategies`), loads the data (:mod:`run_data`), resolves the
recipe for its batch (:func:`keras_identity.recipes.resolve`), checks the
global batch against the replicas and makes the input normalisation; the
:class:`RunSetup` it returns also holds the augmentation, the stop signals
(:mod:`preemption`) and the input streams (:func:`RunSetup.train_stream`,
:func:`RunSetup.eval_stream`).  A search's differences are
:func:`set_up`'s arguments (its validation split, its refusal of several
processes); a training run's own files (the run directory, identity,
checkpointer and lock) are :func:`keras_identity.training.trainer.prepare`'s.
"""

import dataclasses

from keras_identity import recipes
from keras_identity.data import streams
from keras_identity.training import numerics
from keras_identity.training import preemption
from keras_identity.training import run_data
from keras_identity.training import strategies


def check_global_batch(plan, strategy):
    """The global batch must split evenly over the replicas (devices)."""
    if plan.batch_size % strategy.num_replicas_in_sync:
        raise ValueError(f"batch_size={plan.batch_size} is not valid with "
                         f"{strategy.num_replicas_in_sync} replicas; expected a multiple.")


@dataclasses.dataclass
class RunSetup:
    """A configuration resolved against a machine and a data set: what a
    training run and a search's trials share."""

    config: object
    strategy: object
    full_data: object       # the data set as loaded
    data: object            # what the run trains and evaluates on (a search: a split of it)
    recipe: object
    plan: object            # the recipe resolved for the run (recipes.RunPlan)
    normalization: object
    augmentation: str
    signals: preemption.StopSignals
    split: str = "test"     # the evaluation split ("val": a search's validation split)

    def _streams(self, **kwargs):
        config = self.config
        return streams.input_streams(
            self.data, batch_size=self.plan.batch_size, normalization=self.normalization,
            augmentation=self.augmentation, seed=config.seed, split=self.split,
            worker_processes=config.input_workers, **strategies.input_placement(self.strategy),
            **kwargs)

    def train_stream(self, step=0):
        """The training stream from position ``step`` in the data (a fit's
        ``make_train``)."""
        return self._streams(start_step=step, evaluation=False)[0]

    def eval_stream(self, eval_crop=224):
        """The evaluation batches (``eval_crop``: ImageNet's crop)."""
        return self._streams(training=False, eval_crop=eval_crop)[1]


def set_up(config, strategy=None, *, validation_split=None, check_strategy=None):
    """Resolves ``config`` into a :class:`RunSetup`: precision and seed, the
    strategy (``strategy`` if given, else ``config``'s), the data (with
    ``validation_split``: that fraction of the training set held out and
    evaluated on, the test set unused), the recipe resolved for the batch,
    the normalisation and augmentation.  ``check_strategy(strategy)``, if
    given, may refuse the strategy before any data is read.

    Raises:
        ValueError: one line (a configuration the data or devices refuse).
        storage.StorageError: the data could not be read.
    """
    numerics.setup_precision_and_seed(config.precision, config.seed, config.deterministic)
    if strategy is None:
        strategy = strategies.get_strategy(config.strategy, config.tpu)
    if check_strategy is not None:
        check_strategy(strategy)
    full_data = run_data.load_data(config)
    data = full_data if validation_split is None else full_data.with_validation_split(
        validation_split, seed=config.seed)
    recipe = config.get_recipe()
    plan = recipes.resolve(
        recipe, num_train=data.num_train, batch_size=config.batch_size,
        depth=config.resolved_depth, learning_rate=config.learning_rate,
        epochs=config.epochs, train_steps=config.train_steps,
        steps_per_epoch=config.steps_per_epoch, warmup_steps=config.warmup_steps)
    check_global_batch(plan, strategy)
    normalization = run_data.make_normalization(
        config.normalization or recipe.normalization, data)
    return RunSetup(config=config, strategy=strategy, full_data=full_data, data=data,
                    recipe=recipe, plan=plan, normalization=normalization,
                    augmentation=config.augmentation or recipe.augmentation,
                    signals=preemption.StopSignals(config.stop_signal),
                    split="test" if validation_split is None else "val")

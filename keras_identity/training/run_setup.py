"""The one way from a :class:`~keras_identity.training.config.TrainConfig`
to what a run needs, for a training run and a search alike (:func:`set_up`):
precision and seed, the strategy, the data (:func:`load_data`), the recipe's
:class:`~keras_identity.recipes.RunPlan`, the normalisation
(:func:`make_normalization`), augmentation, input streams and stop signals.
A training run's own files are :func:`keras_identity.training.trainer.prepare`'s.
"""

import dataclasses

import keras

from keras_identity import recipes
from keras_identity.data import arrays
from keras_identity.data import datasets as datasets_lib
from keras_identity.data import normalization as normalization_lib
from keras_identity.data import streams
from keras_identity.training import numerics
from keras_identity.training import preemption
from keras_identity.training import strategies


def load_data(config):
    """The run's data; a split without images is refused (a run would report
    a test error of NaN), and so is ``--input_workers`` for data in memory."""
    # The JAX route reads tensorflow_datasets through its random-access data
    # source (no TensorFlow); the TensorFlow route through tf.data.
    data = datasets_lib.load_dataset(config.dataset, config.data_dir,
                                     random_access=keras.backend.backend() == "jax")
    for split, count in (("training", data.num_train), ("test", data.num_test)):
        if not count:
            raise ValueError(f"data_dir={config.data_dir or data.source!r}: the {split} set of "
                             f"{config.dataset} has no images; expected at least one.")
    if config.input_workers is not None:
        arrays.resolve_worker_processes(config.input_workers, data, name="input_workers")
    if config.train_examples or config.test_examples:
        data = data.subset(config.train_examples, config.test_examples, seed=config.seed)
    return data


def make_normalization(mode, data):
    """The input normalisation ``mode`` for ``data``, with its statistics from
    the training images held in memory (ImageNet's ``per_channel``: the
    published ones); data streamed from files takes only ``scale`` (and
    ImageNet's ``per_channel``)."""
    if mode == "per_channel" and data.name == "imagenet":
        return normalization_lib.Normalization.imagenet()
    if data.in_memory:
        return normalization_lib.Normalization.from_images(mode, data.x_train)
    if mode != "scale":
        raise ValueError(f"normalization={mode!r} needs its statistics from the training "
                         f"images, which {data.name} streams from files; use 'per_channel' "
                         f"(ImageNet: its published statistics) or 'scale'.")
    return normalization_lib.Normalization(mode)


def check_global_batch(plan, strategy):
    """The global batch must split evenly over the replicas (devices)."""
    if plan.batch_size % strategy.num_replicas_in_sync:
        raise ValueError(f"batch_size={plan.batch_size} is not valid with "
                         f"{strategy.num_replicas_in_sync} replicas; expected a multiple.")


@dataclasses.dataclass
class RunSetup:
    """A configuration resolved against a machine and a data set."""

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
        return streams.input_streams(
            self.data, batch_size=self.plan.batch_size, normalization=self.normalization,
            augmentation=self.augmentation, seed=self.config.seed, split=self.split,
            worker_processes=self.config.input_workers,
            **strategies.input_placement(self.strategy), **kwargs)

    def train_stream(self, step=0):
        """The training stream from position ``step`` in the data (a fit's
        ``make_train``)."""
        return self._streams(start_step=step, evaluation=False)[0]

    def eval_stream(self, eval_crop=224):
        """The evaluation batches (``eval_crop``: ImageNet's crop)."""
        return self._streams(training=False, eval_crop=eval_crop)[1]


def resolve_plan(config, num_train):
    """``config``'s recipe resolved into its :class:`~keras_identity.recipes.RunPlan`
    for ``num_train`` training images: the one resolution of a run's
    schedule (its depth's warm-up, its batch and learning rate), for a
    training run, a search's trial (its values applied to ``config``) and
    the retraining of the best trial alike."""
    return recipes.resolve(
        config.get_recipe(), num_train=num_train, batch_size=config.batch_size,
        depth=config.resolved_depth, learning_rate=config.learning_rate,
        epochs=config.epochs, train_steps=config.train_steps,
        steps_per_epoch=config.steps_per_epoch, warmup_steps=config.warmup_steps)


def set_up(config, strategy=None, *, validation_split=None, check_strategy=None):
    """``config`` resolved into a :class:`RunSetup` (``strategy``: one already
    made; ``validation_split``: that fraction of the training set held out and
    evaluated on, the test set unused; ``check_strategy(strategy)`` may refuse
    the strategy before any data is read).

    Raises:
        ValueError: one line (a configuration the data or devices refuse).
        storage.StorageError: the data could not be read.
    """
    numerics.setup_precision_and_seed(config.precision, config.seed, config.deterministic)
    if strategy is None:
        strategy = strategies.get_strategy(config.strategy, config.tpu)
    if check_strategy is not None:
        check_strategy(strategy)
    full_data = load_data(config)
    data = full_data if validation_split is None else full_data.with_validation_split(
        validation_split, seed=config.seed)
    recipe = config.get_recipe()
    plan = resolve_plan(config, data.num_train)
    check_global_batch(plan, strategy)
    normalization = make_normalization(
        config.normalization or recipe.normalization, data)
    return RunSetup(config=config, strategy=strategy, full_data=full_data, data=data,
                    recipe=recipe, plan=plan, normalization=normalization,
                    augmentation=config.augmentation or recipe.augmentation,
                    signals=preemption.StopSignals(config.stop_signal),
                    split="test" if validation_split is None else "val")

"""The model a run trains: built from its configuration, compiled with its
optimizer, saved whole.

:func:`build_model` (the builder of ``config.model`` for the data, with the
normalisation as its first layer), :func:`make_optimizer` (SGD with momentum
and the recipe's learning-rate schedule), :func:`compile_model` (the loss,
the metrics, XLA and steps per call), :func:`build_optimizer` and
:func:`save_model`; the trainer, the tuner, the benchmarks and notebooks
share them.
"""

import os

import keras

from keras_identity import storage

from keras_identity.models import registry
from keras_identity.training import schedules
from keras_identity.training.optimizers import MomentumSGD


def build_model(config, data, seed=None, normalization=None):
    """Builds ``config.model`` for ``data`` (its image shape and classes),
    passing ``config.model_kwargs`` through to the builder.

    With ``normalization`` (a :class:`Normalization` with the training
    set's statistics) the model includes it as its first layer and takes
    pixel values: the ``.keras`` file a run saves is self-contained.
    """
    builder, kwargs = registry.resolve(
        config.model, config.depth, config.dataset, num_classes=data.num_classes,
        input_shape=tuple(data.image_shape), **config.model_kwargs)
    if "seed" in builder.parameters:
        kwargs["seed"] = seed
    if normalization is not None:
        kwargs.update(include_preprocessing=True, normalization=normalization)
    return builder.function(**kwargs)


def make_optimizer(recipe, plan, momentum, weight_decay):
    """The run's optimizer: momentum SGD with ``recipe``'s learning-rate
    schedule resolved for ``plan`` (the run's), its ``momentum`` and ``weight_decay``
    (:meth:`~keras_identity.training.config.TrainConfig.momentum_and_decay`:
    the flags, else the recipe's)."""
    return MomentumSGD(schedules.from_recipe(recipe, plan), momentum=momentum,
                       nesterov=recipe.nesterov, coupled_weight_decay=weight_decay)


def compile_model(model, optimizer, jit_compile=False, steps_per_execution=1):
    """Compiles ``model`` for training and creates its optimizer's variables.

    Call it inside the strategy's scope. Building the optimizer here, rather
    than in the first training step, matters for start-up: a ``tf.function``
    whose first trace creates variables (Keras creates the momentum slots
    there) is traced a second time, which doubles the tracing cost of the
    first step (ResNet-164: about 7 s on a 2-core CPU).
    """
    # JAX always compiles the step with XLA (without, Keras runs it op by op).
    jit_compile = bool(jit_compile) or keras.backend.backend() == "jax"
    # Weighted metrics: the zero-weight examples that pad the last test batch
    # on TPUs and multiple replicas count neither in the error nor in the
    # cross-entropy (Keras's loss divides by the padded batch size).
    model.compile(optimizer=optimizer,
                  loss=keras.losses.SparseCategoricalCrossentropy(),
                  weighted_metrics=[
                      keras.metrics.SparseCategoricalAccuracy(name="accuracy"),
                      keras.metrics.SparseCategoricalCrossentropy(name="cross_entropy")],
                  jit_compile=jit_compile, steps_per_execution=steps_per_execution)
    build_optimizer(model)
    return model


def build_optimizer(model):
    """Creates ``model.optimizer``'s variables for the model's trainable weights
    now, so that the first ``fit`` step is traced once instead of twice."""
    if model.optimizer is not None and not model.optimizer.built:
        model.optimizer.build(model.trainable_variables)
    return model


def save_model(model, path):
    """``model.save(path)`` whole: locally under a temporary name renamed
    when written; into a bucket from a local file once it is written."""
    if storage.is_remote(path):
        with storage.staged(path) as local:
            model.save(local)
        return
    partial = path[:-len(".keras")] + ".partial.keras"
    model.save(partial)
    os.replace(partial, path)

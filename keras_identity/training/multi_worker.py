"""Keras 3 + ``MultiWorkerMirroredStrategy``: two upstream workarounds.

Keras 3.15's TensorFlow trainer does not run ``fit`` under
``MultiWorkerMirroredStrategy`` (keras-team/keras#20585, open):

1. before ``fit``/``evaluate`` it reduces the first distributed batch with
   ``strategy.reduce`` to build the model symbolically, which fails
   ("Attempt to convert a value (PerReplica ...) to a Tensor");
2. it averages the per-replica metric values with
   ``strategy.reduce("MEAN", value, axis=0)``, which fails for the scalar
   loss and metrics ("Invalid reduction dimension 0 for input with 0
   dimensions").

:func:`prepare` fixes both for one model: it builds the model from a batch of
zeros of its input's shape (only shapes are needed), and averages scalar metric values across
replicas with ``axis=None``.  Nothing changes for other strategies.  The
two-worker test in ``tests/training/test_multi_worker.py`` checks the result
against a single-worker run.
"""

import tensorflow as tf
from keras.src.backend.tensorflow import trainer as _tf_trainer
from keras.src import tree

_original_reduce_per_replica = _tf_trainer.reduce_per_replica


def _reduce_per_replica(values, strategy, reduction):
    if reduction in ("auto", "mean") and _tf_trainer._collective_all_reduce_multi_worker(
            strategy):
        def reduce(value):
            if not isinstance(value, tf.distribute.DistributedValues):
                return value
            rank = strategy.experimental_local_results(value)[0].shape.rank
            return strategy.reduce("MEAN", value, axis=0 if rank else None)

        return tree.map_structure(reduce, values)
    return _original_reduce_per_replica(values, strategy, reduction)


def prepare(model, strategy):
    """Makes ``model.fit``/``evaluate`` work under ``strategy`` (see above)."""
    if not isinstance(strategy, tf.distribute.MultiWorkerMirroredStrategy):
        return
    _tf_trainer.reduce_per_replica = _reduce_per_replica
    # A batch of one image and one label of the model's shapes.
    batch = (tf.zeros((1,) + tuple(model.input_shape[1:]), model.input.dtype),
             tf.zeros((1,), tf.int32))
    with strategy.scope():
        model._symbolic_build(data_batch=batch)
    model._maybe_symbolic_build = lambda iterator=None, data_batch=None: None

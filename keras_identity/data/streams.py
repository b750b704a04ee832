"""A run's input streams: its training stream and its evaluation batches
(models that take pixel values), on the Keras backend's route.

* TensorFlow: tf.data pipelines (:mod:`~keras_identity.data.pipeline`),
  distributed by a ``tf.distribute`` strategy;
* JAX: NumPy batches in ``keras.utils.PyDataset`` objects
  (:mod:`~keras_identity.data.arrays`), each process reading its rows of
  every global batch.

Where the streams go (the strategy, this process, padding) is given by the
caller: :func:`keras_identity.training.strategies.input_placement` says it
for a strategy.
"""

from keras_identity.data import arrays


def input_streams(data, *, batch_size, normalization, augmentation, seed, start_step=0,
                  split="test", eval_crop=224, training=True, evaluation=True,
                  worker_processes=None, pad_to_batch=False, tf_strategy=None,
                  process_index=0, process_count=1):
    """The training stream and the evaluation batches of a run:

    * with ``tf_strategy`` (TensorFlow): tf.data pipelines distributed by
      that ``tf.distribute`` strategy;
    * without (JAX): NumPy batches in ``keras.utils.PyDataset`` objects
      (:class:`~keras_identity.data.TrainBatches`,
      :class:`~keras_identity.data.EvalBatches`), process ``process_index``
      of ``process_count`` reading its rows of every global batch, image
      files decoded in ``worker_processes`` (``--input_workers``; None: see
      :class:`~keras_identity.data.TrainBatches`).

    ``pad_to_batch``: the last evaluation batch is padded with zero-weight
    examples (a TPU, several replicas or processes).

    Returns ``(train, evaluation)``; ``training`` or ``evaluation`` False
    leaves that one None.
    """
    eval_resize = {224: 256, 320: 320}.get(eval_crop, 256)
    train = evaluate = None
    if tf_strategy is None:
        processes = dict(process_index=process_index, process_count=process_count,
                         worker_processes=worker_processes)
        if training:
            train = arrays.TrainBatches(
                data, batch_size=batch_size, normalization=normalization,
                augmentation=augmentation, seed=seed, start_step=start_step, raw_pixels=True,
                **processes)
        if evaluation:
            evaluate = arrays.EvalBatches(
                data, batch_size=batch_size, normalization=normalization, split=split,
                pad_to_batch=pad_to_batch, eval_resize=eval_resize, eval_crop=eval_crop,
                raw_pixels=True, **processes)
        return train, evaluate
    from keras_identity.data import pipeline

    def make_train(input_context=None):
        return pipeline.train_dataset(
            data, batch_size=batch_size, normalization=normalization,
            augmentation=augmentation, seed=seed, start_step=start_step,
            input_context=input_context, raw_pixels=True)

    def make_eval(input_context=None):
        return pipeline.eval_dataset(
            data, batch_size=batch_size, normalization=normalization, split=split,
            pad_to_batch=pad_to_batch, eval_resize=eval_resize, eval_crop=eval_crop,
            input_context=input_context, raw_pixels=True)

    if training:
        train = pipeline.distribute(tf_strategy, make_train)
    if evaluation:
        evaluate = pipeline.distribute(tf_strategy, make_eval)
    return train, evaluate

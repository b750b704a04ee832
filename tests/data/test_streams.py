"""A run's input streams (:mod:`keras_identity.data.streams`): NumPy
``PyDataset`` objects reading this process's rows (the JAX route), or tf.data
pipelines distributed by a ``tf.distribute`` strategy (TensorFlow)."""

import numpy as np
import pytest

from keras_identity.data import EvalBatches
from keras_identity.data import ImageDataset
from keras_identity.data import Normalization
from keras_identity.data import TrainBatches
from keras_identity.data import streams
from tests.backend import tensorflow_only


def _dataset(n=64, n_test=20, size=8):
    rng = np.random.default_rng(0)
    return ImageDataset(
        name="cifar10", num_classes=10, class_names=[str(i) for i in range(10)],
        image_shape=(size, size, 3), source="test",
        x_train=rng.integers(0, 256, (n, size, size, 3), dtype=np.uint8),
        y_train=np.arange(n, dtype=np.int32) % 10,
        x_test=rng.integers(0, 256, (n_test, size, size, 3), dtype=np.uint8),
        y_test=np.arange(n_test, dtype=np.int32) % 10)


SETTINGS = dict(batch_size=16, normalization=Normalization("scale"), augmentation="none",
                seed=0)


def test_without_a_tf_strategy_each_process_reads_its_rows_of_numpy_batches():
    data = _dataset()
    train, evaluate = streams.input_streams(data, pad_to_batch=True, process_index=1,
                                            process_count=2, **SETTINGS)
    try:
        assert isinstance(train, TrainBatches) and isinstance(evaluate, EvalBatches)
        images, labels = train[0]
        assert images.shape == (8, 8, 8, 3) and labels.shape == (8,)
        # Pixel values (the model normalises them itself).
        assert images.max() > 1.0
        # The test set's 20 images in two padded global batches: process 1
        # holds rows 8-15 of each; the second one's are padding (zero weights).
        assert evaluate.num_batches == 2
        _, labels, weights = evaluate[0]
        np.testing.assert_array_equal(labels, data.y_test[8:16])
        np.testing.assert_array_equal(weights, np.ones(8))
        _, _, weights = evaluate[1]
        assert weights.shape == (8,) and not weights.any()
    finally:
        train.close()
        evaluate.close()


@pytest.mark.parametrize("training, evaluation", [(True, False), (False, True)])
def test_only_the_stream_asked_for_is_made(training, evaluation):
    train, evaluate = streams.input_streams(_dataset(), training=training,
                                            evaluation=evaluation, **SETTINGS)
    assert (train is not None, evaluate is not None) == (training, evaluation)
    for stream in (train, evaluate):
        if stream is not None:
            stream.close()


@tensorflow_only
def test_a_tf_strategy_distributes_tf_data_pipelines():
    import tensorflow as tf

    strategy = tf.distribute.get_strategy()
    train, evaluate = streams.input_streams(_dataset(), tf_strategy=strategy, **SETTINGS)
    assert isinstance(train, (tf.data.Dataset, tf.distribute.DistributedDataset))
    images, labels = next(iter(train))
    assert tuple(images.shape) == (16, 8, 8, 3) and tuple(labels.shape) == (16,)
    assert float(tf.reduce_max(images)) > 1.0
    batches = list(evaluate)
    assert sum(int(batch[1].shape[0]) for batch in batches) == 20

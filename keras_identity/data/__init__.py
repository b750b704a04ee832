"""Datasets (tensorflow_datasets or offline files), augmentation, pipelines.

Two input pipelines produce the same streams of global batches: tf.data
(:mod:`~keras_identity.data.pipeline`, the TensorFlow route; it needs
TensorFlow) and NumPy batches in a ``keras.utils.PyDataset``
(:mod:`~keras_identity.data.arrays`, the JAX route; no TensorFlow);
:mod:`~keras_identity.data.streams` gives a run the one of its backend.
"""

from keras_identity.data.arrays import EvalBatches
from keras_identity.data.arrays import TrainBatches
from keras_identity.data.datasets import load_dataset
from keras_identity.data.errors import DataError
from keras_identity.data.facts import AUGMENTATIONS
from keras_identity.data.facts import DATASETS
from keras_identity.data.image_dataset import ImageDataset
from keras_identity.data.normalization import Normalization
from keras_identity.data.normalization import load_preprocessing
from keras_identity.data.normalization import save_preprocessing


def __getattr__(name):
    # The tf.data pipelines import TensorFlow: only when asked for.
    if name in ("train_dataset", "eval_dataset"):
        from keras_identity import _tensorflow

        _tensorflow.require(f"keras_identity.data.{name} (tf.data)")
        from keras_identity.data import pipeline

        return getattr(pipeline, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

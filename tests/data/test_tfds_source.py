import sys
import types

import numpy as np
import pytest

from keras_identity.data import DataError
from keras_identity.data import load_dataset


def test_tfds_adapter_with_a_fake_tfds(monkeypatch):
    class Builder:
        def __init__(self, name, data_dir=None):
            self.info = types.SimpleNamespace(features={"label": types.SimpleNamespace(
                names=["a", "b"])})

        def download_and_prepare(self):
            pass

        def as_dataset(self, split, as_supervised, batch_size):
            n = 4 if split == "train" else 2
            return (np.zeros((n, 32, 32, 3), np.uint8), np.arange(n) % 2)

    fake = types.ModuleType("tensorflow_datasets")
    fake.builder = Builder
    fake.as_numpy = lambda x: x
    monkeypatch.setitem(sys.modules, "tensorflow_datasets", fake)
    data = load_dataset("cifar10")
    assert data.source == "tfds:cifar10" and data.x_train.shape == (4, 32, 32, 3)
    assert data.class_names == ["a", "b"]

    class Offline(Builder):
        def download_and_prepare(self):
            raise ConnectionError("no route to host")

    fake.builder = Offline
    with pytest.raises(DataError, match=r"could not load cifar10.*--data_dir"):
        load_dataset("cifar10")


def test_tfds_random_access_data_sources_feed_the_numpy_pipeline(monkeypatch):
    """The JAX route reads tensorflow_datasets through its array_record data
    sources (no TensorFlow): CIFAR into memory, ImageNet example by example."""
    from keras_identity.data import Normalization
    from keras_identity.data import arrays

    made = []

    class Builder:
        def __init__(self, name, data_dir=None, file_format=None):
            made.append((name, file_format))
            self.info = types.SimpleNamespace(features={"label": types.SimpleNamespace(
                names=["a", "b"])})

        def download_and_prepare(self):
            pass

        def as_data_source(self, split):
            n = 6 if split == "train" else 3
            size = 300 if made[-1][0] == "imagenet2012" else 32
            return [{"image": np.full((size, size + 20, 3), i, np.uint8), "label": i % 2}
                    for i in range(n)]

    fake = types.ModuleType("tensorflow_datasets")
    fake.builder = Builder
    monkeypatch.setitem(sys.modules, "tensorflow_datasets", fake)
    cifar = load_dataset("cifar10", random_access=True)
    assert made[-1] == ("cifar10", "array_record")
    assert cifar.x_train.shape == (6, 32, 52, 3) and list(cifar.y_test) == [0, 1, 0]
    imagenet = load_dataset("imagenet", random_access=True)
    assert imagenet.num_train == 6 and imagenet.num_test == 3
    stream = arrays.TrainBatches(imagenet, batch_size=6, normalization=Normalization.imagenet(),
                                 augmentation="imagenet", raw_pixels=True)
    x, y = stream[0]
    assert x.shape == (6, 224, 224, 3) and sorted(y) == [0, 0, 0, 1, 1, 1]
    assert sorted(np.unique(x)) == list(range(6))  # each image constant, once each
    stream.close()

"""Datasets from tensorflow_datasets (the ``data`` extra): downloaded, or
from a prepared data directory (ImageNet: with the manual download in
``<data_dir>/downloads/manual``), read through tf.data or through tfds's
random-access ``data_source`` (the JAX route's NumPy pipeline)."""

import os

import numpy as np

from keras_identity.data.errors import DataError
from keras_identity.data.facts import IMAGE_SHAPES
from keras_identity.data.image_dataset import ImageDataset
from keras_identity.data.image_dataset import expand_gray


def is_tfds_dir(path, name):
    """A tensorflow_datasets data_dir: prepared ``<name>/<version>/dataset_info.json``
    or a manual-download folder."""
    tfds_name = "imagenet2012" if name == "imagenet" else name
    prepared = os.path.join(path, tfds_name)
    if os.path.isdir(prepared):
        for version in os.listdir(prepared):
            if os.path.exists(os.path.join(prepared, version, "dataset_info.json")):
                return True
    return os.path.isdir(os.path.join(path, "downloads", "manual"))


def _data_source_arrays(source):
    """``(images, labels)`` of a random-access tfds data source, in memory."""
    examples = [source[i] for i in range(len(source))]
    images = np.stack([np.asarray(e["image"], np.uint8) for e in examples])
    return expand_gray(images), np.asarray([e["label"] for e in examples], np.int32)


def from_tfds(name, data_dir, random_access=False):
    """The dataset ``name`` from tensorflow_datasets (``data_dir``: its data
    directory, ``None`` for the default): CIFAR and MNIST in memory,
    ImageNet as streams; read through tf.data, or with ``random_access``
    through tfds's array_record ``data_source`` (no TensorFlow needed).
    :class:`DataError` saying what to do when tfds cannot load it."""
    try:
        import tensorflow_datasets as tfds
    except ImportError:
        raise DataError(f"loading {name} without --data_dir needs tensorflow-datasets "
                        f"(pip install 'keras_identity[data]'), or pass --data_dir with "
                        f"offline files (e.g. --data_dir=../shared/data).") from None
    tfds_name = "imagenet2012" if name == "imagenet" else name
    try:
        if random_access:
            # The array_record files that tfds.data_source reads without TensorFlow.
            builder = tfds.builder(tfds_name, data_dir=data_dir, file_format="array_record")
        else:
            builder = tfds.builder(tfds_name, data_dir=data_dir)
        builder.download_and_prepare()
        info = builder.info
        class_names = list(info.features["label"].names)
        if random_access:
            splits = ("train", "validation" if name == "imagenet" else "test")
            sources = [builder.as_data_source(split=split) for split in splits]
            if name == "imagenet":
                return ImageDataset(
                    name=name, num_classes=len(class_names), class_names=class_names,
                    image_shape=IMAGE_SHAPES[name], source=f"tfds:{tfds_name}",
                    tfds_train=(sources[0], len(sources[0])),
                    tfds_test=(sources[1], len(sources[1])))
            arrays = {}
            for split, source in zip(("train", "test"), sources):
                arrays[f"x_{split}"], arrays[f"y_{split}"] = _data_source_arrays(source)
        elif name == "imagenet":
            train = builder.as_dataset(split="train", as_supervised=True, shuffle_files=True)
            test = builder.as_dataset(split="validation", as_supervised=True)
            return ImageDataset(
                name=name, num_classes=len(class_names), class_names=class_names,
                image_shape=IMAGE_SHAPES[name], source=f"tfds:{tfds_name}",
                tfds_train=(train, info.splits["train"].num_examples),
                tfds_test=(test, info.splits["validation"].num_examples))
        else:
            arrays = {}
            for split in ("train", "test"):
                x, y = tfds.as_numpy(builder.as_dataset(split=split, as_supervised=True,
                                                        batch_size=-1))
                arrays[f"x_{split}"] = x.astype(np.uint8)
                arrays[f"y_{split}"] = y.astype(np.int32)
    except Exception as error:  # tfds raises many types (download, manual dir, ...)
        hint = ("ImageNet needs the manual download in <data_dir>/downloads/manual"
                if name == "imagenet" else
                "no internet? pass --data_dir with offline files (e.g. --data_dir="
                "../shared/data)")
        if random_access:
            hint += ("; the JAX route reads tfds's array_record files (a data_dir "
                     "prepared as tfrecord for tf.data is prepared again)")
        first_line = str(error).strip().splitlines()[0] if str(error).strip() else ""
        raise DataError(f"tensorflow_datasets could not load {tfds_name} "
                        f"({type(error).__name__}: {first_line[:200]}); {hint}.") from None
    return ImageDataset(name=name, num_classes=len(class_names), class_names=class_names,
                        image_shape=tuple(arrays["x_train"].shape[1:]),
                        source=f"tfds:{tfds_name}", **arrays)

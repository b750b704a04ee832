"""What a loaded dataset is: :class:`ImageDataset` (in-memory uint8
arrays, image files, or tensorflow_datasets streams), with its validation
split and subsets; :func:`expand_gray` gives gray images their channel axis."""

import dataclasses

import numpy as np

from keras_identity.data.errors import DataError


@dataclasses.dataclass
class ImageDataset:
    """Images and labels of one dataset.

    In-memory datasets hold uint8 arrays ``x_*`` of shape ``(n, h, w, c)``
    and int32 labels ``y_*``.  File-based datasets (ImageNet folders) hold
    ``files_*`` (paths) instead, and tfds-streamed ones ``tfds_*``.
    ``x_val``/``y_val`` are set by :meth:`with_validation_split`.
    """

    name: str
    num_classes: int
    class_names: list
    image_shape: tuple
    source: str
    x_train: np.ndarray = None
    y_train: np.ndarray = None
    x_test: np.ndarray = None
    y_test: np.ndarray = None
    x_val: np.ndarray = None
    y_val: np.ndarray = None
    files_train: list = None
    files_test: list = None
    tfds_train: object = None
    tfds_test: object = None
    # What the data came from, for a run's identity (keras_identity.data.fingerprints).
    fingerprint: str = None

    @property
    def in_memory(self):
        return self.x_train is not None

    @property
    def num_train(self):
        if self.x_train is not None:
            return len(self.x_train)
        if self.files_train is not None:
            return len(self.files_train[0])
        return self.tfds_train[1]

    @property
    def num_test(self):
        if self.x_test is not None:
            return len(self.x_test)
        if self.files_test is not None:
            return len(self.files_test[0])
        return self.tfds_test[1]

    def with_validation_split(self, fraction, seed=0):
        """Carves a validation set out of the training images (stratified).

        The test images are dropped, so a hyper-parameter search built on the
        result can never see them.
        """
        if not self.in_memory:
            raise DataError("a validation split needs an in-memory dataset (MNIST, CIFAR).")
        if not 0.0 < fraction < 1.0:
            raise ValueError(f"validation_split={fraction!r} is not valid; expected a "
                             f"number in (0, 1).")
        rng = np.random.default_rng(seed)
        val_index = []
        for label in np.unique(self.y_train):
            members = np.flatnonzero(self.y_train == label)
            take = max(1, int(round(fraction * len(members))))
            val_index.append(rng.choice(members, take, replace=False))
        val_index = np.sort(np.concatenate(val_index))
        keep = np.ones(len(self.y_train), bool)
        keep[val_index] = False
        return dataclasses.replace(
            self, x_train=self.x_train[keep], y_train=self.y_train[keep],
            x_val=self.x_train[val_index], y_val=self.y_train[val_index],
            x_test=None, y_test=None, source=f"{self.source}, validation split {fraction}")

    def subset(self, num_train=None, num_test=None, seed=0):
        """A class-balanced random subset (for quick runs and tests)."""
        rng = np.random.default_rng(seed)

        def pick(x, y, n):
            if x is None or n is None or n >= len(y):
                return x, y
            index = np.sort(rng.choice(len(y), n, replace=False))
            return x[index], y[index]

        x_train, y_train = pick(self.x_train, self.y_train, num_train)
        x_test, y_test = pick(self.x_test, self.y_test, num_test)
        return dataclasses.replace(self, x_train=x_train, y_train=y_train, x_test=x_test,
                                   y_test=y_test)


def expand_gray(x):
    """Images ``x`` as :class:`ImageDataset` holds them: ``(n, h, w)`` gray
    images given their channel axis, ``(n, h, w, 1)``; others as they are."""
    return x[..., None] if x.ndim == 3 else x

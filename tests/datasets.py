"""Small offline data sets for the tests: CIFAR-like ``.npz`` files, as
``--data_dir`` and ``load_dataset`` take them."""

import numpy as np


def cifar_like_npz(path, train, test, classes=10, rng=None):
    """Writes ``train`` and ``test`` random 32x32x3 uint8 images with labels
    in ``[0, classes)`` to ``path`` (drawn from ``rng``, else seed 0) and
    returns ``str(path)``."""
    rng = np.random.default_rng(0) if rng is None else rng
    np.savez(path, x_train=rng.integers(0, 256, (train, 32, 32, 3), dtype=np.uint8),
             y_train=rng.integers(0, classes, train),
             x_test=rng.integers(0, 256, (test, 32, 32, 3), dtype=np.uint8),
             y_test=rng.integers(0, classes, test))
    return str(path)

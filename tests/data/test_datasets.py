"""The registry: which source :func:`load_dataset` reads a ``data_dir``
with (a file, a tree, a folder holding one named after the dataset), and
what it refuses."""

import tarfile

import numpy as np
import pytest

from keras_identity.data import DataError
from keras_identity.data import load_dataset
from tests.data.image_trees import write_tree


def test_builtin_mnist_needs_no_network():
    data = load_dataset("mnist")
    assert data.x_train.shape == (60000, 28, 28, 1) and data.x_train.dtype == np.uint8
    assert data.x_test.shape == (10000, 28, 28, 1)
    assert data.num_classes == 10 and set(np.unique(data.y_train)) == set(range(10))
    assert "built-in" in data.source


def test_image_folder_and_archive_agree(tmp_path):
    root = tmp_path / "cifar10"
    write_tree(str(root), test_name="val")
    from_folder = load_dataset("cifar10", str(root))
    archive = tmp_path / "cifar10-png.tar.gz"
    with tarfile.open(archive, "w:gz") as tar:
        tar.add(str(root), arcname="cifar10")
    from_archive = load_dataset("cifar10", str(archive))
    for data in (from_folder, from_archive):
        assert data.class_names == ["cat", "dog"]
        assert data.x_train.shape == (6, 6, 6, 3) and data.x_test.shape == (6, 6, 6, 3)
        assert sorted(data.y_train.tolist()) == [0, 0, 0, 1, 1, 1]
    order = np.argsort(from_folder.y_train, kind="stable")
    order_b = np.argsort(from_archive.y_train, kind="stable")
    np.testing.assert_array_equal(np.sort(from_folder.x_train[order], axis=0),
                                  np.sort(from_archive.x_train[order_b], axis=0))
    # The parent folder finds the archive/folder by the dataset's name.
    assert load_dataset("cifar10", str(tmp_path)).num_train == 6


@pytest.mark.parametrize("name, path, words", [
    ("svhn", None, ["dataset='svhn'", "'cifar10'"]),
    ("cifar10", "/no/such/dir", ["data_dir='/no/such/dir' does not exist"]),
])
def test_bad_sources(name, path, words):
    with pytest.raises(ValueError) as error:
        load_dataset(name, path)
    for word in words:
        assert word in str(error.value)


def test_folder_without_the_dataset(tmp_path):
    (tmp_path / "notes.txt").write_text("x")
    with pytest.raises(DataError, match="holds no cifar100 data"):
        load_dataset("cifar100", str(tmp_path))
    bad = tmp_path / "x.zip"
    bad.write_bytes(b"PK")
    with pytest.raises(DataError, match="unknown file type"):
        load_dataset("cifar10", str(bad))

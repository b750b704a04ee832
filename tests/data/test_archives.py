import io
import os
import tarfile

import numpy as np
import pytest

from keras_identity.data import DataError
from keras_identity.data import load_dataset
from tests.data.image_trees import write_tree


def test_shared_cifar10_archive(shared_dir):
    data = load_dataset("cifar10", os.path.join(shared_dir, "data"))
    assert data.x_train.shape == (50000, 32, 32, 3) and data.x_test.shape == (10000, 32, 32, 3)
    assert data.class_names[:2] == ["airplane", "automobile"]
    assert np.bincount(data.y_train).tolist() == [5000] * 10


def test_unreadable_archive(tmp_path):
    path = tmp_path / "cifar10.tar.gz"
    path.write_bytes(io.BytesIO(b"not a tar").getvalue())
    with pytest.raises(DataError, match="cannot read the archive"):
        load_dataset("cifar10", str(path))


def test_truncated_archive_names_the_file(tmp_path):
    root = tmp_path / "tree"
    write_tree(str(root))
    path = tmp_path / "cifar10.tar.gz"
    with tarfile.open(path, "w:gz") as archive:
        archive.add(str(root), arcname="cifar10")
    raw = path.read_bytes()
    path.write_bytes(raw[:len(raw) * 2 // 3])
    with pytest.raises(DataError, match=r"cannot read the archive .*cifar10.tar.gz.*complete"):
        load_dataset("cifar10", str(path))

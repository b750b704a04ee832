"""keras_identity.data.decoded_archives: an archive decoded once is read back
with the same arrays, classes, source and fingerprint, without decoding; other
bytes, a broken entry or a folder that cannot be written decode as before."""

import os
import tarfile

import numpy as np
import pytest

from keras_identity.data import decoded_archives
from keras_identity.data import image_folders
from keras_identity.data import load_dataset
from tests.data.image_trees import write_tree


@pytest.fixture
def archive(tmp_path, monkeypatch):
    """A 12-image CIFAR-10-like archive, and a KERAS_HOME of the test's own
    that keeps archives of any size."""
    monkeypatch.setenv("KERAS_HOME", str(tmp_path / "home"))
    monkeypatch.setattr(decoded_archives, "MIN_IMAGES", 1)
    root = tmp_path / "tree"
    write_tree(str(root))
    path = tmp_path / "cifar10.tar.gz"
    with tarfile.open(path, "w:gz") as f:
        f.add(str(root), arcname="cifar10")
    return str(path)


def _no_decoding(monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("decoded again")
    monkeypatch.setattr(image_folders, "decode_all", refuse)


def _entries(tmp_path):
    folder = tmp_path / "home" / "keras_identity" / "decoded"
    return sorted(os.listdir(folder)) if folder.exists() else []


def test_a_decoded_archive_is_read_back_without_decoding(archive, tmp_path, monkeypatch):
    first = load_dataset("cifar10", archive)
    assert len(_entries(tmp_path)) == 1 and _entries(tmp_path)[0].startswith("cifar10-")
    _no_decoding(monkeypatch)
    again = load_dataset("cifar10", archive)
    for key in ("x_train", "y_train", "x_test", "y_test"):
        np.testing.assert_array_equal(getattr(again, key), getattr(first, key))
        assert getattr(again, key).dtype == getattr(first, key).dtype
    assert again.x_train.shape == (6, 6, 6, 3) and again.y_train.tolist() == [0, 0, 0, 1, 1, 1]
    assert (again.class_names, again.num_classes, again.image_shape) == (["cat", "dog"], 2,
                                                                         (6, 6, 3))
    assert (again.source, again.fingerprint) == (first.source, first.fingerprint)
    assert again.fingerprint.startswith("sha256:")


def test_other_bytes_or_a_broken_entry_are_decoded_again(archive, tmp_path, monkeypatch):
    first = load_dataset("cifar10", archive)
    # Another archive at the same path (one image changed): decoded, a second entry.
    root = tmp_path / "tree"
    from tests.data.image_trees import png

    (root / "train" / "cat" / "0000.png").write_bytes(png(200))
    with tarfile.open(archive, "w:gz") as f:
        f.add(str(root), arcname="cifar10")
    changed = load_dataset("cifar10", archive)
    assert changed.fingerprint != first.fingerprint
    assert int(changed.x_train[0, 0, 0, 0]) == 200 and int(first.x_train[0, 0, 0, 0]) == 0
    assert len(_entries(tmp_path)) == 2
    # An entry cut short is decoded again and rewritten.
    folder = tmp_path / "home" / "keras_identity" / "decoded"
    for name in _entries(tmp_path):
        (folder / name).write_bytes(b"PK\x03\x04 cut short")
    again = load_dataset("cifar10", archive)
    np.testing.assert_array_equal(again.x_train, changed.x_train)
    _no_decoding(monkeypatch)
    assert int(load_dataset("cifar10", archive).x_train[0, 0, 0, 0]) == 200


def test_a_folder_that_cannot_be_written_keeps_nothing(archive, tmp_path, monkeypatch):
    (tmp_path / "home").write_text("a file where the folder would be")
    data = load_dataset("cifar10", archive)
    assert data.x_train.shape == (6, 6, 6, 3)


def test_a_write_that_fails_leaves_no_partial_entry(archive, tmp_path, monkeypatch):
    def refuse(src, dst):
        raise OSError(28, "No space left on device")
    monkeypatch.setattr(decoded_archives.os, "replace", refuse)
    data = load_dataset("cifar10", archive)
    assert data.x_train.shape == (6, 6, 6, 3)
    assert (tmp_path / "home" / "keras_identity" / "decoded").is_dir()
    assert _entries(tmp_path) == []


def test_each_decoder_and_channel_count_has_its_own_entry(archive, tmp_path, monkeypatch):
    from keras_identity import _tensorflow

    first = load_dataset("cifar10", archive)
    monkeypatch.setattr(_tensorflow, "available", lambda: False)
    pillow = load_dataset("cifar10", archive)
    assert pillow.fingerprint.endswith("; decoded by Pillow")
    gray = load_dataset("mnist", archive)  # one channel
    assert gray.x_train.shape == (6, 6, 6, 1)
    names = _entries(tmp_path)
    expected = 2 if first.fingerprint.endswith("; decoded by Pillow") else 3
    assert len(names) == expected and sum(n.startswith("mnist-") for n in names) == 1


def test_small_archives_are_not_kept(archive, tmp_path, monkeypatch):
    monkeypatch.setattr(decoded_archives, "MIN_IMAGES", 1000)
    load_dataset("cifar10", archive)
    assert _entries(tmp_path) == []

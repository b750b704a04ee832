import io
import os
import sys
import tarfile
import types

import numpy as np
import pytest
from PIL import Image

from keras_identity.data import DataError
from keras_identity.data import load_dataset


def _png(value, size=(6, 6), channels=3):
    image = np.full(size + (channels,), value, np.uint8)
    buffer = io.BytesIO()
    Image.fromarray(image[..., 0] if channels == 1 else image).save(buffer, format="PNG")
    return buffer.getvalue()


def _write_tree(root, classes=("cat", "dog"), per_class=3, test_name="test"):
    for split in ("train", test_name):
        for c, name in enumerate(classes):
            folder = os.path.join(root, split, name)
            os.makedirs(folder, exist_ok=True)
            for i in range(per_class):
                with open(os.path.join(folder, f"{i:04d}.png"), "wb") as f:
                    f.write(_png(10 * c + i))


def test_builtin_mnist_needs_no_network():
    data = load_dataset("mnist")
    assert data.x_train.shape == (60000, 28, 28, 1) and data.x_train.dtype == np.uint8
    assert data.x_test.shape == (10000, 28, 28, 1)
    assert data.num_classes == 10 and set(np.unique(data.y_train)) == set(range(10))
    assert "built-in" in data.source


def test_npz_file(tmp_path):
    path = tmp_path / "d.npz"
    np.savez(path, x_train=np.zeros((5, 4, 4), np.uint8), y_train=np.arange(5),
             x_test=np.ones((2, 4, 4), np.uint8), y_test=np.array([1, 2]))
    data = load_dataset("mnist", str(path))
    assert data.x_train.shape == (5, 4, 4, 1) and data.y_test.tolist() == [1, 2]


def test_image_folder_and_archive_agree(tmp_path):
    root = tmp_path / "cifar10"
    _write_tree(str(root), test_name="val")
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


def test_shared_cifar10_archive(shared_dir):
    data = load_dataset("cifar10", os.path.join(shared_dir, "data"))
    assert data.x_train.shape == (50000, 32, 32, 3) and data.x_test.shape == (10000, 32, 32, 3)
    assert data.class_names[:2] == ["airplane", "automobile"]
    assert np.bincount(data.y_train).tolist() == [5000] * 10


def test_validation_split_is_stratified_and_drops_the_test_set():
    data = load_dataset("mnist").subset(num_train=2000, seed=1)
    split = data.with_validation_split(0.1, seed=0)
    assert len(split.x_val) + len(split.x_train) == 2000
    assert split.x_test is None and split.y_test is None
    counts = np.bincount(split.y_val, minlength=10) / np.bincount(data.y_train, minlength=10)
    assert np.all(np.abs(counts - 0.1) < 0.03)
    with pytest.raises(ValueError, match="validation_split=1.5"):
        data.with_validation_split(1.5)


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


def test_unreadable_archive(tmp_path):
    path = tmp_path / "cifar10.tar.gz"
    path.write_bytes(io.BytesIO(b"not a tar").getvalue())
    with pytest.raises(DataError, match="cannot read the archive"):
        load_dataset("cifar10", str(path))


# --- nothing bad gets through the loaders silently ------------------------------

def _npz(tmp_path, name="d.npz", x_train=None, y_train=None, x_test=None, y_test=None):
    rng = np.random.default_rng(0)
    arrays = dict(x_train=rng.integers(0, 256, (6, 4, 4), dtype=np.uint8),
                  y_train=np.arange(6) % 10, x_test=rng.integers(0, 256, (3, 4, 4),
                                                                 dtype=np.uint8),
                  y_test=np.array([1, 2, 3]))
    for key, value in dict(x_train=x_train, y_train=y_train, x_test=x_test,
                           y_test=y_test).items():
        if value is not None:
            arrays[key] = value
    path = tmp_path / name
    np.savez(path, **arrays)
    return str(path)


@pytest.mark.parametrize("scale", [1.0, 255.0])
def test_npz_float_images_are_converted_and_the_range_stated(tmp_path, scale):
    images = np.linspace(0, 1, 6 * 16).reshape(6, 4, 4).astype("float32")
    data = load_dataset("mnist", _npz(tmp_path, x_train=images * scale,
                                      x_test=np.full((3, 4, 4), 0.5 * scale, "float32")))
    np.testing.assert_array_equal(data.x_train[..., 0], np.round(images * 255).astype(np.uint8))
    assert data.x_test.max() == 128  # 0.5 of the range, rounded
    assert f"x_train: float in [0, {int(scale)}]" in data.source


@pytest.mark.parametrize("arrays, words", [
    (dict(x_train=np.full((6, 4, 4), 300, np.int16)),
     ["x_train has dtype int16", "[300, 300]", "uint8"]),
    (dict(x_train=np.full((6, 4, 4), 1.5, "float32") * 200),
     ["x_train has dtype float32", "[300, 300]"]),
    (dict(x_test=np.full((3, 4, 4), -0.5, "float32")), ["x_test", "[-0.5, -0.5]"]),
    (dict(y_train=np.array([0, 1, 2, -1, 3, 4])), ["y_train has labels in [-1, 4]",
                                                    "[0, 10)"]),
    (dict(y_train=np.array([0, 1, 2, 3, 4, 10])), ["labels in [0, 10]", "[0, 10)"]),
    (dict(y_test=np.array([0.5, 1, 2])), ["y_test has dtype float64", "non-integer"]),
    (dict(y_train=np.arange(5)), ["y_train has 5 labels for 6 images"]),
    (dict(x_test=np.zeros((3, 5, 5), np.uint8)), ["x_train images are (4, 4, 1)",
                                                  "(5, 5, 1)"]),
    (dict(x_train=np.zeros((6, 16), np.uint8)), ["x_train has shape (6, 16)"]),
])
def test_npz_with_data_it_would_corrupt_is_refused_naming_file_and_array(tmp_path, arrays,
                                                                         words):
    path = _npz(tmp_path, **arrays)
    with pytest.raises(DataError) as error:
        load_dataset("mnist", path)
    message = str(error.value)
    assert path in message and "\n" not in message
    for word in words:
        assert word in message


@pytest.mark.parametrize("damage", ["truncate", "flip"])
def test_damaged_npz_names_the_file(tmp_path, damage):
    path = _npz(tmp_path)
    raw = bytearray(open(path, "rb").read())
    if damage == "truncate":
        raw = raw[:len(raw) // 2]
    else:
        for i in range(len(raw) // 3, len(raw) // 3 + 64):
            raw[i] ^= 0xFF
    open(path, "wb").write(bytes(raw))
    with pytest.raises(DataError, match=f"cannot read {path}"):
        load_dataset("mnist", path)


def test_random_bytes_and_pickled_npz_never_suggest_unpickling(tmp_path):
    garbage = tmp_path / "garbage.npz"
    garbage.write_bytes(np.random.default_rng(0).bytes(4096))
    with pytest.raises(DataError) as error:
        load_dataset("mnist", str(garbage))
    assert "not a valid .npz file" in str(error.value) and "allow_pickle" not in str(error.value)
    pickled = tmp_path / "pickled.npz"
    np.savez(pickled, x_train=np.array([{"a": 1}], dtype=object), y_train=np.zeros(1),
             x_test=np.zeros((1, 28, 28), np.uint8), y_test=np.zeros(1))
    with pytest.raises(DataError) as error:
        load_dataset("mnist", str(pickled))
    assert "object (pickled) arrays, which are never loaded" in str(error.value)
    assert "allow_pickle" not in str(error.value)


def test_truncated_archive_names_the_file(tmp_path):
    root = tmp_path / "tree"
    _write_tree(str(root))
    path = tmp_path / "cifar10.tar.gz"
    with tarfile.open(path, "w:gz") as archive:
        archive.add(str(root), arcname="cifar10")
    raw = path.read_bytes()
    path.write_bytes(raw[:len(raw) * 2 // 3])
    with pytest.raises(DataError, match=r"cannot read the archive .*cifar10.tar.gz.*complete"):
        load_dataset("cifar10", str(path))


def test_a_broken_or_odd_sized_image_is_named(tmp_path):
    root = tmp_path / "tree"
    _write_tree(str(root))
    bad = root / "train" / "dog" / "0001.png"
    bad.write_bytes(b"not an image at all")
    with pytest.raises(DataError, match=r"train/dog/0001.png is not a readable image"):
        load_dataset("cifar10", str(root))
    bad.write_bytes(_png(3, size=(8, 6)))
    with pytest.raises(DataError, match=r"train/dog/0001.png is 6x8x3, other images .* "
                                        r"are 6x6x3"):
        load_dataset("cifar10", str(root))

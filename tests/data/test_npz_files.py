import numpy as np
import pytest

from keras_identity.data import DataError
from keras_identity.data import load_dataset


def test_npz_file(tmp_path):
    path = tmp_path / "d.npz"
    np.savez(path, x_train=np.zeros((5, 4, 4), np.uint8), y_train=np.arange(5),
             x_test=np.ones((2, 4, 4), np.uint8), y_test=np.array([1, 2]))
    data = load_dataset("mnist", str(path))
    assert data.x_train.shape == (5, 4, 4, 1) and data.y_test.tolist() == [1, 2]


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

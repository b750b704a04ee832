"""keras_identity.models.load_model: a .keras file naming unknown classes."""

import keras
import pytest

import keras_identity as ki


def _saved_with(tmp_path, package, name):
    """A .keras file with a layer registered as ``package>name``, then
    forgotten (as by a program that does not define it)."""
    layer_class = type(name, (keras.layers.Layer,), {"call": lambda self, x: x})
    keras.saving.register_keras_serializable(package=package)(layer_class)
    inputs = keras.Input((3,))
    model = keras.Model(inputs, layer_class()(keras.layers.Dense(2)(inputs)))
    path = str(tmp_path / f"{name}.keras")
    model.save(path)
    keras.saving.get_custom_objects().pop(f"{package}>{name}")
    return path


def test_a_class_of_another_version_is_named(tmp_path):
    path = _saved_with(tmp_path, "keras_identity", "FutureUnit")
    assert ki.models.saving.unknown_classes(path) == ["keras_identity>FutureUnit"]
    with pytest.raises(ValueError) as error:
        ki.models.load_model(path)
    message = str(error.value)
    assert "\n" not in message and path in message
    assert f"keras_identity {ki.__version__} has no class FutureUnit" in message


def test_a_class_of_another_package_says_what_registers_it(tmp_path):
    path = _saved_with(tmp_path, "theirs", "TheirLayer")
    with pytest.raises(ValueError, match=r"theirs>TheirLayer is not registered: import the "
                                         r"module that defines it \(decorated with "
                                         r"keras.saving.register_keras_serializable\)"):
        ki.models.load_model(path)


def test_a_file_that_is_no_archive_is_one_line(tmp_path):
    path = tmp_path / "model.keras"
    path.write_bytes(b"not a zip")
    with pytest.raises(ValueError, match=f"not a readable .keras file: {path}"):
        ki.models.load_model(str(path))
    assert ki.models.saving.unknown_classes(str(path)) == []


def test_a_model_of_the_package_loads(tmp_path):
    model = ki.models.preact_resnet(11, input_shape=(8, 8, 3), num_classes=3)
    path = str(tmp_path / "pre11.keras")
    model.save(path)
    assert ki.models.saving.unknown_classes(path) == []
    assert ki.models.load_model(path).count_params() == model.count_params()

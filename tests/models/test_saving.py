"""keras_identity.models.load_model: a .keras file naming unknown classes."""

import keras
import numpy as np
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
    with pytest.raises(ValueError, match=f"not a readable .keras file: {path} \\(not a zip "
                                         f"archive, as a .keras file is: cut short, "
                                         f"overwritten or another kind of file\\)$"):
        ki.models.load_model(str(path))
    assert ki.models.saving.unknown_classes(str(path)) == []


def test_a_cut_or_garbled_archive_is_not_called_missing(tmp_path):
    """Keras calls a file that is no zip archive "File not found"."""
    model = ki.models.preact_resnet(11, input_shape=(8, 8, 3), num_classes=3)
    whole = tmp_path / "whole.keras"
    model.save(whole)
    data = whole.read_bytes()
    for name, garbled, reason in (
            ("cut", data[:len(data) // 2], "not a zip archive"),
            ("random", np.random.default_rng(0).bytes(len(data)), "not a zip archive"),
            ("garbled", bytes(b ^ 0x5A for b in data[:4096]) + data[4096:], "BadZipFile")):
        path = tmp_path / f"{name}.keras"
        path.write_bytes(garbled)
        with pytest.raises(ValueError, match=f"not a readable .keras file: {path} .*{reason}"):
            ki.models.load_model(str(path))


def test_a_model_of_the_package_loads(tmp_path):
    model = ki.models.preact_resnet(11, input_shape=(8, 8, 3), num_classes=3)
    path = str(tmp_path / "pre11.keras")
    model.save(path)
    assert ki.models.saving.unknown_classes(path) == []
    assert ki.models.load_model(path).count_params() == model.count_params()


def test_a_module_the_file_names_is_never_imported(tmp_path):
    """A .keras file naming a module (unregistered class) must not make the
    loader import it: a file is data, never code."""
    import json
    import sys
    import zipfile

    model = ki.models.preact_resnet(11, input_shape=(8, 8, 3), num_classes=3)
    path = tmp_path / "pre11.keras"
    model.save(str(path))
    planted = tmp_path / "planted_module_xyz.py"
    planted.write_text("raise SystemExit('imported')\n")
    with zipfile.ZipFile(path) as archive:
        files = {name: archive.read(name) for name in archive.namelist()}
    config = json.loads(files["config.json"])
    config["config"]["layers"][-1].update(module="planted_module_xyz", class_name="Evil",
                                          registered_name=None)
    files["config.json"] = json.dumps(config).encode()
    with zipfile.ZipFile(path, "w") as archive:
        for name, data in files.items():
            archive.writestr(name, data)
    sys.path.insert(0, str(tmp_path))
    try:
        assert ki.models.saving.unknown_classes(str(path)) == ["planted_module_xyz.Evil"]
        with pytest.raises(ValueError, match="planted_module_xyz.Evil is not registered"):
            ki.models.load_model(str(path))
        assert "planted_module_xyz" not in sys.modules
    finally:
        sys.path.remove(str(tmp_path))

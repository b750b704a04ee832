import os
import subprocess
import sys

import keras
import numpy as np
import pytest
tf = pytest.importorskip("tensorflow")  # TensorFlow-only module

import keras_identity as ki
from keras_identity.data import Normalization
from keras_identity.serving import export_saved_model
from keras_identity.serving import next_version
from tests.serving import emulator_for_backend
from keras_identity.serving.warmup import encode_png
from keras_identity.serving.warmup import read_warmup
from tests.backend import jax_only
from tests.backend import tensorflow_only

pytestmark = [pytest.mark.core_leg, pytest.mark.needs_tensorflow]


def saved_model_cli():
    return os.path.join(os.path.dirname(sys.executable), "saved_model_cli")


def test_versioned_layout(cifar_export):
    assert cifar_export["version_dir"].endswith(os.path.join("pre11", "1"))
    for name in ("saved_model.pb", "variables", "assets.extra/tf_serving_warmup_requests"):
        assert os.path.exists(os.path.join(cifar_export["version_dir"], name))
    assert next_version(cifar_export["base"]) == 2


def test_saved_model_cli_lists_the_signatures(cifar_export):
    text = subprocess.run([saved_model_cli(), "show", "--dir", cifar_export["version_dir"],
                           "--all"], capture_output=True, text=True, check=True).stdout
    for name in ("serving_default", "serving_bytes", "serving_uint8"):
        assert f"signature_def['{name}']" in text
    assert "inputs['image_bytes']" in text and "inputs['images']" in text
    for output in ("probabilities", "classes", "scores", "class_names"):
        assert f"outputs['{output}']" in text
    assert "shape: (-1, -1, -1, 3)" in text
    assert "DT_BFLOAT16" not in text and "DT_HALF" not in text


FRESH = r"""
import sys, numpy as np, tensorflow as tf
loaded = tf.saved_model.load(sys.argv[1])
images = np.load(sys.argv[2])
pngs = np.load(sys.argv[3], allow_pickle=True)
out = {
    "float": loaded.signatures["serving_default"](images=tf.constant(images, tf.float32)),
    "uint8": loaded.signatures["serving_uint8"](images=tf.constant(images)),
    "bytes": loaded.signatures["serving_bytes"](image_bytes=tf.constant(list(pngs))),
}
np.savez(sys.argv[4], **{k: v["probabilities"].numpy() for k, v in out.items()},
         names=out["float"]["class_names"].numpy().astype(str))
"""


def test_fresh_process_matches_model_predict(cifar_export, tmp_path):
    images = cifar_export["images"]
    np.save(tmp_path / "images.npy", images)
    np.save(tmp_path / "pngs.npy", np.array([encode_png(i) for i in images], dtype=object))
    script = tmp_path / "fresh.py"
    script.write_text(FRESH)
    subprocess.run([sys.executable, str(script), cifar_export["version_dir"],
                    str(tmp_path / "images.npy"), str(tmp_path / "pngs.npy"),
                    str(tmp_path / "out.npz")], check=True, capture_output=True)
    out = np.load(tmp_path / "out.npz")
    for key in ("float", "uint8", "bytes"):
        np.testing.assert_allclose(out[key], cifar_export["expected"], atol=1e-5)
    top = cifar_export["expected"].argmax(axis=1)
    names = cifar_export["prep"]["class_names"]
    assert list(out["names"][:, 0]) == [names[i] for i in top]


def test_warmup_requests_parse_and_replay(cifar_export):
    requests = read_warmup(cifar_export["version_dir"])
    assert sorted(r.model_spec.signature_name for r in requests) == [
        "serving_bytes", "serving_default", "serving_uint8"]
    assert all(r.model_spec.name == "pre11" for r in requests)
    responses = emulator_for_backend(cifar_export["version_dir"]).replay_warmup()
    probabilities = [tf.make_ndarray(r.outputs["probabilities"]) for r in responses]
    for p in probabilities:
        assert p.shape == (2, 10)
        np.testing.assert_allclose(p.sum(axis=1), 1.0, rtol=1e-5)
    # The same two images through every signature give the same answer.
    np.testing.assert_allclose(probabilities[0], probabilities[1], atol=1e-5)
    np.testing.assert_allclose(probabilities[0], probabilities[2], atol=1e-5)


def test_existing_version_is_not_overwritten(cifar_export, tmp_path):
    with pytest.raises(ValueError, match="exists"):
        export_saved_model(cifar_export["model"], cifar_export["base"], cifar_export["prep"],
                           version=1, warmup=False)


def _tiny_imagenet_model():
    inputs = keras.Input((224, 224, 3))
    x = keras.layers.Conv2D(4, 3, strides=4)(inputs)
    x = keras.layers.GlobalAveragePooling2D()(x)
    return keras.Model(inputs, keras.layers.Dense(5, activation="softmax")(x))


def test_imagenet_bytes_are_resized_and_center_cropped(tmp_path, rng):
    model = _tiny_imagenet_model()
    prep = {"normalization": Normalization.imagenet(), "image_shape": [224, 224, 3],
            "eval_resize": 256, "class_names": list("abcde")}
    version_dir = export_saved_model(model, str(tmp_path), prep, warmup=False)
    photo = rng.integers(0, 256, (300, 400, 3)).astype(np.uint8)
    out = emulator_for_backend(version_dir).run(
        "serving_bytes", {"image_bytes": np.array([encode_png(photo)], dtype=object)})
    crop = ki.data.augment.center_crop(photo, 256, 224)
    expected = model.predict(np.asarray(prep["normalization"](crop))[None], verbose=0)
    np.testing.assert_allclose(out["probabilities"], expected, atol=1e-5)


@pytest.mark.parametrize("build, shape", [
    (lambda: ki.models.highway_net(4, width=8), (28, 28, 1)),
    (lambda: ki.models.plain_net(4, width=8), (28, 28, 1)),
    (lambda: ki.models.resnet(8, shortcut="conv1x1"), (32, 32, 3)),
    (lambda: ki.models.highway_net(7, dataset="cifar10", width=4), (32, 32, 3)),
])
def test_every_family_exports(build, shape, tmp_path, rng):
    model = build()
    images = rng.integers(0, 256, (3,) + shape).astype(np.uint8)
    prep = {"normalization": Normalization("scale"), "image_shape": list(shape),
            "eval_resize": None, "class_names": None}
    emulator = emulator_for_backend(export_saved_model(model, str(tmp_path), prep))
    expected = model.predict(images / 255.0, verbose=0)
    out = emulator.run("serving_bytes",
                       {"image_bytes": np.array([encode_png(i) for i in images], dtype=object)})
    np.testing.assert_allclose(out["probabilities"], expected, atol=1e-5)
    assert emulator.run("serving_uint8", {"images": images})["class_names"][0, 0] in \
        [str(i).encode() for i in range(10)]
    assert len(emulator.replay_warmup()) == 3


def test_mixed_precision_model_serves_float32(tmp_path, rng):
    keras.config.set_dtype_policy("mixed_bfloat16")
    model = ki.models.preact_resnet(11)
    keras.config.set_dtype_policy("float32")
    prep = {"normalization": Normalization("scale"), "image_shape": [32, 32, 3],
            "eval_resize": None, "class_names": None}
    images = rng.integers(0, 256, (2, 32, 32, 3)).astype(np.uint8)
    mixed = emulator_for_backend(export_saved_model(model, str(tmp_path / "a"), prep))
    exact = emulator_for_backend(export_saved_model(model, str(tmp_path / "b"), prep, float32=True))
    a = mixed.run("serving_uint8", {"images": images})["probabilities"]
    b = exact.run("serving_uint8", {"images": images})["probabilities"]
    assert a.dtype == np.float32 and b.dtype == np.float32
    np.testing.assert_allclose(b, model.predict(images / 255.0, verbose=0), atol=0.05)
    np.testing.assert_allclose(a, b, atol=0.05)
    clone = ki.models.to_float32(model)
    assert clone.get_layer("stage1_unit1").compute_dtype == "float32"
    np.testing.assert_allclose(clone.predict(images / 255.0, verbose=0), b, atol=1e-5)


@pytest.mark.slow
def test_resnet1001_exports(tmp_path, rng):
    model = ki.models.preact_resnet(1001)
    prep = {"normalization": Normalization("scale"), "image_shape": [32, 32, 3],
            "eval_resize": None, "class_names": None}
    images = rng.integers(0, 256, (2, 32, 32, 3)).astype(np.uint8)
    out = emulator_for_backend(export_saved_model(model, str(tmp_path), prep)).run(
        "serving_uint8", {"images": images})
    np.testing.assert_allclose(out["probabilities"], model.predict(images / 255.0, verbose=0),
                               atol=1e-5)


# --- the bytes signature bounds what it decodes (issue 20: 10) ----------------

def _png_header_claiming(width, height):
    """A PNG whose header declares width x height pixels (a decompression
    bomb's header: its data would inflate to that many pixels)."""
    import struct
    import zlib

    ihdr = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    chunk = lambda kind, data: (struct.pack(">I", len(data)) + kind + data  # noqa: E731
                                + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF))
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr)
            + chunk(b"IDAT", zlib.compress(b"\x00" * 64)) + chunk(b"IEND", b""))


def test_image_pixels_reads_the_header_of_each_format():
    from keras_identity.serving.signatures import image_pixels

    image = np.zeros((12, 20, 3), np.uint8)
    for encoded in (tf.io.encode_png(image), tf.io.encode_jpeg(image),
                    tf.io.encode_bmp(image) if hasattr(tf.io, "encode_bmp") else None):
        if encoded is not None:
            assert int(image_pixels(encoded)) == 240
    assert int(image_pixels(tf.constant(_png_header_claiming(100_000, 100_000)))) == 10 ** 10
    assert int(image_pixels(tf.constant(b"GIF89a" + bytes([20, 0, 12, 0]) + b"\x00" * 20))) \
        == 240
    assert int(image_pixels(tf.constant(b"not an image, long enough"))) == -1


def test_bytes_signature_refuses_images_over_the_bounds(tmp_path):
    keras.utils.set_random_seed(0)
    model = ki.models.preact_resnet(11, input_shape=(32, 32, 3))
    prep = {"normalization": Normalization("scale"), "image_shape": [32, 32, 3],
            "eval_resize": None, "class_names": None}
    version_dir = export_saved_model(model, str(tmp_path / "m"), prep, warmup=False,
                                     max_image_bytes=4096, max_image_pixels=48 * 48)
    serve = tf.saved_model.load(version_dir).signatures["serving_bytes"]
    ok = encode_png(np.full((32, 32, 3), 7, np.uint8))
    assert serve(image_bytes=tf.constant([ok]))["probabilities"].shape == (1, 10)
    cases = [(_png_header_claiming(100_000, 100_000), "max_image_pixels=2304"),
             (encode_png(np.zeros((64, 64, 3), np.uint8)), "max_image_pixels=2304"),
             (tf.io.encode_jpeg(np.zeros((64, 49, 3), np.uint8)).numpy(),
              "max_image_pixels=2304"),
             (encode_png(np.random.default_rng(0).integers(0, 256, (40, 40, 3),
                                                            dtype=np.uint8)),
              "max_image_bytes=4096")]
    for encoded, words in cases:
        with pytest.raises(tf.errors.InvalidArgumentError, match=words):
            serve(image_bytes=tf.constant([ok, encoded]))
    with pytest.raises(ValueError, match="max_image_pixels=0"):
        export_saved_model(model, str(tmp_path / "n"), prep, max_image_pixels=0)


# --- self-contained models: Keras's own model.export, and no preprocessing ----

KERAS_EXPORT_FRESH = """
import sys
import numpy as np
import tensorflow as tf
for exported in sys.argv[1:]:
    served = tf.saved_model.load(exported)
    images = np.load(exported + ".images.npy")
    np.save(exported + ".out.npy", served.serve(tf.constant(images)).numpy())
"""

KERAS_EXPORTS = {
    "preact_resnet11": (lambda: ki.models.preact_resnet(
        11, include_preprocessing=True, normalization="per_channel"), (32, 32, 3)),
    "preact_resnet38_scan": (lambda: ki.models.preact_resnet(
        38, stage_mode="scan", recompute="bn_relu", include_preprocessing=True,
        normalization="per_pixel_mean"), (32, 32, 3)),
    "highway10": (lambda: ki.models.highway_net(10, include_preprocessing=True), (28, 28, 1)),
    "highway7_conv": (lambda: ki.models.highway_net(
        7, dataset="cifar10", width=4, include_preprocessing=True, normalization="scale"),
        (32, 32, 3)),
}


@pytest.fixture(scope="module")
def keras_exports(tmp_path_factory):
    """Each of KERAS_EXPORTS exported by ``model.export`` with the outputs of
    its ``predict`` on three images, and those of the exports loaded in one
    fresh process (one TensorFlow start for the four)."""
    root = tmp_path_factory.mktemp("keras_exports")
    rng = np.random.default_rng(0)
    expected = {}
    for name, (build, shape) in KERAS_EXPORTS.items():
        keras.utils.set_random_seed(1234)
        model = build()
        images = rng.integers(0, 256, (3,) + shape).astype(np.float32)
        layer = model.get_layer("preprocessing")
        if not layer.adapted:
            layer.adapt(rng.integers(0, 256, (16,) + shape).astype(np.uint8))
        model.export(str(root / name), verbose=False)
        np.save(root / f"{name}.images.npy", images)
        expected[name] = model.predict(images, verbose=0)
        keras.backend.clear_session()
    script = root / "fresh.py"
    script.write_text(KERAS_EXPORT_FRESH)
    subprocess.run([sys.executable, str(script), *(str(root / name) for name in KERAS_EXPORTS)],
                   check=True, capture_output=True, env=dict(os.environ, KERAS_BACKEND="tensorflow"))
    return {name: (np.load(root / f"{name}.out.npy"), expected[name]) for name in KERAS_EXPORTS}


@pytest.mark.parametrize("name", list(KERAS_EXPORTS))
def test_keras_model_export_matches_predict_in_a_fresh_process(name, keras_exports):
    """``model.export(path)`` (Keras's own) of a model with its preprocessing:
    raw pixels in, the outputs of ``predict`` out, in a process that has
    neither Keras nor keras_identity imported."""
    served, predicted = keras_exports[name]
    np.testing.assert_allclose(served, predicted, atol=2e-5)


def test_a_model_without_preprocessing_is_refused_unless_it_takes_raw_pixels(tmp_path, rng):
    """No preprocessing layer and no normalisation given: the pixel signatures
    would feed 0-255 values to a model trained on normalised inputs, so the
    export is refused, writing nothing, unless ``raw_pixels`` says the model
    takes pixels as they are."""
    model = ki.models.highway_net(10)
    with pytest.raises(ValueError, match=r"^the model has no preprocessing layer and no "
                                         r"preprocessing was given \(--preprocessing\), so the "
                                         r"pixel signatures would feed it pixel values in "
                                         r"\[0, 255\] unnormalised; build it with "
                                         r"include_preprocessing=True"):
        export_saved_model(model, str(tmp_path))
    assert os.listdir(tmp_path) == []
    images = rng.integers(0, 256, (2, 28, 28, 1)).astype(np.uint8)
    version = export_saved_model(model, str(tmp_path), raw_pixels=True)
    out = emulator_for_backend(version).run("serving_uint8", {"images": images})
    np.testing.assert_allclose(out["probabilities"],
                               model.predict(images.astype(np.float32), verbose=0), atol=1e-5)
    assert "feeds it pixel values in [0, 255]" in (
        tmp_path / "1" / "assets.extra" / "inputs.txt").read_text()


def test_an_export_dir_that_is_a_file_is_one_line(cifar_export, tmp_path):
    path = tmp_path / "a-file"
    path.write_text("x")
    with pytest.raises(ValueError, match=r"export_dir=.*a-file' is a file; expected a "
                                         r"directory of numbered versions"):
        export_saved_model(cifar_export["model"], str(path))
    assert path.read_text() == "x"



def test_a_preset_exports_and_serves_its_test_digits(tmp_path):
    """A network built from a preset (``weights="mnist"``) exports and serves
    the built-in MNIST's test digits as it predicts them."""
    model = ki.models.highway_net(10, weights="mnist")
    data = ki.data.load_dataset("mnist")
    images, labels = data.x_test[:16], data.y_test[:16]
    prep = {"normalization": Normalization("scale"), "image_shape": [28, 28, 1],
            "eval_resize": None, "class_names": [str(i) for i in range(10)]}
    emulator = emulator_for_backend(export_saved_model(model, str(tmp_path), prep, warmup=False))
    out = emulator.run("serving_bytes",
                       {"image_bytes": np.array([encode_png(i) for i in images], dtype=object)})
    expected = model.predict(images / 255.0, verbose=0)
    np.testing.assert_allclose(out["probabilities"], expected, atol=1e-5)
    served = [int(c[0]) for c in out["class_names"]]
    assert served == list(np.argmax(expected, -1)) and np.mean(np.equal(served, labels)) >= 0.9


@tensorflow_only
def test_jit_compile_export_serves_the_same_outputs_and_needs_the_xla_flag(tmp_path, rng):
    """``jit_compile=True``: the looped model's forward pass as one XLA
    computation in every signature, the same probabilities as the default
    export; the emulator, as TF Serving, runs it only with
    ``xla_cpu_compilation_enabled`` and the default export without it."""
    from keras_identity.serving.emulator import ServingEmulator
    from keras_identity.serving.emulator import needs_xla

    keras.utils.set_random_seed(3)
    model = ki.models.preact_resnet(20, stage_mode="scan", include_preprocessing=True)
    model.get_layer("preprocessing").adapt(rng.uniform(0, 255, (16, 32, 32, 3)))
    for layer in model.layers:  # moving statistics that are not the initial 0 and 1
        for variable in layer.non_trainable_variables:
            if "moving" in variable.path:
                low = 0.5 if "variance" in variable.path else -0.2
                variable.assign(rng.uniform(low, low + 0.7, variable.shape))
    images = rng.uniform(0, 255, (3, 32, 32, 3)).astype(np.float32)
    expected = model.predict(images, verbose=0)
    plain = export_saved_model(model, str(tmp_path / "plain"), warmup=False)
    compiled = export_saved_model(model, str(tmp_path / "xla"), jit_compile=True)
    with pytest.raises(ValueError, match=r"--xla_cpu_compilation_enabled=true"):
        ServingEmulator(compiled)
    emulator = ServingEmulator(compiled, xla_cpu_compilation_enabled=True)
    assert emulator.needs_xla == {"jit_compile"} and ServingEmulator(plain).needs_xla == set()
    assert len(emulator.replay_warmup()) == 3
    for signature, fed in (("serving_default", images),
                           ("serving_uint8", images.round().astype(np.uint8))):
        out = emulator.run(signature, {"images": fed})
        reference = expected if signature == "serving_default" else model.predict(
            fed.astype(np.float32), verbose=0)
        np.testing.assert_allclose(out["probabilities"], reference, atol=2e-5)
        assert 0.05 < out["probabilities"].max() < 0.999  # outputs that can differ
    functions = emulator.graph.as_graph_def().library.function
    assert sum(f.attr["_XlaMustCompile"].b for f in functions
               if "_XlaMustCompile" in f.attr) >= 1  # the model's forward pass
    with pytest.raises(ValueError, match="xla_cpu_compilation_enabled=1 is not valid"):
        ServingEmulator(plain, xla_cpu_compilation_enabled=1)
    assert needs_xla(tf.compat.v1.GraphDef()) == set()


@jax_only
def test_a_jax_export_needs_the_xla_flag_and_refuses_jit_compile(cifar_export, tmp_path):
    """A JAX-backend export runs its model in an ``XlaCallModule``: TF
    Serving (the emulator) serves it only with XLA enabled; ``jit_compile``
    does not apply to it."""
    from keras_identity.serving.emulator import ServingEmulator

    with pytest.raises(ValueError, match=r"XlaCallModule.*--xla_cpu_compilation_enabled"):
        ServingEmulator(cifar_export["version_dir"])
    assert ServingEmulator(cifar_export["version_dir"],
                           xla_cpu_compilation_enabled=True).needs_xla == {"XlaCallModule"}
    with pytest.raises(ValueError, match="jit_compile=True applies to the TensorFlow backend"):
        export_saved_model(cifar_export["model"], str(tmp_path), cifar_export["prep"],
                           jit_compile=True)
    assert not os.listdir(tmp_path)

"""Requests as TF Serving receives them: gRPC protos, REST JSON, and bad input."""

import base64

import numpy as np
import pytest
tf = pytest.importorskip("tensorflow")  # TensorFlow-only module

from keras_identity.serving import server
from tests.serving import emulator_for_backend
from keras_identity.serving.warmup import encode_png
from keras_identity.serving.warmup import serving_apis

# SavedModels: TensorFlow on every backend.
pytestmark = pytest.mark.needs_tensorflow


@pytest.fixture(scope="module")
def emulator(cifar_export):
    return emulator_for_backend(cifar_export["version_dir"])


def b64(image):
    return base64.b64encode(encode_png(image)).decode()


def test_grpc_predict_request(emulator, cifar_export):
    predict_pb2, _ = serving_apis()
    request = predict_pb2.PredictRequest()
    request.model_spec.name = "pre11"
    request.model_spec.signature_name = "serving_uint8"
    request.inputs["images"].CopyFrom(tf.make_tensor_proto(cifar_export["images"]))
    request.output_filter.append("probabilities")
    response = emulator.predict(request)
    assert list(response.outputs) == ["probabilities"]
    np.testing.assert_allclose(tf.make_ndarray(response.outputs["probabilities"]),
                               cifar_export["expected"], atol=1e-5)


def test_rest_row_format_with_b64(emulator, cifar_export):
    images = cifar_export["images"]
    for instances in ([{"image_bytes": {"b64": b64(i)}} for i in images],
                      [{"b64": b64(i)} for i in images]):
        body = {"signature_name": "serving_bytes", "instances": instances}
        predictions = server.predict(emulator, body)["predictions"]
        assert len(predictions) == len(images)
        np.testing.assert_allclose([p["probabilities"] for p in predictions],
                                   cifar_export["expected"], atol=1e-5)
        assert predictions[0]["class_names"][0] in cifar_export["prep"]["class_names"]
        assert isinstance(predictions[0]["classes"][0], int)


def test_rest_columnar_format(emulator, cifar_export):
    images = cifar_export["images"].astype(float).tolist()
    for inputs in ({"images": images}, images):
        response = server.predict(emulator, {"inputs": inputs})
        np.testing.assert_allclose(response["outputs"]["probabilities"],
                                   cifar_export["expected"], atol=1e-5)


@pytest.mark.parametrize("signature, inputs, message", [
    ("serving_bytes", {"image_bytes": np.array([b"not an image"], dtype=object)},
     "Unknown image file format"),
    ("serving_default", {"images": np.zeros((1, 28, 28, 3), np.float32)},
     "images must have shape (batch, 32, 32, 3)"),
    ("serving_default", {"images": np.zeros((1, 32, 32, 3), np.int32)},
     "Expects arg[0] to be float32 but int32 is provided"),
    ("serving_uint8", {"images": np.zeros((1, 32, 32, 1), np.uint8)},
     "does not match the signature's"),
    ("serving_default", {"pixels": np.zeros((1, 32, 32, 3), np.float32)},
     "do not match the signature's"),
    ("classify", {"images": np.zeros((1, 32, 32, 3), np.float32)}, "not found"),
    ("serving_default", {"images": np.full((1, 32, 32, 3), np.nan, np.float32)},
     "every value must be finite"),
    ("serving_default", {"images": np.full((1, 32, 32, 3), np.inf, np.float32)},
     "every value must be finite"),
    ("serving_default", {"images": np.full((1, 32, 32, 3), -5.0, np.float32)},
     "pixel values must lie in [0, 255]"),
    ("serving_default", {"images": np.full((1, 32, 32, 3), 1e30, np.float32)},
     "pixel values must lie in [0, 255]"),
])
def test_bad_requests_are_invalid_argument(emulator, signature, inputs, message):
    with pytest.raises(tf.errors.InvalidArgumentError) as error:
        emulator.run(signature, inputs)
    assert message in error.value.message


@pytest.mark.parametrize("body, message", [
    ({"signature_name": "serving_bytes", "instances": [{"b64": "%%%"}]}, "not valid base64"),
    ({"instances": [], "inputs": {}}, "exactly one of"),
    ({"instances": []}, "non-empty list"),
    ({"inputs": {"images": [["a"]]}}, "cannot be converted to float32"),
    ({"signature_name": "serving_bytes", "instances": [{"image_bytes": {"x": 1}}]},
     "only {\"b64\""),
])
def test_bad_rest_bodies(emulator, body, message):
    with pytest.raises(tf.errors.InvalidArgumentError) as error:
        server.predict(emulator, body)
    assert message in error.value.message


def test_pixel_bounds_are_accepted(emulator, cifar_export):
    # 0 and 255 are pixels; the refusal is of what lies outside them.
    images = np.zeros((2, 32, 32, 3), np.float32)
    images[1] = 255.0
    outputs = emulator.run("serving_default", {"images": images})
    np.testing.assert_allclose(outputs["probabilities"].sum(axis=1), 1.0, atol=1e-5)

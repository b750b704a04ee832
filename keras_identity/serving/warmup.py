"""TF Serving warm-up requests (``assets.extra/tf_serving_warmup_requests``).

TF Serving replays these ``PredictionLog`` records when it loads a model
version, so the first real request does not pay for graph optimisation.
The messages are ``tensorflow-serving-api``'s where it is installed, else
the same messages declared in :mod:`keras_identity.serving._predict_protos`
(the package is not a dependency: it pulls ``tensorflow`` beside
``tensorflow-cpu``); the records are the same bytes either way.
"""

import os

import numpy as np
import tensorflow as tf

WARMUP_FILE = os.path.join("assets.extra", "tf_serving_warmup_requests")


def serving_apis():
    """``(predict_pb2, prediction_log_pb2)``: ``tensorflow_serving.apis``'
    modules, or without that package one module with the same messages
    (``PredictRequest``, ``PredictResponse``, ``PredictLog``,
    ``PredictionLog``) for both."""
    try:
        from tensorflow_serving.apis import predict_pb2
        from tensorflow_serving.apis import prediction_log_pb2
    except ImportError:
        from keras_identity.serving import _predict_protos

        return _predict_protos, _predict_protos
    return predict_pb2, prediction_log_pb2


def sample_images(height, width, channels, count=2):
    """Deterministic uint8 test images (a gradient and a checkerboard)."""
    rows = np.linspace(0, 255, height)[:, None]
    cols = np.linspace(0, 255, width)[None, :]
    gradient = ((rows + cols) / 2).astype(np.uint8)
    checker = (((np.arange(height)[:, None] // 4 + np.arange(width)[None, :] // 4) % 2) * 255)
    planes = [gradient, checker.astype(np.uint8)]
    images = [np.repeat(planes[i % 2][:, :, None], channels, axis=2) for i in range(count)]
    return np.stack(images)


def encode_png(image):
    return tf.io.encode_png(image).numpy()


def build_requests(model_name, height, width, channels, count=2):
    """One ``PredictRequest`` per signature, each with ``count`` real images."""
    predict_pb2, _ = serving_apis()
    images = sample_images(height, width, channels, count)
    inputs = {
        "serving_default": ("images", tf.make_tensor_proto(images.astype(np.float32))),
        "serving_uint8": ("images", tf.make_tensor_proto(images)),
        "serving_bytes": ("image_bytes", tf.make_tensor_proto(
            np.array([encode_png(image) for image in images], dtype=object))),
    }
    requests = []
    for signature, (name, tensor) in inputs.items():
        request = predict_pb2.PredictRequest()
        request.model_spec.name = model_name
        request.model_spec.signature_name = signature
        request.inputs[name].CopyFrom(tensor)
        requests.append(request)
    return requests


def write_warmup(version_dir, requests):
    _, prediction_log_pb2 = serving_apis()
    path = os.path.join(version_dir, WARMUP_FILE)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with tf.io.TFRecordWriter(path) as writer:
        for request in requests:
            log = prediction_log_pb2.PredictionLog(
                predict_log=prediction_log_pb2.PredictLog(request=request))
            writer.write(log.SerializeToString())
    return path


def read_warmup(version_dir):
    """The ``PredictRequest``s of a version's warm-up file."""
    _, prediction_log_pb2 = serving_apis()
    requests = []
    for record in tf.data.TFRecordDataset(os.path.join(version_dir, WARMUP_FILE)):
        log = prediction_log_pb2.PredictionLog.FromString(record.numpy())
        requests.append(log.predict_log.request)
    return requests

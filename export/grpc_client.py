r"""A gRPC client for TF Serving: classifies image files.

    python -m export.grpc_client --server=localhost:8500 --model_name=pre164 cat.jpg dog.png

Needs grpcio and tensorflow-serving-api (pip install --no-deps
tensorflow-serving-api).  Sends the files' bytes to the serving_bytes
signature and prints the top classes.
"""

import sys

from absl import app
from absl import flags

FLAGS = flags.FLAGS
flags.DEFINE_string("server", "localhost:8500", "host:port of TF Serving's gRPC API.")
flags.DEFINE_string("model_name", "model", "The served model's name.")
flags.DEFINE_float("timeout", 30.0, "Seconds to wait for the answer.")


def classify(stub, model_name, encoded_images, timeout=30.0):
    """Sends encoded images to ``serving_bytes``; returns [(class, score), ...] per image."""
    import tensorflow as tf
    from tensorflow_serving.apis import predict_pb2

    request = predict_pb2.PredictRequest()
    request.model_spec.name = model_name
    request.model_spec.signature_name = "serving_bytes"
    request.inputs["image_bytes"].CopyFrom(tf.make_tensor_proto(encoded_images))
    response = stub.Predict(request, timeout)
    names = tf.make_ndarray(response.outputs["class_names"])
    scores = tf.make_ndarray(response.outputs["scores"])
    return [[(n.decode(), float(s)) for n, s in zip(row_n, row_s)]
            for row_n, row_s in zip(names, scores)]


def main(argv):
    if len(argv) < 2:
        print("error: give one or more image files", file=sys.stderr)
        sys.exit(2)
    import grpc
    from tensorflow_serving.apis import prediction_service_pb2_grpc

    images = [open(path, "rb").read() for path in argv[1:]]
    with grpc.insecure_channel(FLAGS.server) as channel:
        stub = prediction_service_pb2_grpc.PredictionServiceStub(channel)
        try:
            results = classify(stub, FLAGS.model_name, images, FLAGS.timeout)
        except grpc.RpcError as error:
            print(f"error: {error.code().name}: {error.details()}", file=sys.stderr)
            sys.exit(1)
    for path, top in zip(argv[1:], results):
        print(path + ": " + ", ".join(f"{name} {score:.3f}" for name, score in top))


def run():
    app.run(main)


if __name__ == "__main__":
    run()

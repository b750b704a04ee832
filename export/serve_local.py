r"""A loopback stand-in for tensorflow_model_server, to try clients here.

    python -m export.serve_local --model_name=pre164 --model_base_path=serving/pre164

serves the highest version of --model_base_path on 127.0.0.1 with TF
Serving's REST API (POST /v1/models/<name>:predict, GET /v1/models/<name>
and /v1/models/<name>/metadata) and its gRPC PredictionService.Predict, by
running the SavedModel as TF Serving does (keras_identity.serving.emulator).
It is a test double for clients, not a production server.
"""

import json
import threading
from concurrent import futures
from http.server import BaseHTTPRequestHandler
from http.server import ThreadingHTTPServer

from absl import app
from absl import flags

from experiments import _cli

FLAGS = flags.FLAGS
flags.DEFINE_string("model_name", "model", "Model name in request URLs and model specs.")
flags.DEFINE_string("model_base_path", None, "Directory of numbered SavedModel versions.")
flags.DEFINE_integer("rest_api_port", 8501, "REST port on 127.0.0.1 (0: none).")
flags.DEFINE_integer("port", 8500, "gRPC port on 127.0.0.1 (0: none).")
flags.mark_flag_as_required("model_base_path")


def make_rest_handler(emulator, model_name, version):
    from keras_identity.serving import rest
    from keras_identity.serving.emulator import InvalidArgument

    prefix = f"/v1/models/{model_name}"

    class Handler(BaseHTTPRequestHandler):
        def _send(self, code, body):
            data = json.dumps(body).encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *args):
            pass

        def do_GET(self):
            if self.path == prefix:
                self._send(200, {"model_version_status": [
                    {"version": str(version), "state": "AVAILABLE",
                     "status": {"error_code": "OK", "error_message": ""}}]})
            elif self.path == prefix + "/metadata":
                sigs = {name: {"inputs": sorted(s.inputs), "outputs": sorted(s.outputs)}
                        for name, s in emulator.signature_defs.items()}
                self._send(200, {"model_spec": {"name": model_name, "version": str(version)},
                                 "metadata": {"signature_def": sigs}})
            else:
                self._send(404, {"error": f"Malformed request: GET {self.path}"})

        def do_POST(self):
            paths = (prefix + ":predict", f"{prefix}/versions/{version}:predict")
            if self.path not in paths:
                self._send(404, {"error": f"Malformed request: POST {self.path}"})
                return
            try:
                length = int(self.headers.get("Content-Length", 0))
                body = json.loads(self.rfile.read(length) or b"null")
                self._send(200, rest.predict(emulator, body))
            except json.JSONDecodeError as error:
                self._send(400, {"error": f"JSON Parse error: {error}"})
            except InvalidArgument as error:
                self._send(400, {"error": error.message})

    return Handler


def start_grpc(emulator, port):
    import grpc
    from tensorflow_serving.apis import prediction_service_pb2_grpc

    from keras_identity.serving.emulator import InvalidArgument

    class Servicer(prediction_service_pb2_grpc.PredictionServiceServicer):
        def Predict(self, request, context):
            try:
                return emulator.predict(request)
            except InvalidArgument as error:
                context.abort(grpc.StatusCode.INVALID_ARGUMENT, error.message)

    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    prediction_service_pb2_grpc.add_PredictionServiceServicer_to_server(Servicer(), server)
    server.add_insecure_port(f"127.0.0.1:{port}")
    server.start()
    return server


def main(argv):
    if len(argv) > 1:
        _cli.fail(f"unexpected arguments {argv[1:]}", 2)
    import os

    from keras_identity.serving.emulator import ServingEmulator
    from keras_identity.serving.emulator import latest_version

    if not os.path.isdir(FLAGS.model_base_path):
        _cli.fail(f"model_base_path={FLAGS.model_base_path!r} does not exist", 2)
    try:
        version = latest_version(FLAGS.model_base_path)
    except ValueError as error:
        _cli.fail(error, 2)
    emulator = ServingEmulator(os.path.join(FLAGS.model_base_path, str(version)))
    grpc_server = start_grpc(emulator, FLAGS.port) if FLAGS.port else None
    http = None
    if FLAGS.rest_api_port:
        http = ThreadingHTTPServer(("127.0.0.1", FLAGS.rest_api_port),
                                   make_rest_handler(emulator, FLAGS.model_name, version))
        threading.Thread(target=http.serve_forever, daemon=True).start()
    print(f"serving {FLAGS.model_name} version {version} on 127.0.0.1: REST port "
          f"{FLAGS.rest_api_port}, gRPC port {FLAGS.port}", flush=True)
    try:
        threading.Event().wait()
    except KeyboardInterrupt:
        pass
    finally:
        if http:
            http.shutdown()
        if grpc_server:
            grpc_server.stop(0)


if __name__ == "__main__":
    app.run(main, flags_parser=_cli.one_line_flags_parser)

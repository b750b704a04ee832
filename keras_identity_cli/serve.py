r"""A loopback stand-in for tensorflow_model_server, to try clients here.

    keras-identity-serve --model_name=pre164 --model_base_path=serving/pre164
    python -m keras_identity_cli.serve ...        # the same, as a module

serves the highest version of --model_base_path on 127.0.0.1
(keras_identity.serving.server); exit status 2: a flag, model or port refused.
"""

import threading

from absl import flags

from keras_identity_cli import _common as _cli
from keras_identity_cli._preload import cpu_kernels

# Before TensorFlow is imported: oneDNN's BN-fused convolutions are slow at
# small batches on AVX2 CPUs, where TensorFlow's own choice is Eigen.
cpu_kernels.choose("inference")

FLAGS = flags.FLAGS
flags.DEFINE_string("model_name", "model", "Model name in request URLs and model specs.")
flags.DEFINE_string("model_base_path", None, "Directory of numbered SavedModel versions.")
flags.DEFINE_integer("rest_api_port", 8501, "REST port on 127.0.0.1 (0: none).")
flags.DEFINE_integer("port", 8500, "gRPC port on 127.0.0.1 (0: none).")
flags.DEFINE_integer("workers", 4, "Threads answering REST requests.")
flags.DEFINE_integer("max_queued", 256, "REST requests that may wait for a worker; more get "
                     "503.")
flags.DEFINE_integer("backlog", 1024, "Listen backlog of the REST socket.")
flags.DEFINE_float("read_timeout_s", 10.0, "Time a client has to send its whole request "
                   "(request line, headers and body); 408 beyond.")
flags.DEFINE_bool("xla_cpu_compilation_enabled", False, "As TF Serving's flag: serve a version "
                  "whose model runs through XLA (keras-identity-export --jit_compile, or a "
                  "JAX-backend export); without it such a version is refused.")
flags.mark_flag_as_required("model_base_path")


def main(argv):
    if len(argv) > 1:
        _cli.fail(f"unexpected arguments {argv[1:]}", 2)
    _cli.require_tensorflow("keras-identity-serve (it runs the SavedModel in TensorFlow)")
    import os

    from keras_identity.serving import server
    from keras_identity.serving.emulator import ServingEmulator
    from keras_identity.serving.emulator import XlaDisabledError
    from keras_identity.serving.emulator import describe_xla
    from keras_identity.serving.emulator import latest_version

    from keras_identity import storage

    try:
        storage.check_path(FLAGS.model_base_path, "model_base_path")
    except ValueError as error:
        _cli.fail(error, 2)
    if not os.path.isdir(FLAGS.model_base_path):
        _cli.fail(f"model_base_path={FLAGS.model_base_path!r} does not exist", 2)
    for name in ("workers", "max_queued", "backlog"):
        if getattr(FLAGS, name) < 1:
            _cli.fail(f"--{name}={getattr(FLAGS, name)} is not valid; expected an integer "
                      f">= 1", 2)
    try:
        version = latest_version(FLAGS.model_base_path)
    except ValueError as error:
        _cli.fail(error, 2)
    version_dir = os.path.join(FLAGS.model_base_path, str(version))
    try:
        emulator = ServingEmulator(
            version_dir, xla_cpu_compilation_enabled=FLAGS.xla_cpu_compilation_enabled)
    except XlaDisabledError as error:
        _cli.fail(f"version {version} in {FLAGS.model_base_path} runs its model through XLA "
                  f"({describe_xla(error.parts)}), which TF Serving serves only with "
                  f"--xla_cpu_compilation_enabled=true: start keras-identity-serve with "
                  f"--xla_cpu_compilation_enabled", 2)
    except Exception as error:  # a missing or damaged saved_model.pb, variables, ...
        _cli.fail(f"version {version} in {FLAGS.model_base_path} is not a loadable "
                  f"SavedModel ({type(error).__name__}: "
                  f"{' '.join(str(error).split())[:200]})", 2)
    http = None
    if FLAGS.rest_api_port:
        try:
            http = server.BoundedHTTPServer(
                ("127.0.0.1", FLAGS.rest_api_port),
                server.make_rest_handler(emulator, FLAGS.model_name, version,
                                         FLAGS.read_timeout_s),
                workers=FLAGS.workers, max_queued=FLAGS.max_queued, backlog=FLAGS.backlog)
        except OSError as error:
            _cli.fail(f"cannot listen on 127.0.0.1:{FLAGS.rest_api_port} (--rest_api_port): "
                      f"{error.strerror or error}", 2)
        threading.Thread(target=http.serve_forever, daemon=True).start()
    try:
        grpc_server = server.start_grpc(emulator, FLAGS.port) if FLAGS.port else None
    except RuntimeError as error:
        _cli.fail(f"cannot listen on 127.0.0.1:{FLAGS.port} (--port): {error}", 2)
    print(f"serving {FLAGS.model_name} version {version} on 127.0.0.1: REST port "
          f"{FLAGS.rest_api_port}, gRPC port {FLAGS.port}", flush=True)
    kernels = cpu_kernels.describe()
    if kernels:
        print(kernels, flush=True)
    try:
        threading.Event().wait()
    except KeyboardInterrupt:
        pass
    finally:
        if http:
            http.shutdown()
        if grpc_server:
            grpc_server.stop(0)


def run():
    """The console command keras-identity-serve."""
    _cli.run_program(main, __name__)


if __name__ == "__main__":
    run()

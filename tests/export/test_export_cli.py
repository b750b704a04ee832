"""export/ programs: export a trained run, serve it on loopback, call it as a client."""

import base64
import json
import os
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request

import numpy as np
import pytest

pytest.importorskip("tensorflow")  # SavedModels: TensorFlow on every backend

from keras_identity.serving.warmup import encode_png  # noqa: E402
from keras_identity.training import TrainConfig  # noqa: E402
from keras_identity.training import train  # noqa: E402
from tests.backend import BACKEND  # noqa: E402
from tests.backend import backend_neutral  # noqa: E402
from tests.conftest import REPO  # noqa: E402
from tests.programs import error_lines  # noqa: E402
from tests.programs import run_cases  # noqa: E402
from tests.programs import run_refusals  # noqa: E402

pytestmark = pytest.mark.needs_tensorflow


def run_module(module, *args, timeout=300):
    return subprocess.run([sys.executable, "-m", module, *args], cwd=REPO, text=True,
                          capture_output=True, timeout=timeout)


@pytest.fixture(scope="module")
def trained_run(tmp_path_factory):
    root = tmp_path_factory.mktemp("run")
    rng = np.random.default_rng(0)
    data = root / "cifar-like.npz"
    np.savez(data, x_train=rng.integers(0, 256, (128, 32, 32, 3), dtype=np.uint8),
             y_train=rng.integers(0, 10, 128), x_test=rng.integers(0, 256, (32, 32, 32, 3),
                                                                    dtype=np.uint8),
             y_test=rng.integers(0, 10, 32))
    config = TrainConfig(model="resnet", depth=8, dataset="cifar10", data_dir=str(data),
                         train_steps=2, batch_size=32, verbose=0, model_dir=str(root / "r8"))
    train(config, print_fn=lambda *_: None)
    return root


def test_export_cli_writes_numbered_versions(trained_run, tmp_path):
    """Two exports to one directory: versions 1 and 2 (both runs in one
    process: the program's own process is tested below)."""
    model = str(trained_run / "r8" / "model.keras")
    base = str(tmp_path / "serving" / "r8")     # its own: the server tests export too
    (first, first_err, first_out), (second, second_err, _) = run_cases(
        "keras_identity_cli.export", [[f"--model_path={model}", f"--export_dir={base}"]] * 2)
    assert first == 0, first_err[-2000:]
    assert "3 warm-up requests replayed" in first_out
    assert f"tensorflow_model_server --model_name=r8 --model_base_path={base}" in first_out
    assert second == 0, second_err[-2000:]
    assert sorted(os.listdir(base)) == ["1", "2"]


# tensorflow_serving cannot be imported (None in sys.modules), as after
# pip install ".[cpu]"; then the console command runs.
WITHOUT_SERVING_API = ('import sys; sys.modules["tensorflow_serving"] = None; '
                       'sys.argv[0] = "keras-identity-{0}"; '
                       'from keras_identity_cli.{0} import run; run()')


@backend_neutral
def test_export_and_serve_without_tensorflow_serving_api(trained_run, tmp_path):
    """After pip install ".[cpu]" (no tensorflow-serving-api: issue 61, case
    7) the README's command writes and replays the warm-up requests, and
    keras-identity-serve answers gRPC.  (What it leaves out is the same on
    every backend; a JAX model's export: the tests above.)"""
    import grpc
    import tensorflow as tf

    from keras_identity.serving.warmup import serving_apis

    model = str(trained_run / "r8" / "model.keras")
    base = tmp_path / "serving" / "r8"
    result = subprocess.run([sys.executable, "-c", WITHOUT_SERVING_API.format("export"),
                             f"--model_path={model}", f"--export_dir={base}"], cwd=REPO,
                            text=True, capture_output=True, timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    assert "3 warm-up requests replayed" in result.stdout
    assert (base / "1" / "assets.extra" / "tf_serving_warmup_requests").is_file()
    shown = subprocess.run([os.path.join(os.path.dirname(sys.executable), "saved_model_cli"),
                            "show", "--dir", str(base / "1"), "--all"], text=True,
                           capture_output=True, check=True).stdout
    for name in ("serving_default", "serving_bytes", "serving_uint8"):
        assert f"signature_def['{name}']" in shown
    port = _free_port()
    server = subprocess.Popen(
        [sys.executable, "-c", WITHOUT_SERVING_API.format("serve"), "--model_name=r8",
         f"--model_base_path={base}", "--rest_api_port=0", f"--port={port}"],
        cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        predict_pb2, _ = serving_apis()
        request = predict_pb2.PredictRequest()
        request.model_spec.name, request.model_spec.signature_name = "r8", "serving_uint8"
        images = np.zeros((2, 32, 32, 3), np.uint8)
        request.inputs["images"].CopyFrom(tf.make_tensor_proto(images))
        with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
            predict = channel.unary_unary(
                "/tensorflow.serving.PredictionService/Predict",
                request_serializer=predict_pb2.PredictRequest.SerializeToString,
                response_deserializer=predict_pb2.PredictResponse.FromString)
            deadline = time.time() + 120
            while True:
                try:
                    response = predict(request, timeout=30)
                    break
                except grpc.RpcError as error:
                    assert error.code() == grpc.StatusCode.UNAVAILABLE, error
                    assert time.time() < deadline and server.poll() is None, (
                        server.stdout.read()[-2000:])
                    time.sleep(0.5)
        assert tf.make_ndarray(response.outputs["probabilities"]).shape == (2, 10)
    finally:
        server.terminate()
        server.wait(timeout=30)


@backend_neutral
def test_export_cli_bad_flags():
    """Refusals of the program's logic: its run() once per case, in one
    process (tests/programs.py)."""
    cases = [(["--model_path=/no/model.keras", "--export_dir=/tmp/x"], "does not exist"),
             (["--export_dir=/tmp/x"], "--model_path")]
    for (args, message), (code, stderr) in zip(
            cases, run_refusals("keras_identity_cli.export", [a for a, _ in cases])):
        assert code != 0 and message in stderr, stderr[-1000:]
        assert len(error_lines(stderr)) == 1, stderr[-1000:]


def test_a_trained_model_alone_exports_and_serves_raw_pixels(trained_run, tmp_path):
    """model.keras carries its preprocessing: no preprocessing.json needed."""
    import keras
    import tensorflow as tf

    lone = tmp_path / "model.keras"
    lone.write_bytes((trained_run / "r8" / "model.keras").read_bytes())
    result = run_module("export.export_saved_model", f"--model_path={lone}",
                        f"--export_dir={tmp_path / 's'}", "--class_names=" + ",".join("abcdefghij"))
    assert result.returncode == 0, result.stderr[-2000:]
    assert "normalises its inputs itself (layer 'preprocessing', per_pixel_mean)" in result.stdout
    pixels = np.random.default_rng(3).integers(0, 256, (3, 32, 32, 3)).astype(np.uint8)
    served = tf.saved_model.load(str(tmp_path / "s" / "1")).signatures["serving_uint8"](
        images=tf.constant(pixels))
    expected = keras.models.load_model(lone).predict(pixels, verbose=0)
    np.testing.assert_allclose(served["probabilities"].numpy(), expected, atol=1e-6)
    assert served["class_names"].numpy()[0, 0].decode() in "abcdefghij"


def test_a_model_saved_from_python_exports_with_the_cli(tmp_path):
    """A model built and saved in Python: with its preprocessing it exports;
    without, it is refused unless --raw_pixels says it takes pixels as they
    are (and --raw_pixels is refused for a model that normalises)."""
    import keras_identity as ki

    ki.models.highway_net(10, include_preprocessing=True).save(tmp_path / "with.keras")
    ki.models.highway_net(10).save(tmp_path / "without.keras")
    with_prep, without = f"--model_path={tmp_path / 'with.keras'}", \
        f"--model_path={tmp_path / 'without.keras'}"
    (ok, _, out), (refused, stderr, _), (raw, _, raw_out), (contradiction, stderr2, _), \
        (compiled, compiled_err, compiled_out) = run_cases("keras_identity_cli.export", [
            [with_prep, f"--export_dir={tmp_path / 'a'}"],
            [without, f"--export_dir={tmp_path / 'b'}"],
            [without, f"--export_dir={tmp_path / 'b'}", "--raw_pixels"],
            [with_prep, f"--export_dir={tmp_path / 'c'}", "--raw_pixels"],
            [with_prep, f"--export_dir={tmp_path / 'x'}", "--jit_compile"]])
    assert ok == 0 and "(layer 'preprocessing', scale)" in out
    # TF Serving's XLA switch in the command printed where the export needs
    # it: --jit_compile's (its warm-up requests replayed through XLA), and
    # every JAX-backend export's, which refuses --jit_compile.
    xla = "--port=8500 --rest_api_port=8501 --xla_cpu_compilation_enabled=true"
    if BACKEND == "jax":
        assert xla in out and "XLA (a JAX-backend export's XlaCallModule)" in out
        assert compiled == 2 and "jit_compile=True applies to the TensorFlow backend" in \
            compiled_err, compiled_err[-2000:]
    else:
        assert "xla_cpu_compilation_enabled" not in out
        assert compiled == 0 and "3 warm-up requests replayed" in compiled_out
        assert f"--model_base_path={tmp_path / 'x'} {xla}" in compiled_out, compiled_out[-2000:]
    assert refused == 2 and error_lines(stderr) == [
        "error: the model has no preprocessing layer and no preprocessing was given "
        "(--preprocessing), so the pixel signatures would feed it pixel values in [0, 255] "
        "unnormalised; build it with include_preprocessing=True, give its run's "
        "preprocessing.json (--preprocessing), or pass raw_pixels=True (--raw_pixels) if it "
        "takes pixel values as they are."], stderr[-2000:]
    assert raw == 0 and "takes pixel values as they are (raw_pixels)" in raw_out
    assert "pixel values in [0, 255]" in (tmp_path / "b" / "1" / "assets.extra" /
                                          "inputs.txt").read_text()
    assert os.listdir(tmp_path / "b") == ["1"]   # the refusal wrote nothing
    assert contradiction == 2 and error_lines(stderr2) == [
        "error: raw_pixels (--raw_pixels) is not valid for a model whose inputs are "
        "normalised (its preprocessing layer, or the preprocessing given); its signatures "
        "take pixel values in [0, 255] already."]
    assert not (tmp_path / "c").exists()


def test_a_preset_built_the_default_way_is_not_exported_to_wrong_answers(tmp_path):
    """``highway_net(10, weights="mnist")`` takes inputs in [0, 1]: its export
    is refused (the pixel signatures would feed it 0-255 values: 8.3% error
    against 0.67% before); built with ``include_preprocessing=True`` it
    exports, and serving_bytes scores the digits as the preset does."""
    import tensorflow as tf

    import keras_identity as ki

    ki.models.highway_net(10, weights="mnist").save(tmp_path / "hw10.keras")
    ki.models.highway_net(10, weights="mnist", include_preprocessing=True).save(
        tmp_path / "hw10_pixels.keras")
    (refused, stderr, _), (ok, err, _) = run_cases("keras_identity_cli.export", [
        [f"--model_path={tmp_path / 'hw10.keras'}", f"--export_dir={tmp_path / 'a'}"],
        [f"--model_path={tmp_path / 'hw10_pixels.keras'}", f"--export_dir={tmp_path / 'b'}",
         "--warmup=false"]])
    assert refused == 2 and len(error_lines(stderr)) == 1 and \
        "include_preprocessing=True" in stderr and "--preprocessing" in stderr
    assert not (tmp_path / "a").exists()
    assert ok == 0, err[-2000:]
    data = ki.data.load_dataset("mnist")
    images, labels = data.x_test[:300], data.y_test[:300]
    served = tf.saved_model.load(str(tmp_path / "b" / "1")).signatures["serving_bytes"](
        image_bytes=tf.constant([encode_png(i) for i in images]))
    preset = ki.models.highway_net(10, weights="mnist").predict(images / 255.0, verbose=0)
    np.testing.assert_allclose(served["probabilities"].numpy(), preset, atol=1e-5)
    assert np.mean(np.argmax(preset, -1) != labels) < 0.02


def _assert_bytes_served_as_crop(version_dir, model_path, resize, crop):
    """serving_bytes of a 64x50 PNG gives the model's prediction for the image
    with its shorter side resized to ``resize`` and the central ``crop``."""
    import keras
    import tensorflow as tf

    from keras_identity.data.augment import center_crop

    image = np.random.default_rng(5).integers(0, 256, (64, 50, 3)).astype(np.uint8)
    served = tf.saved_model.load(str(version_dir)).signatures["serving_bytes"](
        image_bytes=tf.constant([encode_png(image)]))
    cropped = center_crop(tf.constant(image), resize, crop).numpy()
    assert cropped.shape == (crop, crop, 3)
    expected = keras.models.load_model(model_path).predict(cropped[None], verbose=0)
    np.testing.assert_allclose(served["probabilities"].numpy(), expected, atol=1e-5)


def test_a_model_of_any_input_size_exports_with_image_size_and_eval_resize(tmp_path):
    """--image_size and --eval_resize give serving_bytes the size a model
    with input (None, None, 3) has no preprocessing.json to say."""
    import keras_identity as ki

    ki.models.resnet(depth=8, dataset="cifar10", input_shape=(None, None, 3),
                     include_preprocessing=False).save(tmp_path / "any.keras")
    model_path = f"--model_path={tmp_path / 'any.keras'}"
    (missing, missing_err, _), (code, stderr, _) = run_cases("keras_identity_cli.export", [
        [model_path, f"--export_dir={tmp_path / 'x'}"],
        [model_path, "--image_size=40", "--eval_resize=48", f"--export_dir={tmp_path / 's'}",
         "--raw_pixels"]])
    assert missing == 2 and error_lines(missing_err)[-1].endswith(
        "has no fixed height and width; give the size of the images served with "
        "--image_size")
    assert code == 0, stderr[-2000:]
    # Shorter side (50) to 48, then the central 40x40.
    _assert_bytes_served_as_crop(tmp_path / "s" / "1", tmp_path / "any.keras", resize=48,
                                 crop=40)


@backend_neutral
def test_eval_resize_alone_applies_to_a_fixed_size_model_without_preprocessing_file(tmp_path):
    import keras_identity as ki

    ki.models.resnet(depth=8, dataset="cifar10").save(tmp_path / "fixed.keras")
    result = run_module("export.export_saved_model", f"--model_path={tmp_path / 'fixed.keras'}",
                        "--eval_resize=40", f"--export_dir={tmp_path / 's'}",
                        "--raw_pixels")
    assert result.returncode == 0, result.stderr[-2000:]
    _assert_bytes_served_as_crop(tmp_path / "s" / "1", tmp_path / "fixed.keras", resize=40,
                                 crop=32)


@backend_neutral
def test_image_size_contradicting_the_preprocessing_file_is_refused(tmp_path):
    import keras_identity as ki
    from keras_identity.data import Normalization
    from keras_identity.data.normalization import save_preprocessing

    ki.models.resnet(depth=8, dataset="cifar10", input_shape=(None, None, 3),
                     include_preprocessing=False).save(tmp_path / "model.keras")
    save_preprocessing(tmp_path / "preprocessing.json", dataset="cifar10",
                       normalization=Normalization("scale"), image_shape=(48, 48, 3),
                       class_names=[str(i) for i in range(10)], eval_resize=56)
    cases = (("--image_size=40", "--image_size=40 contradicts the preprocessing "
              "file's image_shape (48, 48, 3); drop one of them"),
             ("--eval_resize=64", "--eval_resize=64 contradicts the preprocessing "
              "file's eval_resize 56; drop one of them"))
    results = run_refusals("keras_identity_cli.export", [
        [f"--model_path={tmp_path / 'model.keras'}", flag, f"--export_dir={tmp_path / 's'}"]
        for flag, _ in cases])
    for (_, message), (code, stderr) in zip(cases, results):
        assert code == 2, stderr[-500:]
        assert error_lines(stderr)[-1].endswith(message)


@backend_neutral
def test_image_size_flags_that_do_not_apply_are_refused(trained_run, tmp_path):
    cases = [(["--image_size=40"], "--image_size=40 does not fit the model's input (32, 32, 3)"),
             (["--image_size=0"], "--image_size=0 is not valid"),
             (["--eval_resize=16"], "--eval_resize=16 is not valid; expected an integer >= the "
                                    "served image height 32")]
    results = run_refusals("keras_identity_cli.export", [
        [f"--model_path={trained_run / 'r8' / 'model.keras'}",
         f"--export_dir={tmp_path / 's'}", *args] for args, _ in cases])
    for (_, message), (code, stderr) in zip(cases, results):
        assert code == 2 and message in stderr, stderr[-500:]
    assert not (tmp_path / "s").exists()


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _post(url, body):
    request = urllib.request.Request(url, data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=60) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read())


@backend_neutral
def test_local_server_answers_rest_and_grpc_clients(local_server, tmp_path):
    """The README's curl body and gRPC client against keras-identity-serve.
    (Serving a SavedModel does not depend on the backend that exported it;
    a JAX model's exports are checked by the tests above and in
    tests/serving on the JAX leg beside TensorFlow.)"""
    _, url, _, grpc_port = local_server
    with urllib.request.urlopen(url, timeout=5) as response:
        status = json.loads(response.read())
    assert status["model_version_status"][0]["state"] == "AVAILABLE"
    image = np.random.default_rng(1).integers(0, 256, (32, 32, 3)).astype(np.uint8)
    encoded = base64.b64encode(encode_png(image)).decode()
    # The README's curl body.
    code, body = _post(url + ":predict", {"signature_name": "serving_bytes",
                                          "instances": [{"image_bytes": {"b64": encoded}}]})
    assert code == 200
    assert len(body["predictions"][0]["probabilities"]) == 10
    code, body = _post(url + ":predict", {"signature_name": "serving_bytes",
                                          "instances": [{"b64": "aGVsbG8="}]})
    assert code == 400 and "Unknown image file format" in body["error"]
    # The README's gRPC client, on an image and on a file that is none.
    png, bad = tmp_path / "image.png", tmp_path / "bad.png"
    png.write_bytes(encode_png(image))
    bad.write_bytes(b"not a png")
    (code, _, stdout), (failed, stderr, _) = run_cases("export.grpc_client", [
        [f"--server=127.0.0.1:{grpc_port}", "--model_name=r8", str(path)]
        for path in (png, bad)])
    assert code == 0 and stdout.startswith(f"{png}: ")
    names = [p.split()[0] for p in stdout.split(": ", 1)[1].split(", ")]
    assert len(names) == 5
    assert failed == 1 and "INVALID_ARGUMENT" in stderr


# --- nothing bad exports silently (issue 20: 5, 9, 12) --------------------------

def _export(trained_run, *args):
    return run_module("export.export_saved_model", *args)


@backend_neutral
def test_unreadable_model_files_are_named(trained_run, tmp_path):
    truncated = tmp_path / "cut.keras"
    truncated.write_bytes((trained_run / "r8" / "model.keras").read_bytes()[:5000])
    text = tmp_path / "notes.keras"
    text.write_text("not a zip file")
    cases = ((truncated, "not a zip archive"), (text, "not a zip archive"),
             (trained_run / "r8", "a directory"))
    results = run_refusals("keras_identity_cli.export", [
        [f"--model_path={path}", f"--export_dir={tmp_path / 'out'}",
         f"--preprocessing={trained_run / 'r8' / 'preprocessing.json'}"] for path, _ in cases])
    for (path, reason), (code, stderr) in zip(cases, results):
        assert code == 2
        lines = error_lines(stderr)
        assert len(lines) == 1, stderr[-1500:]
        assert f"not a readable .keras file: {path}" in lines[0]
        assert reason in lines[0] and "not found" not in lines[0]
    assert not (tmp_path / "out").exists()


@backend_neutral
def test_preprocessing_of_another_dataset_is_refused(trained_run, tmp_path):
    from keras_identity.data import Normalization
    from keras_identity.data import save_preprocessing

    mnist = tmp_path / "mnist_preprocessing.json"
    save_preprocessing(str(mnist), dataset="mnist", normalization=Normalization("scale"),
                       image_shape=(28, 28, 1), class_names=[str(i) for i in range(10)])
    # Statistics other than the model's own: refused, not applied twice.
    other = tmp_path / "other_preprocessing.json"
    save_preprocessing(str(other), dataset="cifar10", normalization=Normalization("scale"),
                       image_shape=(32, 32, 3), class_names=[str(i) for i in range(10)])
    (code, stderr), (code2, stderr2) = run_refusals("keras_identity_cli.export", [
        [f"--model_path={trained_run / 'r8' / 'model.keras'}",
         f"--export_dir={tmp_path / 'out'}", f"--preprocessing={path}"] for path in (mnist, other)])
    assert code == 2
    assert ("the preprocessing (dataset 'mnist', image_shape (28, 28, 1)) does not fit the "
            "model's input (32, 32, 3)") in stderr
    assert not (tmp_path / "out").exists()
    assert code2 == 2
    assert "normalises its inputs itself: pass no preprocessing" in stderr2


@backend_neutral
def test_a_failed_export_leaves_no_version_directory(trained_run, tmp_path, monkeypatch):
    import keras

    import keras_identity.serving.export as export_lib
    from keras_identity.data import load_preprocessing

    def missing_serving_api(*args, **kwargs):
        raise ImportError("writing warm-up requests needs tensorflow-serving-api")

    monkeypatch.setattr(export_lib.warmup_lib, "build_requests", missing_serving_api)
    model = keras.models.load_model(trained_run / "r8" / "model.keras")
    preprocessing = load_preprocessing(str(trained_run / "r8" / "preprocessing.json"))
    base = tmp_path / "out"
    with pytest.raises(ImportError, match="tensorflow-serving-api"):
        export_lib.export_saved_model(model, str(base), preprocessing)
    assert os.listdir(base) == []  # neither "1" nor its partial copy


# --- the local server holds load and answers every request (issue 20: 11) -----

@pytest.fixture(scope="module")
def local_server(trained_run):
    """One server for the module's requests (each test leaves it serving)."""
    base = trained_run / "serving" / "r8"
    if not base.exists():
        run_module("export.export_saved_model",
                   f"--model_path={trained_run / 'r8' / 'model.keras'}", f"--export_dir={base}")
    port, grpc_port = _free_port(), _free_port()
    server = subprocess.Popen(
        [sys.executable, "-m", "export.serve_local", "--model_name=r8",
         f"--model_base_path={base}", f"--rest_api_port={port}", f"--port={grpc_port}",
         "--read_timeout_s=1"], cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        text=True)
    url = f"http://127.0.0.1:{port}/v1/models/r8"
    deadline = time.time() + 120
    while time.time() < deadline:
        try:
            urllib.request.urlopen(url, timeout=2).read()
            break
        except (urllib.error.URLError, ConnectionError):
            time.sleep(0.2)
    yield port, url, base, grpc_port
    server.kill()
    server.wait()


def _raw(port, data, timeout=10, close_after=False):
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as connection:
        connection.sendall(data)
        if close_after:   # no more to come: the server sees the end of the stream
            connection.shutdown(socket.SHUT_WR)
        answer = b""
        while True:
            chunk = connection.recv(65536)
            if not chunk:
                break
            answer += chunk
    return answer.decode(errors="replace")


@backend_neutral
def test_two_hundred_concurrent_clients_get_answers(local_server):
    import concurrent.futures

    port, url, _, _ = local_server
    body = {"signature_name": "serving_uint8",
            "instances": [np.zeros((32, 32, 3), np.uint8).tolist()]}
    statuses, failures = [], []

    def client(_):
        try:
            return _post(url + ":predict", body)[0]
        except Exception as error:  # a reset or a dropped connection
            failures.append(type(error).__name__)
            return None

    with concurrent.futures.ThreadPoolExecutor(200) as pool:
        statuses = list(pool.map(client, range(200)))
    assert failures == []
    assert set(statuses) <= {200, 503} and statuses.count(200) >= 1


@pytest.mark.parametrize("request_bytes, words", [
    (b"POST /v1/models/r8:predict HTTP/1.1\r\nContent-Length: abc\r\n\r\n{}",
     ["400", "Content-Length 'abc' is not valid"]),
    (b"POST /v1/models/r8:predict HTTP/1.1\r\nContent-Length: -5\r\n\r\n{}",
     ["400", "Content-Length '-5'"]),
    ("POST /v1/models/r8:predict HTTP/1.1\r\nContent-Length: \u00b2\r\n\r\n{}".encode(),
     ["400", "is not valid"]),
    (b"POST /v1/models/r8:predict HTTP/1.1\r\nContent-Length: 99999999999\r\n\r\n{}",
     ["413", "over the server's limit"]),
    (b"POST /v1/models/r8:predict HTTP/1.1\r\nContent-Length: 500\r\n\r\n{\"instances\": ",
     ["408 Request Timeout", "not complete within 1 s"]),   # the body stalls
    (b"POST /v1/models/r8:predict HTTP/1.1\r\nContent-Length: 77\r\n\r\n"
     b'{"signature_name": "serving_uint8", "instances": [[[[300, -1, 5]]]]}          ',
     ["400"]),
])
@backend_neutral
def test_malformed_requests_get_400_not_a_dropped_connection(local_server, request_bytes,
                                                               words):
    port, _, _, _ = local_server
    answer = _raw(port, request_bytes)
    for word in words:
        assert word in answer, answer[:500]


@backend_neutral
def test_a_body_cut_short_is_400_and_a_zero_padded_version_is_the_served_one(local_server):
    port, url, _, _ = local_server
    answer = _raw(port, b"POST /v1/models/r8:predict HTTP/1.1\r\nContent-Length: 500\r\n\r\n"
                        b'{"instances": ', close_after=True)
    assert answer.startswith("HTTP/1.0 400") and "fewer than its Content-Length 500" in answer
    with urllib.request.urlopen(url, timeout=30) as response:
        served = json.loads(response.read())["model_version_status"][0]["version"]
    answer = _raw(port, f"GET /v1/models/r8/versions/00{served} HTTP/1.1\r\n\r\n".encode())
    assert answer.startswith("HTTP/1.0 200") and "AVAILABLE" in answer, answer[:300]
    answer = _raw(port, "GET /v1/models/r8/versions/\u00b2 HTTP/1.1\r\n\r\n".encode())
    assert answer.startswith("HTTP/1.0 404"), answer[:300]


def _slow_client(port, seconds_per_byte=0.2, limit=30.0):
    """Sends a request header one byte at a time until the server answers or
    closes; returns (seconds the connection stayed open, the answer)."""
    import select

    request = b"POST /v1/models/r8:predict HTTP/1.1\r\nX-Slow: " + b"a" * 1000
    started, answer = time.time(), b""
    with socket.create_connection(("127.0.0.1", port), timeout=limit) as connection:
        for byte in request:
            try:
                connection.sendall(bytes([byte]))
            except OSError:
                break
            readable, _, _ = select.select([connection], [], [], seconds_per_byte)
            if readable:
                try:
                    while chunk := connection.recv(65536):
                        answer += chunk
                except OSError:
                    pass
                break
            if time.time() - started > limit:
                break
    return time.time() - started, answer.decode(errors="replace")


@pytest.mark.parametrize("slow", [6, 50])
@backend_neutral
def test_slow_clients_neither_starve_others_nor_outstay_the_deadline(local_server, slow):
    import concurrent.futures

    port, url, _, _ = local_server  # --read_timeout_s=1, 4 workers
    body = {"signature_name": "serving_uint8",
            "instances": [np.zeros((32, 32, 3), np.uint8).tolist()]}
    assert _post(url + ":predict", body)[0] == 200
    with concurrent.futures.ThreadPoolExecutor(slow) as pool:
        attack = [pool.submit(_slow_client, port) for _ in range(slow)]
        time.sleep(0.3)
        times = []
        for _ in range(3):
            started = time.time()
            assert _post(url + ":predict", body)[0] == 200
            times.append(time.time() - started)
        results = [future.result() for future in attack]
    assert max(times) < 1.0, times
    for seconds, answer in results:  # answered 408 at the deadline, then closed
        assert "408 Request Timeout" in answer and "--read_timeout_s" in answer, answer
        assert seconds < 2.5, seconds


@pytest.mark.parametrize("method, path, code, message", [
    ("POST", "/v1/models/r8/versions/99:predict", 404,
     "Servable not found for request: Specific(r8, 99)"),
    ("POST", "/v1/models/other:predict", 404, "Servable not found for request: Latest(other)"),
    ("POST", "/v1/models/r8/labels/stable:predict", 404,
     "Unrecognized servable version label: stable"),
    ("GET", "/v1/models/other", 404, "Could not find any versions of model other"),
    ("GET", "/v1/models/r8/versions/99", 404, "Could not find version 99 of model r8"),
    ("GET", "/v1/models/other/metadata", 404, "Servable not found for request: Latest(other)"),
    ("POST", "/v2/foo", 404, "Malformed request: POST /v2/foo"),
    ("GET", "/v1/models/r8/versions/{served}", 200, "AVAILABLE"),
])
@backend_neutral
def test_unknown_models_and_versions_in_tf_servings_words(local_server, method, path, code,
                                                          message):
    port, url, _, _ = local_server
    with urllib.request.urlopen(url, timeout=30) as response:   # the version served
        served = json.loads(response.read())["model_version_status"][0]["version"]
    path = path.format(served=served)
    body = b"{}" if method == "POST" else b""
    answer = _raw(port, f"{method} {path} HTTP/1.1\r\nContent-Length: {len(body)}\r\n\r\n"
                  .encode() + body)
    assert answer.startswith(f"HTTP/1.0 {code}") and message in answer, answer[:300]


@backend_neutral
def test_deeply_nested_json_is_400(local_server):
    port, _, _, _ = local_server
    body = b'{"instances": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"
    answer = _raw(port, b"POST /v1/models/r8:predict HTTP/1.1\r\nContent-Length: "
                  + str(len(body)).encode() + b"\r\n\r\n" + body)
    assert answer.startswith("HTTP/1.0 400") and "nests too deeply" in answer, answer[:300]


@backend_neutral
def test_bad_version_directory_and_port_in_use_are_one_line(local_server, tmp_path):
    port, _, base, _ = local_server
    broken = tmp_path / "broken"
    (broken / "1").mkdir(parents=True)
    (broken / "1" / "saved_model.pb").write_bytes(b"not a protobuf")
    import keras_identity as ki
    from keras_identity.serving import export_saved_model

    export_saved_model(ki.models.highway_net(10, include_preprocessing=True),
                       str(tmp_path / "xla"), jit_compile=True, warmup=False)
    (code, stderr), (busy, busy_err), (control, control_err), (xla, xla_err), \
        (xla_on, xla_on_err) = run_refusals(
        "keras_identity_cli.serve", [
            [f"--model_base_path={broken}", "--rest_api_port=0", "--port=0"],
            [f"--model_base_path={base}", f"--rest_api_port={port}", "--port=0"],
            [f"--model_base_path={base}\x01", "--rest_api_port=0", "--port=0"],
            [f"--model_base_path={tmp_path / 'xla'}", "--rest_api_port=0", "--port=0"],
            [f"--model_base_path={tmp_path / 'xla'}", "--xla_cpu_compilation_enabled",
             f"--rest_api_port={port}", "--port=0"]], timeout=180)
    assert code == 2
    assert "is not a loadable SavedModel" in error_lines(stderr)[-1]
    assert xla == 2 and error_lines(xla_err) == [
        f"error: version 1 in {tmp_path / 'xla'} runs its model through XLA (a "
        f"jit_compile=True function), which TF Serving serves only with "
        f"--xla_cpu_compilation_enabled=true: start keras-identity-serve with "
        f"--xla_cpu_compilation_enabled"], xla_err[-2000:]
    # With the flag the version loads: the program gets as far as the port
    # the fixture's server holds.
    assert xla_on == 2 and f"cannot listen on 127.0.0.1:{port}" in xla_on_err, xla_on_err[-2000:]
    assert busy == 2
    assert f"cannot listen on 127.0.0.1:{port} (--rest_api_port)" in busy_err
    assert control == 2 and error_lines(control_err) == [
        f"error: model_base_path={str(base) + chr(1)!r} holds a control character ('\\x01' "
        f"at position {len(str(base))}); expected a path without control characters"]

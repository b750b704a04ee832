"""benchmarks.serving_latency: the rows of a small run (TensorFlow's paths,
ONNX Runtime, PyTorch) and a wrong --export_dir."""

import importlib.util
import json
import subprocess
import sys

import pytest

from keras_identity import _cpu_kernels as cpu_kernels
from tests.backend import default_route
from tests.conftest import REPO

pytestmark = [default_route, pytest.mark.needs_tensorflow]

TENSORFLOW_PATHS = ("emulator", "emulator_xla", "saved_model", "keras")


def _cli(*args, timeout=600):
    return subprocess.run([sys.executable, "-m", "benchmarks.serving_latency", *args],
                          cwd=REPO, text=True, capture_output=True, timeout=timeout)


@pytest.fixture(scope="module")
def small_run(tmp_path_factory):
    """A pre-activation ResNet-8 that normalises its own inputs (no
    preprocessing.json beside it), exported, and one run of the program at
    batch 1 and 2: ``(stdout, the JSON, the version directory, the Keras
    model's parameter count)``."""
    import numpy as np

    import keras_identity as ki
    from keras_identity.serving.export import export_saved_model

    root = tmp_path_factory.mktemp("serving_latency")
    model = ki.models.preact_resnet(depth=8, include_preprocessing=True)
    model.get_layer("preprocessing").adapt(
        np.random.default_rng(0).uniform(0, 255, (16, 32, 32, 3)).astype("float32"))
    model.save(root / "model.keras")
    version_dir = export_saved_model(model, str(root / "serving"), warmup=False)
    out = root / "latency.json"
    result = _cli(f"--export_dir={root / 'serving'}", f"--model_path={root / 'model.keras'}",
                  "--batch_sizes=1,2", "--iterations=2", "--repeats=1", f"--out={out}")
    assert result.returncode == 0, result.stderr[-3000:]
    params = sum(int(np.prod(w.shape)) for w in model.trainable_weights)
    return result.stdout, json.loads(out.read_text()), version_dir, params


def _row(saved, key, batch):
    return next(r for r in saved["rows"] if r["key"] == key and r["batch"] == batch)


def test_tensorflow_rows_table_and_machine(small_run):
    stdout, saved, version_dir, _ = small_run
    assert "| path | batch | p50 ms | p90 ms | images/s | x ONNX Runtime | x PyTorch |" in stdout
    # The machine line names the vector units (where the CPU has them) and the
    # TensorFlow kernels; the workers ran the same ones.
    assert "(oneDNN CPU kernels)" in saved["machine"] or "(Eigen CPU kernels)" in saved["machine"]
    assert f"machine: {saved['machine']}" in stdout
    onednn = "(oneDNN CPU kernels)" in saved["machine"]
    if not cpu_kernels.user_set() and "avx2" in cpu_kernels.cpu_flags():
        # The serving choice on x86 (keras_identity._cpu_kernels): TensorFlow's own.
        assert onednn is cpu_kernels.tensorflow_default()
    assert [(r["key"], r["batch"]) for r in saved["rows"]] == [
        (key, batch) for batch in (1, 2) for key in
        ("emulator", "emulator_xla", "saved_model", "keras", "onnxruntime", "pytorch")]
    for batch in (1, 2):
        for key in TENSORFLOW_PATHS:
            row = _row(saved, key, batch)
            assert 0 < row["p50_ms"] <= row["p90_ms"] and row["rounds"] == 1
            assert row["images_per_sec"] == pytest.approx(batch * 1000 / row["p50_ms"])
            assert row["onednn"] is onednn and "tensorflow" in row["imported"]
    # No preprocessing.json is needed, and the image size is the model's.
    assert saved["settings"]["image"] == [32, 32, 3]
    assert "SavedModel in a TF1 session (as TF Serving) | 1 |" in stdout
    # The --jit_compile export of the same model, run with XLA on; the
    # export given needs none.
    assert _row(saved, "emulator_xla", 1)["needs_xla"] == ["jit_compile"]
    assert _row(saved, "emulator", 1)["needs_xla"] == []
    assert ("SavedModel --jit_compile in a TF1 session (TF Serving "
            "--xla_cpu_compilation_enabled=true) | 2 |") in stdout


def _probe(code):
    """Runs ``code`` with benchmarks.serving_latency imported as ``bench``
    in a process of its own (its flags share names with benchmarks.run's,
    which this test process may have imported); its last line of output."""
    result = subprocess.run(
        [sys.executable, "-c", "from benchmarks import serving_latency as bench\n" + code],
        cwd=REPO, text=True, capture_output=True, timeout=120)
    assert result.returncode == 0, result.stderr[-2000:]
    return result.stdout.strip().splitlines()[-1]


def test_image_size_from_the_export(small_run):
    # serving_default's own check (a model of any input size has none).
    assert _probe(f"print(bench._export_check_size({small_run[2]!r}))") == "(32, 32, 3)"


def test_onnxruntime_row(small_run):
    pytest.importorskip("onnxruntime")
    pytest.importorskip("tf2onnx")  # Keras's ONNX export on TensorFlow
    _, saved, _, _ = small_run
    for batch in (1, 2):
        row = _row(saved, "onnxruntime", batch)
        assert row["p50_ms"] > 0 and row["vs_onnxruntime"] == 1.0
        assert row["max_abs_diff"] < 1e-4  # Keras's outputs
        assert row["imported"] == ["onnxruntime"]  # no TensorFlow beside it
        keras_row = _row(saved, "keras", batch)
        assert keras_row["vs_onnxruntime"] == pytest.approx(
            keras_row["p50_ms"] / row["p50_ms"])


def test_pytorch_row(small_run):
    if importlib.util.find_spec("torch") is None:   # not imported: see tests/conftest.py
        pytest.skip("PyTorch is not installed")
    _, saved, _, params = small_run
    for batch in (1, 2):
        row = _row(saved, "pytorch", batch)
        assert row["p50_ms"] > 0 and row["vs_pytorch"] == 1.0
        assert row["params"] == params and row["imported"] == ["torch"]
    assert "random weights" in " ".join(saved["notes"])


def test_rows_without_their_packages_say_why(small_run):
    stdout, saved, _, _ = small_run
    missing = [(key, package) for key, module, package in (
        ("onnxruntime", "onnxruntime", "onnxruntime"), ("onnxruntime", "tf2onnx", "tf2onnx"),
        ("pytorch", "torch", "torch")) if importlib.util.find_spec(module) is None]
    if not missing:
        pytest.skip("onnxruntime, tf2onnx and torch are installed")
    for key, package in missing:
        row = _row(saved, key, 1)
        assert "p50_ms" not in row and "pip install" in row["skipped"]
        assert package in row["skipped"].split("pip install ")[1]
        assert row["skipped"] in stdout


def test_the_onnx_row_names_every_missing_package(tmp_path):
    path = str(tmp_path / "m.onnx")
    assert _probe(
        "bench.FLAGS(['serving_latency'])\n"
        "bench._missing = lambda module: module != 'onnxruntime'\n"
        f"print(bench._export_onnx(None, {path!r}))") == (
        "tf2onnx not installed: pip install tf2onnx (the bench extra)")
    assert _probe(
        "bench.FLAGS(['serving_latency'])\n"
        "bench._missing = lambda module: True\n"
        f"print(bench._export_onnx(None, {path!r}))") == (
        "onnxruntime and tf2onnx not installed: pip install onnxruntime tf2onnx (the bench "
        "extra)")


@pytest.mark.parametrize("where, words", [
    ("missing", ["does not exist"]),
    ("empty", ["neither a SavedModel version nor a directory of numbered versions"]),
])
def test_a_wrong_export_dir_fails_in_one_line(tmp_path, where, words):
    export_dir = tmp_path / where
    if where == "empty":
        export_dir.mkdir()
    result = _cli(f"--export_dir={export_dir}", "--iterations=2", "--repeats=1", timeout=120)
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: --export_dir=")
    for word in words:
        assert word in lines[0]

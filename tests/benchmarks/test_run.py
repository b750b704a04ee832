"""benchmarks.run: the table, the JSON, the PyTorch rebuild and bad flags."""

import importlib.util
import json
import platform
import subprocess
import sys

import pytest

import keras_identity as ki
from benchmarks import run as bench
from keras_identity import _cpu_kernels as cpu_kernels
from keras_identity import _tensorflow
from keras_identity.training import cpu_threads
from tests.backend import default_route
from tests.conftest import REPO
from tests.programs import run_refusals


def _cli(*args, timeout=600):
    return subprocess.run([sys.executable, "-m", "benchmarks.run", *args], cwd=REPO, text=True,
                          capture_output=True, timeout=timeout)


def test_forward_flops_of_resnet164():
    # ResNet-164 on 32x32 inputs: about 0.245 G multiply-adds per image
    # forward (the usual "0.25 GMACs"), counted as 2 FLOPs each.
    assert bench.forward_flops(164) == pytest.approx(4.9e8, rel=0.01)
    assert bench.forward_flops(1001) > 5 * bench.forward_flops(164)
    # A gate or a projection on every unit: one more 1x1 convolution of 4d to
    # 4d channels, 16d^2 multiply-adds per pixel against the bottleneck's
    # 4d*d + 9d^2 + d*4d = 17d^2; the gated net also gates its first units.
    identity = bench.forward_flops(164)
    gated = bench.forward_flops(164, shortcut="exclusive_gating")
    projected = bench.forward_flops(164, shortcut="conv1x1")
    assert 1.85 * identity < projected < gated < 1.95 * identity


@default_route
def test_small_run_writes_table_and_json(tmp_path):
    out = tmp_path / "bench.json"
    result = _cli("--models=preact_resnet11", "--modes=scan", "--notorch",
                  "--shortcuts=identity,exclusive_gating", "--batch_sizes=preact_resnet11:4",
                  "--steps=2", "--warmup=0", "--backends=tensorflow,jax", "--jax_modes=scan",
                  "--precisions=float32", "--repeats=2", f"--output_json={out}")
    assert result.returncode == 0, result.stderr[-2000:]
    assert "Machine:" in result.stdout and "MFU peak" in result.stdout
    assert "TensorFlow)" in result.stdout  # the peak: TensorFlow's matmul, where installed
    assert "median of 2 alternated runs" in result.stdout
    saved = json.loads(out.read_text())
    # TensorFlow's rows name their CPU kernels: oneDNN, the training choice, on
    # x86 with AVX2 (keras_identity._cpu_kernels).
    kernels = saved["rows"][0]["cpu_kernels"]
    if platform.machine() == "x86_64" and "avx2" in cpu_kernels.cpu_flags():
        assert kernels == "oneDNN"
    assert f"{kernels} CPU kernels" in result.stdout.splitlines()[0]
    # TensorFlow's thread pools as the trainer sets them for the batch (4).
    chosen = cpu_threads.choose(None, 4)
    threads = "TF's own" if chosen is None else f"{chosen[0]} x {chosen[1]} ops"
    assert (f"| preact_resnet11 | tensorflow | identity | scan | {kernels} | {threads} | "
            f"float32 | 4 |" in result.stdout)
    assert "| preact_resnet11 | jax | identity | scan | - | - | float32 | 4 |" in result.stdout
    # Alternated: each configuration once, then each again.
    launched = [line.split("--worker=")[0] + line.split("--worker=")[1].split()[0]
                for line in result.stdout.splitlines() if "--worker=preact" in line]
    assert launched[:3] == launched[3:] and len(set(launched)) == 3
    # Each measurement's numbers are printed as it ends (peak + 6 workers).
    ended = [line for line in result.stdout.splitlines() if line.startswith("    -> ")]
    assert len(ended) == 7 and all(" img/s, first step " in line for line in ended[1:])
    rows = saved["rows"]
    assert [(r["backend"], r["shortcut"], r["mode"]) for r in rows] == [
        ("tensorflow", "identity", "scan"), ("tensorflow", "exclusive_gating", "scan"),
        ("jax", "identity", "scan")]
    assert saved["peaks"]["float32"]["tflops"] > 0
    assert "matmul" in saved["peaks"]["float32"]["source"]
    params = ki.models.preact_resnet(11).count_params()
    for row in rows:
        assert row["images_per_s"] > 0 and row["peak_memory_mb"] > 100 and row["repeats"] == 2
        assert 0 < row["mfu"] < 1 and row["first_step_vs_identity_scan"] > 0
    assert 0 < rows[0]["params"] <= params < rows[1]["params"]
    assert rows[2]["params"] == rows[0]["params"]


@pytest.mark.slow
@default_route
def test_the_library_paths_choose_for_themselves(tmp_path):
    """Slow (45-105 s on 2 cores: a worker process per import order).  The
    kernels the library's import orders get are checked in the default run
    by tests/test_cpu_kernels.py, and the benchmark's table and workers by
    test_small_run_writes_table_and_json; --tf_imports' rows (Keras imported
    first, the thread pools each order gets) only here."""
    # The quickstart's order (keras_identity first) gets keras_identity's
    # training kernels without the parent's choice; Keras first gets
    # TensorFlow's own for the CPU; neither gets the trainer's thread pools.
    out = tmp_path / "bench.json"
    result = _cli("--models=preact_resnet11", "--modes=scan", "--notorch",
                  "--batch_sizes=preact_resnet11:4", "--steps=2", "--warmup=0",
                  "--backends=tensorflow", "--precisions=float32", "--repeats=1",
                  "--tf_imports=program,quickstart,keras_first", f"--output_json={out}")
    assert result.returncode == 0, result.stderr[-2000:]
    rows = json.loads(out.read_text())["rows"]
    assert [row["imports"] for row in rows] == ["program", "quickstart", "keras_first"]
    avx2_x86 = platform.machine() == "x86_64" and "avx2" in cpu_kernels.cpu_flags()
    if avx2_x86:
        assert rows[0]["cpu_kernels"] == rows[1]["cpu_kernels"] == "oneDNN"
        own = "oneDNN" if cpu_kernels.tensorflow_default() else "Eigen"
        assert rows[2]["cpu_kernels"] == own
    assert rows[1]["tf_threads_used"] == rows[2]["tf_threads_used"] == "TF's own"
    assert "| imported as |" in result.stdout
    assert "| preact_resnet11 | tensorflow | identity | scan | keras_first |" in result.stdout


def test_forward_flops_of_the_basic_nets():
    # ResNet-110: 18 units of two 3x3 convolutions per stage, option A shortcuts
    # (no projection): about 0.25 G multiply-adds per image, as ResNet-164.
    assert bench.forward_flops(110) == pytest.approx(5.06e8, rel=0.01)
    assert bench.forward_flops(56) < bench.forward_flops(110) / 1.9


def test_pytorch_worker_imports_neither_tensorflow_nor_keras(tmp_path):
    # The reference runs in a process of its own, so that no TensorFlow or
    # Keras library (and none of their native code) shares it with PyTorch.
    if importlib.util.find_spec("torch") is None:   # not imported: see tests/conftest.py
        pytest.skip("PyTorch is not installed")
    probe = ("import runpy, sys\n"
             "sys.argv = ['torch_resnet', '--depth=20', '--batch=2', '--steps=2', '--warmup=0',"
             " '--precision=bfloat16']\n"
             "runpy.run_module('benchmarks.torch_resnet', run_name='__main__')\n"
             "print('LOADED', sorted({m.split('.')[0] for m in sys.modules} & "
             "{'tensorflow', 'keras', 'jax', 'keras_identity'}))\n")
    result = subprocess.run([sys.executable, "-c", probe], cwd=REPO, text=True,
                            capture_output=True, timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    measured = json.loads(result.stdout.split("RESULT ")[1].splitlines()[0])
    assert measured["mode"] == "channels_last" and measured["images_per_s"] > 0
    assert measured["params"] == sum(int(w.numpy().size) for w in
                                     ki.models.preact_resnet(20).trainable_weights)
    assert "LOADED []" in result.stdout


_BAD_FLAGS = [
    (["--models=resnet50"], ["--models", "CIFAR-10"]),
    (["--models=preact_resnet12"], ["--models", "6n+2", "9n+2"]),
    (["--modes=fast"], ["--modes", "'fast'"]),
    (["--shortcuts=gated"], ["--shortcuts", "'gated'"]),
    (["--models=preact_resnet164_cifar100"], ["--models", "CIFAR-10"]),
    (["--batch_sizes=preact_resnet164:0"], ["--batch_sizes"]),
    (["--backends=torch"], ["--backends", "'torch'"]),
    (["--jax_modes=fast"], ["--jax_modes", "'fast'"]),
    (["--precisions=float16"], ["--precisions", "'float16'"]),
    (["--repeats=0"], ["--repeats=0"]),
    (["--tf_threads=many"], ["--tf_threads", "'many'", "auto, tensorflow"]),
    (["--tf_imports=notebook"], ["--tf_imports", "'notebook'", "quickstart, keras_first"]),
]


@pytest.fixture(scope="module")
def refusals():
    """Every bad-flag case's (exit code, stderr), the program's ``run()`` in
    one process (tests/programs.py); the small runs above are its process."""
    return run_refusals("benchmarks.run", [args + ["--notorch"] for args, _ in _BAD_FLAGS])


@pytest.mark.parametrize("case", range(len(_BAD_FLAGS)),
                         ids=[args[0] for args, _ in _BAD_FLAGS])
def test_bad_flags_exit_with_one_line(refusals, case):
    code, stderr = refusals[case]
    assert code != 0
    last = stderr.strip().splitlines()[-1]
    for word in _BAD_FLAGS[case][1]:
        assert word in last


_TORCH_COUNTS = """
import json, sys
from benchmarks import torch_resnet
print(json.dumps({depth: torch_resnet.count_parameters(torch_resnet.build(int(depth)))
                  for depth in sys.argv[1:]}))
"""


def test_pytorch_rebuild_has_the_keras_parameter_count():
    """PyTorch in a process of its own (never beside TensorFlow in a test
    process: see tests/conftest.py)."""
    if importlib.util.find_spec("torch") is None:
        pytest.skip("PyTorch is not installed")
    depths = (110, 164, 1001)
    done = subprocess.run([sys.executable, "-c", _TORCH_COUNTS, *map(str, depths)], cwd=REPO,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    counts = json.loads(done.stdout.strip().splitlines()[-1])
    for depth in depths:
        keras_params = sum(int(w.numpy().size) for w in
                           ki.models.preact_resnet(depth, stage_mode="scan").trainable_weights)
        assert counts[str(depth)] == keras_params


def test_machine_table_shows_missing_values_and_failures():
    from benchmarks import machine
    text = machine.table(
        [dict(mode="scan", speed=12.345, ratio=None), dict(mode="unrolled", speed="failed: x")],
        [("mode", "mode", "{}"), ("speed", "img/s", "{:.1f}"), ("ratio", "x PyTorch", "{:.2f}")])
    assert text.splitlines()[2:] == ["| scan | 12.3 | - |", "| unrolled | failed: x | - |"]


@pytest.mark.skipif(_tensorflow.available(), reason="a machine without TensorFlow: the "
                                                   "JAX leg; the JAX rows beside TensorFlow: "
                                                   "test_small_run_writes_table_and_json")
def test_a_jax_run_needs_no_tensorflow(tmp_path):
    """A machine with JAX and no TensorFlow (a GPU box, a TPU VM) runs the JAX
    rows; the MFU peak is then JAX's matmul."""
    out = tmp_path / "bench.json"
    result = _cli("--models=preact_resnet11", "--notorch", "--shortcuts=identity",
                  "--batch_sizes=preact_resnet11:4", "--steps=2", "--warmup=0",
                  "--backends=jax", "--jax_modes=scan", "--precisions=float32", "--repeats=1",
                  f"--output_json={out}")
    assert result.returncode == 0, result.stderr[-2000:]
    assert "| preact_resnet11 | jax | identity | scan | float32 | 4 |" in result.stdout
    assert "2048, JAX)" in result.stdout
    assert [r["backend"] for r in json.loads(out.read_text())["rows"]] == ["jax"]


@pytest.mark.parametrize("description, precision, peak", [
    ("AMD EPYC, 2 cores, TensorFlow 2.21.0, JAX 0.10.2", "bfloat16", 0.4),
    ("Intel Xeon, 12 cores, GPU NVIDIA H100 80GB HBM3 x1, JAX 0.10.2", "bfloat16", 989.0),
    ("Intel Xeon, 12 cores, GPU NVIDIA H100 80GB HBM3 x1, JAX 0.10.2", "float32", 0.4),
    ("AMD EPYC, 224 cores, TPU v5 lite x8, JAX 0.10.2", "bfloat16", 197.0),
    ("AMD EPYC, 224 cores, TPU v5 x4, JAX 0.10.2", "bfloat16", 459.0),
])
def test_mfu_peak_of_the_device(description, precision, peak):
    # 16-bit rows on a known accelerator use its dense 16-bit peak, others the
    # float32 matmul peak measured in the run (0.4 here).
    # The defaults, without validating every program's flags that this test
    # process has defined (a server's required --model_base_path, say).
    if not bench.FLAGS.is_parsed():
        bench.FLAGS.mark_as_parsed()
    assert bench.FLAGS.peak_tflops is None
    assert bench._peak_tflops(description, 0.4, precision)[0] == peak


def test_each_measurement_prints_its_line():
    assert bench._result_line(dict(images_per_s=28733.2, first_step_s=9.61,
                                   peak_memory_mb=1234.4)) == (
        "28,733.2 img/s, first step 9.6 s, peak 1,234 MB")
    assert bench._result_line(dict(tflops=51.25)) == "51.250 TFLOP/s"
    assert bench._result_line(dict(error="timed out after 190 s")) == (
        "failed: timed out after 190 s")

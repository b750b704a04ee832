"""benchmarks.run: the table, the JSON, the PyTorch rebuild and bad flags."""

import json
import subprocess
import sys

import pytest

import keras_identity as ki
from benchmarks import run as bench
from tests.conftest import REPO


def _cli(*args, timeout=600):
    return subprocess.run([sys.executable, "-m", "benchmarks.run", *args], cwd=REPO, text=True,
                          capture_output=True, timeout=timeout)


def test_forward_flops_of_resnet164():
    # ResNet-164 on 32x32 inputs: about 0.245 G multiply-adds per image
    # forward (the usual "0.25 GMACs"), counted as 2 FLOPs each.
    assert bench.forward_flops(164) == pytest.approx(4.9e8, rel=0.01)
    assert bench.forward_flops(1001) > 5 * bench.forward_flops(164)


def test_small_run_writes_table_and_json(tmp_path):
    out = tmp_path / "bench.json"
    result = _cli("--models=preact_resnet11", "--modes=unrolled,scan", "--notorch",
                  "--batch_sizes=preact_resnet11:4", "--steps=2", "--warmup=0",
                  f"--output_json={out}")
    assert result.returncode == 0, result.stderr[-2000:]
    assert "Machine:" in result.stdout and "| preact_resnet11 | scan | 4 |" in result.stdout
    rows = json.loads(out.read_text())["rows"]
    assert [r["mode"] for r in rows] == ["unrolled", "scan"]
    params = ki.models.preact_resnet(11).count_params()
    for row in rows:
        assert row["images_per_s"] > 0 and row["peak_memory_mb"] > 100
        assert 0 < row["params"] <= params


@pytest.mark.parametrize("args, words", [
    (["--models=resnet50"], ["--models", "9n+2"]),
    (["--modes=fast"], ["--modes", "'fast'"]),
    (["--batch_sizes=preact_resnet164:0"], ["--batch_sizes"]),
])
def test_bad_flags_exit_with_one_line(args, words):
    result = _cli(*args, "--notorch")
    assert result.returncode != 0
    last = result.stderr.strip().splitlines()[-1]
    for word in words:
        assert word in last


def test_pytorch_rebuild_has_the_keras_parameter_count():
    pytest.importorskip("torch")
    from benchmarks import torch_resnet
    for depth in (164, 1001):
        keras_params = sum(int(w.numpy().size) for w in
                           ki.models.preact_resnet(depth, stage_mode="scan").trainable_weights)
        model = torch_resnet.build(depth, expected_parameters=keras_params)
        assert torch_resnet.count_parameters(model) == keras_params


def test_machine_table_shows_missing_values_and_failures():
    from benchmarks import machine
    text = machine.table(
        [dict(mode="scan", speed=12.345, ratio=None), dict(mode="unrolled", speed="failed: x")],
        [("mode", "mode", "{}"), ("speed", "img/s", "{:.1f}"), ("ratio", "x PyTorch", "{:.2f}")])
    assert text.splitlines()[2:] == ["| scan | 12.3 | - |", "| unrolled | failed: x | - |"]

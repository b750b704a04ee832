"""benchmarks.onednn_calls: oneDNN's log summed by kind and implementation."""

import json
import subprocess
import sys

import pytest

from benchmarks import onednn_calls
from keras_identity_cli import machine
from tests.backend import default_route
from tests.conftest import REPO

LOG = [
    "onednn_verbose,v1,info,oneDNN v3.7.0",
    "onednn_verbose,v1,primitive,exec,cpu,convolution,brg_conv_fwd:avx2,forward_training,"
    "src:f32::blocked:acdb::f0 wei:f32::blocked:Acdb8a::f0,,alg:convolution_direct,"
    "mb16_ic16oc16_ih32oh32kh3sh1dh0ph1_iw32ow32kw3sw1dw0pw1,0.25",
    "onednn_verbose,v1,primitive,exec,cpu,convolution,brg_conv_fwd:avx2,forward_training,"
    "src:f32::blocked:acdb::f0,,alg:convolution_direct,mb16_ic16oc16_ih32oh32kh3sh1,0.75",
    "onednn_verbose,exec,cpu,batch_normalization,bnorm_tbb_jit:avx2,backward,data_f32::"
    "blocked:acdb::f0,flags:CH,mb16ic64ih32iw32,1.5",
    "onednn_verbose,v1,primitive,create:cache_miss,cpu,convolution,jit:avx2,forward,,,9.0",
    "KI_STEPS_BEGIN",
]


def test_calls_are_summed_by_kind_propagation_and_implementation():
    calls = onednn_calls.parse(LOG)
    assert dict(calls) == {
        ("convolution", "forward_training", "brg_conv_fwd:avx2"): [2, pytest.approx(1.0)],
        ("batch_normalization", "backward", "bnorm_tbb_jit:avx2"): [1, pytest.approx(1.5)]}
    kinds = onednn_calls._by_kind({key: tuple(value) for key, value in calls.items()})
    assert kinds[("convolution", "forward_training")] == [2, pytest.approx(1.0)]


def test_the_machine_line_names_a_cap_on_the_vector_units(monkeypatch):
    monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", "AVX2")
    monkeypatch.setenv("ATEN_CPU_CAPABILITY", "avx2")
    line = machine.describe()
    assert "oneDNN capped at AVX2 (ONEDNN_MAX_CPU_ISA)" in line
    assert "PyTorch's ATen capped at avx2" in line
    monkeypatch.delenv("ONEDNN_MAX_CPU_ISA")
    monkeypatch.delenv("ATEN_CPU_CAPABILITY")
    assert "capped" not in machine.describe()


@default_route
@pytest.mark.needs_tensorflow
def test_a_small_profile_counts_the_steps_convolutions(tmp_path):
    out = tmp_path / "calls.json"
    done = subprocess.run([sys.executable, "-m", "benchmarks.onednn_calls", "--depth=8",
                           "--batch=4", "--steps=2", "--warmup=0", "--notorch",
                           f"--output_json={out}"], cwd=REPO, text=True, capture_output=True,
                          timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    saved = json.loads(out.read_text())
    if "oneDNN CPU kernels" not in saved["machine"]:
        pytest.skip("TensorFlow runs Eigen's kernels here: no oneDNN log")
    calls = saved["calls"]["tensorflow"]
    # ResNet-8 (basic units, option A shortcuts): the stem and 3 units of 2
    # convolutions, each with its kernel's gradient, per step.
    forward = sum(c["calls"] for c in calls if c["kind"] == "convolution"
                  and c["prop"] == "forward_training")
    weights = sum(c["calls"] for c in calls if c["kind"] == "convolution"
                  and c["prop"] == "backward_weights")
    assert weights == 7 and forward >= 7
    assert saved["step_ms"]["tensorflow"] > 0
    assert "| convolution backward_weights | 7 |" in done.stdout


def test_bad_flags_exit_with_one_line():
    done = subprocess.run([sys.executable, "-m", "benchmarks.onednn_calls", "--steps=0",
                           "--notorch"], cwd=REPO, text=True, capture_output=True, timeout=120)
    assert done.returncode != 0
    assert done.stderr.strip().splitlines()[-1] == (
        "benchmarks.onednn_calls: --steps=0 is not valid; expected at least 1.")

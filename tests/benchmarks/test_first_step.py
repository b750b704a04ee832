"""benchmarks.first_step: the first-step breakdown table and bad flags."""

import subprocess
import sys

import keras
import pytest

from tests.conftest import REPO


def _cli(*args, timeout=600):
    return subprocess.run([sys.executable, "-m", "benchmarks.first_step", *args], cwd=REPO,
                          text=True, capture_output=True, timeout=timeout)


def test_small_run_prints_the_breakdown():
    if keras.backend.backend() != "tensorflow":
        result = _cli("--depth=20", "--batch_size=8", "--steps=2")
        assert result.returncode != 0
        assert "measures TensorFlow's tracing" in result.stderr.strip().splitlines()[-1]
        return
    result = _cli("--depth=20", "--batch_size=8", "--steps=2", "--recompute=bn_relu",
                  "--pretouch_mb=32")
    assert result.returncode == 0, result.stderr[-2000:]
    assert "Machine:" in result.stdout
    header, _, row = [l for l in result.stdout.splitlines() if l.startswith("|")]
    cells = dict(zip((c.strip() for c in header.strip("|").split("|")),
                     (c.strip() for c in row.strip("|").split("|"))))
    assert cells["model"] == "preact_resnet20"
    assert cells["mode"] == "scan, recompute=bn_relu"
    assert cells["pre-touched MB"] == "32"
    first, steady = float(cells["first step s"]), float(cells["steady step s"])
    # The first call traces and sets up the graph: far longer than a step.
    assert first > steady > 0
    assert float(cells["second trace s"]) > 0
    faults = int(cells["page faults, first step"].replace(",", ""))
    assert faults >= 0 and float(cells["peak MB"].replace(",", "")) > 100


@pytest.mark.parametrize("args, words", [
    (["--depth=100"], ["--depth=100", "9n+2"]),
    (["--recompute=all"], ["--recompute=all", "bn_relu"]),
    (["--pretouch_mb=-1"], ["--pretouch_mb=-1"]),
])
def test_bad_flags_exit_with_one_line(args, words):
    result = _cli(*args)
    assert result.returncode != 0
    last = result.stderr.strip().splitlines()[-1]
    for word in words:
        assert word in last

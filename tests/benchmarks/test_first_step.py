"""benchmarks.first_step: the first-step breakdown table and bad flags."""

import subprocess
import sys

import keras
import pytest

from tests.conftest import REPO
from tests.programs import run_refusals


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


BAD_FLAGS = [
    (["--depth=100"], ["--depth=100", "9n+2"]),
    (["--recompute=all"], ["--recompute=all", "bn_relu"]),
    (["--pretouch_mb=-1"], ["--pretouch_mb=-1"]),
]


@pytest.fixture(scope="module")
def bad_flag_runs():
    """Each of BAD_FLAGS's runs, all in one process."""
    return run_refusals("benchmarks.first_step", [args for args, _ in BAD_FLAGS])


@pytest.mark.parametrize("args, words", BAD_FLAGS)
def test_bad_flags_exit_with_one_line(args, words, bad_flag_runs):
    code, stderr = bad_flag_runs[BAD_FLAGS.index((args, words))]
    assert code != 0
    last = stderr.strip().splitlines()[-1]
    for word in words:
        assert word in last

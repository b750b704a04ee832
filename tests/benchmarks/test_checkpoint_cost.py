"""benchmarks.checkpoint_cost: a checkpoint's time and size beside a step's,
in a local folder and a bucket, leaving nothing behind; bad flags."""

import os
import subprocess
import sys

import keras
import pytest

from keras_identity import storage
from tests.conftest import REPO
from tests.programs import run_refusals


def _cli(*args, env=None, timeout=600):
    return subprocess.run([sys.executable, "-m", "benchmarks.checkpoint_cost", *args],
                          cwd=REPO, text=True, capture_output=True, timeout=timeout,
                          env=dict(os.environ, **(env or {})))


def _rows(stdout):
    header, _, *rows = [l for l in stdout.splitlines() if l.startswith("|")]
    titles = [c.strip() for c in header.strip("|").split("|")]
    return [dict(zip(titles, (c.strip() for c in row.strip("|").split("|")))) for row in rows]


@pytest.mark.parametrize("where", ["local", "bucket"])
def test_a_small_run_prints_the_cost_and_removes_its_checkpoints(where, tmp_path,
                                                                 gcs_emulator):
    directory = str(tmp_path) if where == "local" else gcs_emulator("bench")
    result = _cli("--depths=11", "--batch_size=4", "--steps=2", "--saves=2",
                  f"--model_dir={directory}", env={"STORAGE_EMULATOR_HOST": gcs_emulator.url})
    assert result.returncode == 0, result.stderr[-2000:]
    assert "Machine:" in result.stdout and f"Checkpoints written into {directory}" in \
        result.stdout
    rows = _rows(result.stdout)
    # Both formats on JAX (Orbax's the default there), HDF5 on TensorFlow.
    assert [row["format"] for row in rows] == (
        ["h5", "orbax"] if keras.backend.backend() == "jax" else ["h5"])
    for cells in rows:
        assert cells["model"] == "preact_resnet11"
        step, paused = float(cells["step s"]), float(cells["training paused s"])
        written = float(cells["written within s"])
        assert 0 < paused <= written and step > 0
        if cells["format"] == "h5":  # training waits for the whole write
            assert cells["step s, checkpoint in flight"] == "-"
            assert float(cells["checkpoint, in steps"]) == pytest.approx(paused / step,
                                                                         rel=0.05)
        # The weights and their momenta, in float32: about 2 x 4 bytes a parameter.
        assert 0.1 < float(cells["checkpoint MB"]) < 5
    assert storage.list_files(directory) == []


BAD_FLAGS = [
    (["--depths=100"], ["--depths=100", "9n+2"]),
    (["--depths=x"], ["--depths=x", "whole numbers"]),
    (["--saves=0"], ["--saves=0"]),
    (["--formats=zip"], ["--formats=zip", "h5 or orbax"]),
    (["--model_dir=ftp://host/x"], ["--model_dir=ftp://host/x", "ftp://"]),
]


@pytest.fixture(scope="module")
def bad_flag_runs():
    """Each of BAD_FLAGS's runs, all in one process."""
    return run_refusals("benchmarks.checkpoint_cost", [args for args, _ in BAD_FLAGS])


@pytest.mark.parametrize("args, words", BAD_FLAGS)
def test_bad_flags_exit_with_one_line(args, words, bad_flag_runs):
    code, stderr = bad_flag_runs[BAD_FLAGS.index((args, words))]
    assert code != 0
    last = stderr.strip().splitlines()[-1]
    for word in words:
        assert word in last, stderr

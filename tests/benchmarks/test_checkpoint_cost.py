"""benchmarks.checkpoint_cost: a checkpoint's time and size beside a step's,
in a local folder and a bucket, leaving nothing behind; bad flags."""

import os
import subprocess
import sys

import pytest

from keras_identity import storage
from tests.conftest import REPO


def _cli(*args, env=None, timeout=600):
    return subprocess.run([sys.executable, "-m", "benchmarks.checkpoint_cost", *args],
                          cwd=REPO, text=True, capture_output=True, timeout=timeout,
                          env=dict(os.environ, **(env or {})))


def _row(stdout):
    header, _, row = [l for l in stdout.splitlines() if l.startswith("|")]
    return dict(zip((c.strip() for c in header.strip("|").split("|")),
                    (c.strip() for c in row.strip("|").split("|"))))


@pytest.mark.parametrize("where", ["local", "bucket"])
def test_a_small_run_prints_the_cost_and_removes_its_checkpoints(where, tmp_path,
                                                                 gcs_emulator):
    directory = str(tmp_path) if where == "local" else gcs_emulator("bench")
    result = _cli("--depths=11", "--batch_size=4", "--steps=2", "--saves=2",
                  f"--model_dir={directory}", env={"STORAGE_EMULATOR_HOST": gcs_emulator.url})
    assert result.returncode == 0, result.stderr[-2000:]
    assert "Machine:" in result.stdout and f"Checkpoints written into {directory}" in \
        result.stdout
    cells = _row(result.stdout)
    assert cells["model"] == "preact_resnet11"
    step, save = float(cells["step s"]), float(cells["checkpoint s"])
    assert step > 0 and save > 0
    assert float(cells["checkpoint, in steps"]) == pytest.approx(save / step, rel=0.05)
    # The weights and their momenta, in float32: about 2 x 4 bytes a parameter.
    assert 0.1 < float(cells["checkpoint MB"]) < 5
    assert storage.list_files(directory) == []


@pytest.mark.parametrize("args, words", [
    (["--depths=100"], ["--depths=100", "9n+2"]),
    (["--depths=x"], ["--depths=x", "whole numbers"]),
    (["--saves=0"], ["--saves=0"]),
    (["--model_dir=ftp://host/x"], ["--model_dir=ftp://host/x", "ftp://"]),
])
def test_bad_flags_exit_with_one_line(args, words):
    result = _cli(*args)
    assert result.returncode != 0
    last = result.stderr.strip().splitlines()[-1]
    for word in words:
        assert word in last, result.stderr

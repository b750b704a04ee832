"""A run checkpointed on TensorFlow (HDF5) resumes on JAX (same weights and
optimizer state) and says so; a JAX run's Orbax checkpoints are refused by
TensorFlow in one line naming the way on."""

import os
import subprocess
import sys

import pytest

from keras_identity.training import TrainConfig
from keras_identity.training import train
from tests.backend import jax_only

pytestmark = [jax_only, pytest.mark.needs_tensorflow]

CONFIG = dict(model="highway_net", depth=10, dataset="mnist", steps_per_epoch=5,
              batch_size=32, train_examples=320, test_examples=64, verbose=0)

FIRST = r"""
import sys

import pytest
from keras_identity.training import TrainConfig, train
train(TrainConfig(train_steps=5, model_dir=sys.argv[1], **{CONFIG}), print_fn=lambda *a: None)
""".replace("{CONFIG}", repr(CONFIG))


def test_a_tensorflow_run_resumes_on_jax(tmp_path):
    subprocess.run([sys.executable, "-c", FIRST, str(tmp_path)], check=True,
                   env=dict(os.environ, KERAS_BACKEND="tensorflow"))
    lines = []
    result = train(TrainConfig(train_steps=10, model_dir=str(tmp_path), **CONFIG),
                   print_fn=lines.append)
    assert any(line.startswith("resuming from the checkpoint at step 5") for line in lines)
    assert any("trained on the tensorflow backend until now; it continues on jax" in line
               for line in lines)
    assert result["steps"] == 10 and [h["step"] for h in result["history"]] == [5, 10]
    # JAX wrote Orbax checkpoints beside TensorFlow's HDF5 ones.
    assert "ckpt_000000010" in os.listdir(tmp_path / "checkpoints")


def test_a_jax_run_is_refused_by_tensorflow_in_one_line_naming_the_way_on(tmp_path):
    train(TrainConfig(train_steps=5, model_dir=str(tmp_path), **CONFIG), print_fn=lambda *a: None)
    second = FIRST.replace("train_steps=5", "train_steps=10")
    done = subprocess.run([sys.executable, "-c", second, str(tmp_path)], capture_output=True,
                          text=True, env=dict(os.environ, KERAS_BACKEND="tensorflow"))
    assert done.returncode != 0
    last = done.stderr.strip().splitlines()[-1]
    assert "holds Orbax checkpoints (the newest: ckpt_000000005), written on the JAX backend" \
        in last and "--backend=jax" in last, done.stderr[-2000:]
    assert os.listdir(tmp_path / "checkpoints") == ["ckpt_000000005"]

"""A run checkpointed on TensorFlow resumes on JAX (same weights and
optimizer state), and says so."""

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

"""Backends other than TensorFlow and JAX: the unrolled layers and models
work (PyTorch), the TensorFlow/JAX-only pieces say so in one line."""

import importlib.util
import os
import subprocess
import sys

import pytest


TORCH = r"""
import numpy as np
import keras_identity as ki
m = ki.models.preact_resnet(11, input_shape=(8, 8, 3))
m.compile("sgd", "sparse_categorical_crossentropy")
m.fit(np.zeros((4, 8, 8, 3), "float32"), np.zeros(4, "int32"), epochs=1, verbose=0)
assert m.predict(np.zeros((2, 8, 8, 3), "float32"), verbose=0).shape == (2, 10)
# stage_mode="auto" unrolls long stages on this backend ...
deep = ki.models.preact_resnet(164, input_shape=(8, 8, 3))
assert not any(type(l).__name__ == "ResidualStack" for l in deep.layers)
for build in (lambda: ki.models.preact_resnet(164, stage_mode="scan"),
              lambda: ki.layers.ResidualStack(8, 3)):
    try:
        build()
    except ValueError as error:
        print("REFUSED", error)
from keras_identity.training import strategies
try:
    strategies.get_strategy("auto")
except ValueError as error:
    print("REFUSED", error)
"""


@pytest.mark.skipif(importlib.util.find_spec("torch") is None, reason="PyTorch not installed")
def test_torch_backend_runs_unrolled_models_and_refuses_the_rest():
    done = subprocess.run([sys.executable, "-c", TORCH], capture_output=True, text=True,
                          env=dict(os.environ, KERAS_BACKEND="torch"), timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    refused = [line for line in done.stdout.splitlines() if line.startswith("REFUSED")]
    assert len(refused) == 3
    assert "stage_mode='scan' is not valid with the 'torch' backend" in refused[0]
    assert "ResidualStack's loop runs on the TensorFlow and JAX backends" in refused[1]
    assert "training runs on the TensorFlow and JAX backends" in refused[2]


def test_an_unknown_backend_flag_is_refused_in_one_line():
    done = subprocess.run([sys.executable, "-m", "keras_identity_cli.train", "--backend=torch"],
                          capture_output=True, text=True, timeout=300,
                          cwd=os.path.dirname(os.path.dirname(os.path.dirname(
                              os.path.abspath(__file__)))))
    assert done.returncode == 2
    assert done.stderr.strip().splitlines()[-1] == (
        "error: --backend='torch' is not valid; expected one of: tensorflow, jax")

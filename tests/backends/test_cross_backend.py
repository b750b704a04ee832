"""TensorFlow and JAX compute the same network: a ``.keras`` file written on
one backend loads on the other with the same outputs and gradients, for
every Fig. 4 ordering x Fig. 2 shortcut and every block with each of them,
unrolled and looped.

Runs in the JAX leg of CI: the models are built and differentiated on JAX,
then a TensorFlow process loads the same files and differentiates them.
"""

import json
import os
import subprocess
import sys

import keras
import numpy as np
import pytest
from keras import ops

from keras_identity.layers import ResidualStack
from keras_identity.layers import ResidualUnit
from tests.backend import jax_only
from tests.backend import value_and_grad
from tests.combinations import ORDERING_SHORTCUT_BLOCK

pytestmark = [jax_only, pytest.mark.needs_tensorflow]

SHORTCUT_ARGS = {
    "identity": {}, "constant_scaling": dict(shortcut_scale=0.7, scale_residual=True),
    "exclusive_gating": dict(gate_bias_init=-1.0),
    "shortcut_only_gating": dict(gate_bias_init=1.0), "conv1x1": {},
    "dropout": dict(shortcut_dropout_rate=0.3)}
CASES = ORDERING_SHORTCUT_BLOCK


def _model(unit, shortcut, block):
    """A unit that changes the width, then a looped stack of two units."""
    filters = 16 if block == "bottleneck" else 4
    kwargs = dict(unit=unit, shortcut=shortcut, block=block, **SHORTCUT_ARGS[shortcut])
    inputs = keras.Input((4, 4, 3))
    x = ResidualUnit(filters, seed=1, **kwargs)(inputs)
    x = ResidualStack(filters, 2, seed=2, **kwargs)(x)
    model = keras.Model(inputs, x)
    rng = np.random.default_rng(0)
    for w in model.weights:  # BN parameters and statistics away from 0 and 1
        if "gamma" in w.path or "beta" in w.path or "moving" in w.path:
            w.assign(rng.uniform(0.5, 1.5, w.shape).astype("float32"))
    return model


# Differentiates each saved model on TensorFlow, as the JAX side below does.
TF_SIDE = r"""
import json, sys, os
os.environ["KERAS_BACKEND"] = "tensorflow"
import numpy as np, keras, tensorflow as tf
import keras_identity  # registers the layers
folder = sys.argv[1]
data = np.load(os.path.join(folder, "data.npz"))
x, target = data["x"], data["target"]
out = {}
for name in json.load(open(os.path.join(folder, "cases.json"))):
    model = keras.models.load_model(os.path.join(folder, name + ".keras"), safe_mode=True)
    out[name + "/inference"] = model(x, training=False).numpy()
    t = target[..., :out[name + "/inference"].shape[-1]]
    if "dropout" not in name:
        with tf.GradientTape() as tape:
            y = model(x, training=True)
            loss = tf.reduce_mean(tf.square(y - t))
        for i, g in enumerate(tape.gradient(loss, model.trainable_variables)):
            out[f"{name}/grad{i}"] = g.numpy()
        for i, v in enumerate(model.non_trainable_variables):
            out[f"{name}/state{i}"] = v.numpy()
np.savez(os.path.join(folder, "tf.npz"), **out)
"""


@pytest.fixture(scope="module")
def both_backends(tmp_path_factory):
    folder = tmp_path_factory.mktemp("cross_backend")
    rng = np.random.default_rng(1)
    x = rng.normal(size=(3, 4, 4, 3)).astype("float32")
    target = rng.normal(size=(3, 4, 4, 16)).astype("float32")
    np.savez(folder / "data.npz", x=x, target=target)
    names, jax_results = [], {}
    for case in CASES:
        name = "-".join(case)
        model = _model(*case)
        model.save(folder / f"{name}.keras")
        names.append(name)
        result = {"inference": np.asarray(model(x, training=False))}
        if case[1] != "dropout":  # random masks: each backend its own generator
            t = target[..., :result["inference"].shape[-1]]
            _, grads, _ = value_and_grad(
                model, lambda y, t=t: ops.mean(ops.square(y - t)), x)
            result["grads"] = [np.asarray(g) for g in grads]
            result["states"] = [np.asarray(v.value) for v in model.non_trainable_variables]
        jax_results[name] = result
    with open(folder / "cases.json", "w") as f:
        json.dump(names, f)
    subprocess.run([sys.executable, "-c", TF_SIDE, str(folder)], check=True,
                   env=dict(os.environ, KERAS_BACKEND="tensorflow"))
    tf_results = dict(np.load(folder / "tf.npz"))
    return jax_results, tf_results


@pytest.mark.parametrize("unit, shortcut, block", CASES)
def test_tensorflow_and_jax_agree(both_backends, unit, shortcut, block):
    jax_results, tf_results = both_backends
    name = f"{unit}-{shortcut}-{block}"
    got = jax_results[name]
    np.testing.assert_allclose(got["inference"], tf_results[f"{name}/inference"],
                               rtol=1e-4, atol=1e-5)
    if shortcut == "dropout":
        return
    assert got["grads"] and any(np.abs(g).max() > 0 for g in got["grads"])
    for i, g in enumerate(got["grads"]):
        np.testing.assert_allclose(g, tf_results[f"{name}/grad{i}"], rtol=1e-3, atol=1e-5,
                                   err_msg=f"gradient {i}")
    for i, v in enumerate(got["states"]):  # moving statistics after the training call
        np.testing.assert_allclose(v, tf_results[f"{name}/state{i}"], rtol=1e-4, atol=1e-5,
                                   err_msg=f"state {i}")

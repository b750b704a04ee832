"""What a TPU training step needs, checked on the CPU (no TPU is reachable):
every model family's step compiles with XLA at fixed shapes in
mixed_bfloat16, several steps per execution, with finite losses that agree
with a float32 step; and on two replicas the loss is not scaled by their
number (the Keras 3.7-3.9 bug of keras-team/keras#20568 and #21061)."""

import json
import os
import subprocess
import sys

import keras
import numpy as np
import pytest

import keras_identity as ki
from keras_identity.models import to_float32
from tests.conftest import REPO

FAMILIES = {
    "resnet_unrolled": (lambda **kw: ki.models.resnet(8, **kw), (32, 32, 3)),
    "preact_bottleneck": (lambda **kw: ki.models.preact_resnet(11, **kw), (32, 32, 3)),
    "preact_looped_recompute_unit": (lambda **kw: ki.models.preact_resnet(
        20, stage_mode="scan", recompute="unit", **kw), (32, 32, 3)),
    "gated_looped_recompute_bn_relu": (lambda **kw: ki.models.resnet(
        20, shortcut="exclusive_gating", gate_bias_init=-2.0, stage_mode="scan",
        recompute="bn_relu", **kw), (32, 32, 3)),
    "conv1x1_shortcut": (lambda **kw: ki.models.resnet(
        8, shortcut="conv1x1", unit="full_preactivation", **kw), (32, 32, 3)),
    "mnist_resnet": (lambda **kw: ki.models.resnet(8, dataset="mnist", **kw), (28, 28, 1)),
    "highway_fully_connected": (lambda **kw: ki.models.highway_net(10, **kw), (28, 28, 1)),
    "highway_convolutional": (lambda **kw: ki.models.highway_net(
        7, dataset="cifar10", width=4, **kw), (32, 32, 3)),
    "plain_convolutional": (lambda **kw: ki.models.plain_net(
        7, dataset="cifar10", width=4, **kw), (32, 32, 3)),
}


def _batches(shape, batch=8, steps=4):
    rng = np.random.default_rng(0)
    x = rng.integers(0, 256, (batch * steps,) + shape).astype(np.float32)
    y = rng.integers(0, 10, batch * steps).astype(np.int32)
    return x, y  # whole batches only: static shapes, as a TPU needs


# CI's TensorFlow 2.19 leg (tensorflow-tpu's line) runs one family of each
# kind of step: unrolled, a stage looped in XLA with recomputation, a highway
# net with its float32 gates; the TensorFlow leg runs all of them.
CORE_FAMILIES = ("resnet_unrolled", "preact_looped_recompute_unit", "highway_fully_connected")


@pytest.mark.parametrize("family", [
    pytest.param(family, marks=[pytest.mark.core_leg] * (family in CORE_FAMILIES))
    for family in FAMILIES])
def test_every_family_trains_with_xla_in_bfloat16(family):
    build, shape = FAMILIES[family]
    keras.config.set_dtype_policy("mixed_bfloat16")
    keras.utils.set_random_seed(3)
    model = build(include_preprocessing=True, normalization="scale")
    keras.config.set_dtype_policy("float32")
    reference = to_float32(model)  # the same weights, float32, no XLA
    model.compile(optimizer=keras.optimizers.SGD(0.01, momentum=0.9),
                  loss="sparse_categorical_crossentropy", jit_compile=True,
                  steps_per_execution=2)
    reference.compile(loss="sparse_categorical_crossentropy", jit_compile=False)
    x, y = _batches(shape)
    first = model.evaluate(x[:8], y[:8], batch_size=8, verbose=0)
    exact = reference.evaluate(x[:8], y[:8], batch_size=8, verbose=0)
    assert np.isfinite(first) and first == pytest.approx(exact, rel=0.03)
    history = model.fit(x, y, batch_size=8, shuffle=False, epochs=1, verbose=0).history
    assert np.isfinite(history["loss"][0])
    assert int(model.optimizer.iterations.numpy()) == 4
    assert model.jit_compile
    assert keras.backend.standardize_dtype(model.output.dtype) == "float32"
    for layer in model.layers:  # gates stay float32 under mixed precision
        for gate in ("gate", "transform"):
            if hasattr(layer, gate) and isinstance(getattr(layer, gate), keras.layers.Layer):
                assert getattr(layer, gate).compute_dtype == "float32", layer.name


RUN = r"""
import json, sys
from keras_identity.training import TrainConfig, train
config = TrainConfig(model="preact_resnet", depth=11, dataset="cifar10", data_dir=sys.argv[2],
                     train_steps=4, steps_per_epoch=4, batch_size=16, verbose=0,
                     strategy=sys.argv[3], precision=sys.argv[4],
                     jit_compile=sys.argv[6] == "1", steps_per_execution=int(sys.argv[5]),
                     model_dir=sys.argv[1], seed=1)
lines = []
result = train(config, print_fn=lines.append)
print(json.dumps({"loss": result["history"][0]["loss"], "lines": lines}))
"""


def _train(tmp_path, data, backend, devices, strategy, precision, per_execution, xla):
    env = dict(os.environ, KERAS_BACKEND=backend, PYTHONPATH=REPO)
    script = RUN
    if backend == "jax":
        env["XLA_FLAGS"] = " ".join([os.environ.get("XLA_FLAGS", ""),
                                     f"--xla_force_host_platform_device_count={devices}"])
    elif devices > 1:  # two logical CPU devices for MirroredStrategy
        script = ("import tensorflow as tf\n"
                  "cpu = tf.config.list_physical_devices('CPU')[0]\n"
                  "tf.config.set_logical_device_configuration(cpu, "
                  f"[tf.config.LogicalDeviceConfiguration()] * {devices})\n" + RUN)
    name = f"{backend}{devices}{precision}{per_execution}"
    out = subprocess.run([sys.executable, "-c", script, str(tmp_path / name), data, strategy,
                          precision, str(per_execution), str(int(xla))], env=env,
                         capture_output=True, text=True)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_two_replicas_in_bfloat16_with_xla_match_one_float32_device(tmp_path):
    """The first epoch's mean loss of two replicas in bfloat16 against one
    float32 device: equal to bfloat16 precision, not doubled or halved.  On
    JAX with XLA and two steps per execution, as on a TPU; on TensorFlow,
    MirroredStrategy takes neither from Keras (the trainer refuses them, see
    test_steps.py), so the two replicas run plain steps.  Each leg of CI runs
    its own backend's."""
    backend = keras.backend.backend()
    rng = np.random.default_rng(0)
    data = str(tmp_path / "cifar-like.npz")
    np.savez(data, x_train=rng.integers(0, 256, (128, 32, 32, 3), dtype=np.uint8),
             y_train=rng.integers(0, 10, 128), x_test=rng.integers(0, 256, (32, 32, 32, 3),
                                                                    dtype=np.uint8),
             y_test=rng.integers(0, 10, 32))
    exact = _train(tmp_path, data, backend, 1, "default", "float32", 1, False)
    jax = backend == "jax"
    tpu_like = _train(tmp_path, data, backend, 2, "mirrored", "mixed_bfloat16", 2 if jax else 1,
                      jax)
    if jax:
        assert any("XLA, 2 steps per execution" in line for line in tpu_like["lines"])
    replicas = "DataParallel (2 CPU)" if backend == "jax" else "MirroredStrategy (2 replicas)"
    assert any(replicas in line for line in tpu_like["lines"]), tpu_like["lines"][:2]
    assert np.isfinite(tpu_like["loss"])
    assert tpu_like["loss"] == pytest.approx(exact["loss"], rel=0.05)

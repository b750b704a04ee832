"""benchmarks.loop_gradient: the loop TensorFlow differentiates gives the
written loop's outputs, gradients and moving statistics (so the benchmark
compares two ways to the same numbers)."""

import keras
import numpy as np
import pytest

from keras_identity.layers import ResidualStack
from tests.backend import tensorflow_only

pytestmark = tensorflow_only


def _train_step(block, unit, shortcut, recompute, autodiff, monkeypatch):
    import tensorflow as tf

    from benchmarks import loop_gradient
    from keras_identity.layers.residual import stack

    with monkeypatch.context() as patch:
        if autodiff:
            patch.setattr(stack, "_loop", lambda: loop_gradient.AUTODIFF_LOOP)
        keras.utils.set_random_seed(1)
        layer = ResidualStack(8, 3, block=block, unit=unit, shortcut=shortcut,
                              recompute=recompute)
        x = tf.constant(np.random.default_rng(0).normal(size=(4, 6, 6, 8)), tf.float32)
        layer.build(x.shape)
        with tf.GradientTape() as tape:
            tape.watch(x)
            y = layer(x, training=True)
            loss = tf.reduce_sum(y * y)
        grads = tape.gradient(loss, [x] + layer.trainable_variables)
        inference = layer(x, training=False)
    return ([y.numpy(), inference.numpy()] + [g.numpy() for g in grads]
            + [v.numpy() for v in layer.non_trainable_variables])


@pytest.mark.parametrize("block, unit, shortcut", [
    ("bottleneck", "full_preactivation", "identity"),
    ("basic", "full_preactivation", "exclusive_gating"),
    ("basic", "original", "conv1x1"),
])
@pytest.mark.parametrize("recompute", ["none", "bn_relu"])
def test_autodiff_loop_equals_the_written_loop(block, unit, shortcut, recompute, monkeypatch):
    written = _train_step(block, unit, shortcut, recompute, False, monkeypatch)
    autodiff = _train_step(block, unit, shortcut, recompute, True, monkeypatch)
    assert len(written) == len(autodiff) > 8
    for a, b in zip(written, autodiff):
        np.testing.assert_allclose(b, a, rtol=1e-5, atol=1e-5 * np.max(np.abs(a)))


def test_bad_recompute_is_refused_in_one_line():
    import subprocess
    import sys

    from tests.conftest import REPO

    result = subprocess.run([sys.executable, "-m", "benchmarks.loop_gradient",
                             "--recompute=unit"], cwd=REPO, text=True, capture_output=True,
                            timeout=120)
    assert result.returncode != 0
    assert result.stderr.strip().splitlines()[-1] == (
        "benchmarks.loop_gradient: --recompute=unit is not valid; expected none or bn_relu.")

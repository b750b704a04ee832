"""FusedBatchNormalization must be keras.layers.BatchNormalization, faster."""

import numpy as np
import pytest
import keras

tf = pytest.importorskip("tensorflow")  # TensorFlow-only module

from keras_identity.layers import FusedBatchNormalization
from tests.backend import tensorflow_only

pytestmark = [pytest.mark.core_leg, pytest.mark.quick]  # quick: the quick tier


def _pair(**kwargs):
    reference = keras.layers.BatchNormalization(**kwargs)
    fused = FusedBatchNormalization(**kwargs)
    for layer in (reference, fused):
        layer.build((None, 5, 5, 6))
    rng = np.random.default_rng(0)
    for a, b in zip(reference.weights, fused.weights):
        value = rng.uniform(0.5, 1.5, a.shape).astype("float32")
        a.assign(value)
        b.assign(value)
    return reference, fused


@tensorflow_only  # elsewhere the layer is Keras's BatchNormalization
@pytest.mark.parametrize("training", [False, True])
def test_outputs_gradients_and_statistics_match_keras(training):
    reference, fused = _pair(momentum=0.9, epsilon=1e-5)
    x = np.random.default_rng(1).normal(2.0, 3.0, size=(4, 5, 5, 6)).astype("float32")
    results = []
    for layer in (reference, fused):
        xt = tf.constant(x)
        with tf.GradientTape() as tape:
            tape.watch(xt)
            y = layer(xt, training=training)
            loss = tf.reduce_sum(y * tf.range(6, dtype="float32"))
        grads = tape.gradient(loss, [xt] + layer.trainable_weights)
        results.append((y, grads, [w.numpy() for w in layer.non_trainable_weights]))
    (y_r, g_r, s_r), (y_f, g_f, s_f) = results
    np.testing.assert_allclose(y_f, y_r, rtol=1e-4, atol=1e-5)
    for a, b in zip(g_f, g_r):
        np.testing.assert_allclose(a, b, rtol=1e-3, atol=1e-4)
    for a, b in zip(s_f, s_r):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
    if training:  # the statistics moved toward the batch's (mean 2, variance 9)
        assert np.all(s_f[1] > 1.0)  # >= 0.9 * 0.5 + 0.1 * (about 9)


def test_falls_back_for_other_ranks_and_round_trips(tmp_path):
    layer = FusedBatchNormalization()
    x = np.random.default_rng(2).normal(size=(3, 7)).astype("float32")
    reference = keras.layers.BatchNormalization()
    np.testing.assert_allclose(layer(x, training=True), reference(x, training=True),
                               rtol=1e-5, atol=1e-5)
    model = keras.Sequential([keras.Input((4, 4, 2)), FusedBatchNormalization(name="bn")])
    model.save(tmp_path / "bn.keras")
    loaded = keras.models.load_model(tmp_path / "bn.keras", safe_mode=True)
    assert isinstance(loaded.get_layer("bn"), FusedBatchNormalization)

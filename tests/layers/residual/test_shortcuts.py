import keras
import numpy as np
import pytest

from keras_identity.layers import ZeroPadShortcut


def test_subsamples_and_appends_zero_channels(rng):
    layer = ZeroPadShortcut(6, strides=2)
    x = rng.normal(size=(2, 5, 5, 4)).astype("float32")
    y = np.asarray(layer(x))
    assert y.shape == (2, 3, 3, 6) == layer.compute_output_shape((2, 5, 5, 4))
    np.testing.assert_array_equal(y[..., :4], x[:, ::2, ::2, :])
    np.testing.assert_array_equal(y[..., 4:], 0.0)
    assert not layer.weights


def test_same_grid_as_a_strided_1x1_convolution(rng):
    x = rng.normal(size=(1, 8, 8, 3)).astype("float32")
    conv = keras.layers.Conv2D(3, 1, strides=2, use_bias=False)
    conv.build(x.shape)
    conv.kernel.assign(np.eye(3, dtype="float32").reshape(1, 1, 3, 3))
    np.testing.assert_allclose(ZeroPadShortcut(3, 2)(x), conv(x), atol=1e-6)


def test_rejects_fewer_channels_and_bad_strides():
    with pytest.raises(ValueError, match="filters=2"):
        ZeroPadShortcut(2)(keras.Input((4, 4, 3)))
    with pytest.raises(ValueError, match="strides=0"):
        ZeroPadShortcut(4, strides=0)


# --- the Fig. 2 shortcut classes ------------------------------------------------

tf = pytest.importorskip("tensorflow")  # noqa: E402  (TensorFlow-only checks)

from keras_identity.layers.residual import GATED_SHORTCUTS  # noqa: E402
from keras_identity.layers.residual import shortcuts  # noqa: E402

pytestmark = [pytest.mark.core_leg, pytest.mark.quick]  # quick: the quick tier


@pytest.mark.parametrize("shortcut", GATED_SHORTCUTS)
def test_gated_sum_vjp_is_the_gradient_of_the_gated_sum(shortcut, rng):
    """The looped stage's written gate gradient is the figure's derivative."""
    gate = shortcuts.get(shortcut)
    h, f, dy = (tf.constant(rng.normal(size=(2, 3, 3, 4)), tf.float32) for _ in range(3))
    g = tf.constant(rng.uniform(0.05, 0.95, size=(2, 3, 3, 4)), tf.float32)
    with tf.GradientTape() as tape:
        tape.watch([h, f, g])
        y = gate.gated_sum(h, f, g)
    expected = tape.gradient(y, [h, f, g], output_gradients=dy)
    for got, want in zip(gate.gated_sum_vjp(h, f, g, dy), expected):
        np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)


def test_unknown_shortcut_argument_and_defaults():
    assert shortcuts.get("constant_scaling").config() == {"shortcut_scale": 0.5,
                                                          "scale_residual": False}
    assert shortcuts.get("exclusive_gating", gate_bias_init=None).config() == {
        "gate_bias_init": 0.0}
    assert shortcuts.get("identity").config() == {}
    assert not shortcuts.get("constant_scaling", shortcut_scale=0.0).has_shortcut
    assert shortcuts.applies_to("gate_bias_init") == GATED_SHORTCUTS

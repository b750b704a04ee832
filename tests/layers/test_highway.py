import keras
import numpy as np
import pytest
from tests.backend import vjp

import keras_identity as ki
from keras_identity.layers import Highway
from keras_identity.layers import HighwayConv2D

pytestmark = [pytest.mark.core_leg, pytest.mark.quick]  # quick: the quick tier


def _built(layer, shape):
    layer.build(shape)
    return layer


def _set_gate(layer, bias, zero_kernel=True):
    gate = layer.transform_gate
    if zero_kernel:
        gate.kernel.assign(np.zeros(gate.kernel.shape, "float32"))
    gate.bias.assign(np.full(gate.bias.shape, bias, "float32"))


@pytest.mark.parametrize("make, shape", [
    (lambda: Highway(activation="tanh"), (5, 12)),
    (lambda: HighwayConv2D(kernel_size=3), (2, 5, 5, 4)),
])
def test_eqn3(make, shape, rng):
    layer = _built(make(), shape)
    x = rng.normal(size=shape).astype("float32")
    h = layer.block_state(x)
    t = layer.transform_gate(x)
    np.testing.assert_allclose(layer(x), h * t + x * (1.0 - t), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("make, shape", [
    (lambda: Highway(), (5, 12)),
    (lambda: HighwayConv2D(kernel_size=5), (2, 6, 6, 3)),
])
def test_eqn4_limits(make, shape, rng):
    """T -> 0 gives y = x; T -> 1 gives y = H(x)."""
    layer = _built(make(), shape)
    x = rng.normal(size=shape).astype("float32")
    _set_gate(layer, -40.0)
    np.testing.assert_allclose(layer(x), x, atol=1e-6)
    _set_gate(layer, 40.0)
    np.testing.assert_allclose(layer(x), layer.block_state(x), atol=1e-6)


def test_eqn9_backward_pass(rng):
    """dH = T dy, dT = (H - x) dy, dx = (1 - T) dy, plus the paths through H and T."""
    layer = _built(Highway(activation="tanh", transform_bias_init=-1.0), (4, 10))
    x = rng.normal(size=(4, 10)).astype("float32")
    dy = rng.normal(size=(4, 10)).astype("float32")
    h = np.asarray(layer.block_state(x))
    t = np.asarray(layer.transform_gate(x))
    kernel = [layer.block_state.kernel]
    dx_total, (dw,) = vjp(layer, x, dy, kernel)
    through_h, (dw_via_h,) = vjp(layer.block_state, x, t * dy, kernel)   # dH = T dy
    through_t, _ = vjp(layer.transform_gate, x, (h - x) * dy)            # dT = (H - x) dy
    direct = (1.0 - t) * dy                                              # dx = (1 - T) dy
    np.testing.assert_allclose(dx_total, direct + through_h + through_t, rtol=1e-4, atol=1e-5)
    # The same for the parameters of H: dL/dW_H = x^T (dH * H'(.)).
    np.testing.assert_allclose(dw, dw_via_h, rtol=1e-5, atol=1e-6)


def test_transform_bias_init_and_parameter_count():
    layer = _built(Highway(transform_bias_init=-3.0), (None, 50))
    np.testing.assert_array_equal(layer.transform_gate.bias, -3.0)
    assert sum(int(np.prod(w.shape)) for w in layer.weights) == 2 * (50 * 50 + 50)
    conv = _built(HighwayConv2D(kernel_size=3), (None, 8, 8, 16))
    assert conv.block_state.kernel.shape == conv.transform_gate.kernel.shape == (3, 3, 16, 16)


def test_separate_carry_gate_eqn2(rng):
    layer = _built(Highway(carry_gate="separate", transform_bias_init=-2.0), (3, 6))
    np.testing.assert_array_equal(layer.carry.bias, 2.0)
    x = rng.normal(size=(3, 6)).astype("float32")
    expected = layer.block_state(x) * layer.transform_gate(x) + x * layer.carry(x)
    np.testing.assert_allclose(layer(x), expected, rtol=1e-5, atol=1e-6)
    assert len(layer.weights) == 6


def test_gate_override_closes_the_layer(rng):
    layer = _built(Highway(transform_bias_init=0.0), (3, 6))
    x = rng.normal(size=(3, 6)).astype("float32")
    layer.transform_gate_override = 0.0
    np.testing.assert_allclose(layer(x), x)
    layer.transform_gate_override = 1.0
    np.testing.assert_allclose(layer(x), layer.block_state(x), rtol=1e-6)
    with pytest.raises(ValueError, match="transform_gate_override=2"):
        layer.transform_gate_override = 2


def test_lesion_of_a_closed_layer_changes_nothing(rng):
    model = ki.models.highway_net(5, width=8)
    x = rng.uniform(size=(4, 28, 28, 1)).astype("float32")
    layer = model.get_layer("highway3")
    _set_gate(layer, -60.0)  # a trained layer whose gates are closed
    before = np.asarray(model(x))
    layer.transform_gate_override = 0.0
    np.testing.assert_allclose(model(x), before, atol=1e-6)
    layer.transform_gate_override = None
    _set_gate(layer, 3.0)
    opened = np.asarray(model(x))
    layer.transform_gate_override = 0.0
    assert np.abs(np.asarray(model(x)) - opened).max() > 1e-4


def test_transform_gate_activations(rng):
    model = ki.models.highway_net(4, width=8, transform_bias_init=-10.0)
    x = rng.uniform(size=(10, 28, 28, 1)).astype("float32")
    for name in ("highway2", "highway3", "highway4"):
        model.get_layer(name).transform_gate.kernel.assign(np.zeros((8, 8), "float32"))
    gates = ki.layers.transform_gate_activations(model, x, batch_size=3)
    assert list(gates) == ["highway2", "highway3", "highway4"]
    for value in gates.values():
        assert value.shape == (10, 8) and value.dtype == np.float32
        np.testing.assert_allclose(value, 1.0 / (1.0 + np.exp(10.0)), rtol=1e-5)
    with pytest.raises(ValueError, match="no Highway"):
        ki.layers.transform_gate_activations(ki.models.plain_net(3, width=4), x)


def test_mixed_precision_gates_float32(rng):
    keras.config.set_dtype_policy("mixed_bfloat16")
    layer = _built(HighwayConv2D(), (2, 4, 4, 3))
    y = layer(rng.normal(size=(2, 4, 4, 3)).astype("float32"))
    assert y.dtype == "bfloat16"
    assert layer.block_state.compute_dtype == "bfloat16"
    assert layer.transform_gate.compute_dtype == "float32"


@pytest.mark.parametrize("kwargs, words", [
    (dict(carry_gate="free"), ["carry_gate='free'", "'coupled'", "'separate'"]),
    (dict(transform_bias_init="neg"), ["transform_bias_init='neg'"]),
    (dict(transform_gate_override=-1), ["transform_gate_override=-1"]),
])
def test_bad_arguments(kwargs, words):
    with pytest.raises(ValueError) as error:
        Highway(**kwargs)
    for word in words:
        assert word in str(error.value)


def test_bad_kernel_size_and_rank():
    with pytest.raises(ValueError, match="kernel_size=4"):
        HighwayConv2D(kernel_size=4)
    with pytest.raises(ValueError, match="4-D input"):
        HighwayConv2D()(keras.Input((8, 3)))
    with pytest.raises(ValueError, match="last .channel. dimension"):
        Highway().build((4, None))

import numpy as np
import pytest

import keras_identity as ki


@pytest.fixture
def net_and_data(rng):
    net = ki.models.highway_net(5, width=6)
    x = rng.uniform(size=(40, 28, 28, 1)).astype("float32")
    y = np.arange(40) % 3
    return net, x, y


def _force_bias(layer, bias):
    gate = layer.transform_gate
    gate.kernel.assign(np.zeros(gate.kernel.shape, "float32"))
    gate.bias.assign(np.full(gate.bias.shape, bias, "float32"))


def test_gate_statistics_shapes(net_and_data):
    net, x, y = net_and_data
    stats = ki.analysis.gate_statistics(net, x, y)
    assert stats.layers == ["highway2", "highway3", "highway4", "highway5"]
    for array in (stats.biases, stats.mean, stats.example, stats.outputs):
        assert array.shape == (4, 6)
    assert sorted(stats.class_mean) == [0, 1, 2]
    assert stats.class_mean[1].shape == (4, 6)
    np.testing.assert_allclose(np.mean([stats.class_mean[c] for c in range(3)], axis=0),
                               stats.mean, atol=0.02)


def test_gate_statistics_respond_to_a_forced_bias(net_and_data):
    net, x, y = net_and_data
    _force_bias(net.get_layer("highway3"), -5.0)
    _force_bias(net.get_layer("highway4"), 5.0)
    stats = ki.analysis.gate_statistics(net, x, y)
    np.testing.assert_allclose(stats.mean[1], 1 / (1 + np.exp(5.0)), rtol=1e-5)
    np.testing.assert_allclose(stats.mean[2], 1 / (1 + np.exp(-5.0)), rtol=1e-5)
    np.testing.assert_allclose(stats.biases[1], -5.0)


def test_lesion_of_closed_layers_changes_nothing(net_and_data):
    net, x, y = net_and_data
    _force_bias(net.get_layer("highway3"), -80.0)  # gates closed: the layer copies
    _force_bias(net.get_layer("highway5"), 4.0)    # gates open: the layer transforms
    result = ki.analysis.lesion_study(net, x, y)
    assert result["layers"] == ["highway2", "highway3", "highway4", "highway5"]
    assert result["errors"][1] == result["baseline"]
    predictions = net.predict(x, verbose=0)
    assert all(layer.transform_gate_override is None
               for layer in ki.layers.highway_layers(net))  # restored
    net.get_layer("highway5").transform_gate_override = 0.0
    net.make_predict_function(force=True)  # the compiled function reads the gates at tracing
    lesioned = net.predict(x, verbose=0)
    net.get_layer("highway5").transform_gate_override = None
    assert np.abs(lesioned - predictions).max() > 1e-3

"""CReLU (Balduzzi et al. 2017): Φ(x) = (σ(x_q), σ(-x_q)) pairs, side by side."""

import keras
import numpy as np
import pytest

import keras_identity as ki

pytestmark = pytest.mark.quick  # the quick tier (docs/testing.md)


def test_pairs_are_neighbours_and_the_width_doubles():
    layer = ki.layers.CReLU()
    x = np.array([[1.5, -2.0, 0.0], [-0.5, 3.0, -1.0]], np.float32)
    out = keras.ops.convert_to_numpy(layer(x))
    np.testing.assert_array_equal(out, [[1.5, 0.0, 0.0, 2.0, 0.0, 0.0],
                                        [0.0, 0.5, 3.0, 0.0, 0.0, 1.0]])
    # Φ(x)_{2q-1} - Φ(x)_{2q} = x_q: nothing of x is lost.
    np.testing.assert_array_equal(out[:, 0::2] - out[:, 1::2], x)
    assert layer.compute_output_shape((None, 8, 8, 5)) == (None, 8, 8, 10)


def test_serializes_and_runs_in_a_model(tmp_path):
    inputs = keras.Input((4, 4, 3))
    model = keras.Model(inputs, ki.layers.CReLU(name="crelu")(inputs))
    path = str(tmp_path / "crelu.keras")
    model.save(path)
    loaded = keras.models.load_model(path)
    x = np.random.default_rng(0).normal(size=(2, 4, 4, 3)).astype(np.float32)
    np.testing.assert_array_equal(loaded.predict(x, verbose=0), model.predict(x, verbose=0))
    assert loaded.output_shape == (None, 4, 4, 6)

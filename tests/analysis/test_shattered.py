import numpy as np

from keras_identity.analysis import autocorrelation
from keras_identity.analysis import feedforward_1d
from keras_identity.analysis import input_gradients


def test_autocorrelation_of_noise():
    rng = np.random.default_rng(0)
    white = rng.normal(size=4096)
    brown = np.cumsum(white)
    assert autocorrelation(white)[0] == 1.0
    assert abs(autocorrelation(white)[1]) < 0.05
    assert autocorrelation(brown)[1] > 0.95


def test_deep_plain_nets_shatter_and_residual_nets_do_not():
    shallow = autocorrelation(input_gradients(feedforward_1d(1, width=64)))[1]
    plain = autocorrelation(input_gradients(feedforward_1d(24, width=64)))[1]
    residual = autocorrelation(input_gradients(feedforward_1d(24, width=64, residual=True)))[1]
    assert shallow > 0.9
    assert plain < 0.5
    assert residual > plain + 0.3


def test_a_looks_linear_crelu_net_does_not_shatter():
    # Linear at initialisation: the same gradient at every input, so the
    # autocorrelation is 1 at every lag, at any depth, without skip connections.
    model = feedforward_1d(24, width=64, looks_linear=True)
    gradients = input_gradients(model)
    np.testing.assert_allclose(gradients, gradients[0], rtol=1e-5)
    assert abs(gradients[0]) > 0
    assert autocorrelation(gradients)[1] > 0.99

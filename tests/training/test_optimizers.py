import keras
import numpy as np
import pytest

from keras_identity.training import MomentumSGD

pytestmark = pytest.mark.quick  # the quick tier (docs/testing.md)


def test_matches_torch_sgd_with_coupled_weight_decay(rng):
    w0 = rng.normal(size=(5,)).astype("float32")
    grads = [rng.normal(size=(5,)).astype("float32") for _ in range(4)]
    lr, mu, wd = 0.1, 0.9, 1e-2
    var = keras.Variable(w0)
    opt = MomentumSGD(lr, momentum=mu, coupled_weight_decay=wd)
    w, v = w0.astype("float64"), np.zeros(5)
    for g in grads:
        opt.apply_gradients([(g, var)])
        d = g + wd * w          # Torch: dfdx = dfdx + wd * x
        v = mu * v + d          # state.dfdx = mom * state.dfdx + dfdx
        w = w - lr * v          # x = x - lr * state.dfdx
    np.testing.assert_allclose(var.numpy(), w, rtol=1e-5)


def test_equals_an_l2_penalty_of_half_the_decay(rng):
    x = rng.normal(size=(16, 3)).astype("float32")
    y = rng.normal(size=(16, 2)).astype("float32")
    init = rng.normal(size=(3, 2)).astype("float32")
    wd = 1e-2
    a, b = keras.Variable(init), keras.Variable(init)
    opt_a = MomentumSGD(0.05, coupled_weight_decay=wd)
    opt_b = MomentumSGD(0.05)

    def grad_of_mse(w):  # d mean((x w - y)^2) / dw
        return (2.0 / y.size * x.T @ (x @ w.numpy() - y)).astype("float32")

    for _ in range(3):
        # loss_a = mean((x a - y)^2); loss_b = the same + wd / 2 * sum(b^2)
        opt_a.apply_gradients([(grad_of_mse(a), a)])
        opt_b.apply_gradients([(grad_of_mse(b) + wd * b.numpy(), b)])
    np.testing.assert_allclose(a.numpy(), b.numpy(), rtol=1e-5)


def test_kernels_only_and_nesterov(rng):
    kernel = keras.Variable(np.ones(2, "float32"), name="kernel")
    gamma = keras.Variable(np.ones(2, "float32"), name="gamma")
    opt = MomentumSGD(1.0, momentum=0.0, coupled_weight_decay=0.5, decay_batch_norm=False)
    zero = np.zeros(2, "float32")
    opt.apply_gradients([(zero, kernel), (zero, gamma)])
    np.testing.assert_allclose(kernel.numpy(), 0.5)
    np.testing.assert_allclose(gamma.numpy(), 1.0)
    var = keras.Variable(np.zeros(1, "float32"))
    nesterov = MomentumSGD(1.0, momentum=0.5, nesterov=True)
    nesterov.apply_gradients([(np.ones(1, "float32"), var)])
    np.testing.assert_allclose(var.numpy(), -1.5)  # g + mu * v with v = g


def test_serialization():
    opt = MomentumSGD(0.1, momentum=0.8, nesterov=True, coupled_weight_decay=1e-4)
    clone = MomentumSGD.from_config(opt.get_config())
    assert clone.get_config() == opt.get_config()

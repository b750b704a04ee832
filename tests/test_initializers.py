"""keras_identity.initializers: LooksLinear (Balduzzi et al. 2017)."""

import keras
import numpy as np
import pytest

import keras_identity as ki

pytestmark = pytest.mark.quick  # the quick tier (docs/testing.md)


def crelu(x):
    return np.stack([np.maximum(x, 0), np.maximum(-x, 0)], axis=-1).reshape(
        *x.shape[:-1], 2 * x.shape[-1])


@pytest.mark.parametrize("inputs, units", [(16, 5), (6, 12)])
def test_dense_kernel_is_an_orthogonal_matrix_and_its_negative_interleaved(inputs, units):
    kernel = keras.ops.convert_to_numpy(ki.initializers.LooksLinear(seed=1)((inputs, units)))
    w = kernel[0::2]
    np.testing.assert_array_equal(kernel[1::2], -w)
    gram = w.T @ w if w.shape[0] >= w.shape[1] else w @ w.T
    np.testing.assert_allclose(gram, np.eye(len(gram)), atol=1e-5)
    x = np.random.default_rng(0).normal(size=(7, inputs // 2)).astype(np.float32)
    np.testing.assert_allclose(crelu(x) @ kernel, x @ w, atol=1e-5)   # W̃ Φ(x) = W x


def test_conv_kernel_is_zero_but_its_centre_tap():
    kernel = keras.ops.convert_to_numpy(ki.initializers.LooksLinear(seed=2)((3, 3, 8, 6)))
    centre = kernel[1, 1]
    np.testing.assert_array_equal(centre[1::2], -centre[0::2])
    np.testing.assert_allclose(centre[0::2] @ centre[0::2].T, np.eye(4), atol=1e-5)  # 4 x 6
    kernel[1, 1] = 0.0
    assert not kernel.any()


def test_successive_draws_differ_and_a_seed_repeats():
    a, b = ki.initializers.LooksLinear(seed=3), ki.initializers.LooksLinear(seed=3)
    first, second = (keras.ops.convert_to_numpy(a((4, 4))) for _ in range(2))
    assert not np.allclose(first, second)
    np.testing.assert_array_equal(keras.ops.convert_to_numpy(b((4, 4))), first)
    assert ki.initializers.LooksLinear.from_config(a.get_config()).get_config() == {"seed": 3}


@pytest.mark.parametrize("shape, words", [((5, 4), "even number of inputs"),
                                          ((3, 3, 3, 2), "the kernel (3, 3, 3, 2) has 3"),
                                          ((8,), "dense kernels (inputs, units)")])
def test_shapes_it_cannot_fill_are_refused(shape, words):
    with pytest.raises(ValueError, match=words.replace("(", r"\(").replace(")", r"\)")):
        ki.initializers.LooksLinear()(shape)

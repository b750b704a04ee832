import numpy as np
import pytest

from keras_identity.data import Normalization

pytestmark = pytest.mark.quick  # the quick tier (docs/testing.md)


def test_per_pixel_mean(rng):
    images = rng.integers(0, 256, (20, 4, 4, 3)).astype(np.uint8)
    norm = Normalization.from_images("per_pixel_mean", images)
    assert norm.mean.shape == (4, 4, 3) and norm.std is None
    out = np.asarray(norm(images))
    np.testing.assert_allclose(out.mean(axis=0), 0.0, atol=1e-6)
    np.testing.assert_allclose(out[0], images[0] / 255.0 - norm.mean, atol=1e-6)


def test_per_channel_and_scale(rng):
    images = rng.integers(0, 256, (50, 5, 5, 3)).astype(np.uint8)
    out = np.asarray(Normalization.from_images("per_channel", images)(images))
    np.testing.assert_allclose(out.mean(axis=(0, 1, 2)), 0.0, atol=1e-5)
    np.testing.assert_allclose(out.std(axis=(0, 1, 2)), 1.0, atol=1e-4)
    np.testing.assert_allclose(Normalization("scale")(images), images / 255.0, atol=1e-7)


def test_dict_round_trip(rng):
    norm = Normalization.from_images("per_channel", rng.integers(0, 256, (4, 2, 2, 3)))
    clone = Normalization.from_dict(norm.to_dict())
    np.testing.assert_array_equal(clone.mean, norm.mean)
    np.testing.assert_array_equal(clone.std, norm.std)


def test_bad_mode():
    with pytest.raises(ValueError, match="normalization='zca'"):
        Normalization("zca")

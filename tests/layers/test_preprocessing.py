"""ImageNormalization: the input normalisation as a layer of the model."""

import keras
import numpy as np
import pytest

from keras_identity.data import Normalization
from keras_identity.layers import ImageNormalization
from keras_identity.layers import find_preprocessing
from keras_identity.layers import model_inputs

pytestmark = [pytest.mark.core_leg, pytest.mark.quick]  # quick: the quick tier


@pytest.fixture
def images(rng):
    return rng.integers(0, 256, (20, 6, 5, 3)).astype(np.uint8)


@pytest.mark.parametrize("mode", ["per_pixel_mean", "per_channel", "scale"])
def test_layer_computes_the_normalisation_of_the_pipeline(images, mode):
    layer = ImageNormalization(mode).adapt(images)
    x = images.astype(np.float64) / 255.0
    expected = {"scale": x,
                "per_pixel_mean": x - x.mean(axis=0),
                "per_channel": (x - x.mean(axis=(0, 1, 2))) / x.std(axis=(0, 1, 2))}[mode]
    out = keras.ops.convert_to_numpy(layer(images.astype(np.float32)))
    np.testing.assert_allclose(out, expected, atol=1e-5)
    # The same numbers as the input pipelines' normalisation of the same statistics.
    pipeline = Normalization.from_images(mode, images)
    np.testing.assert_allclose(out, pipeline(images), atol=1e-6)


@pytest.mark.needs_tensorflow
def test_adapt_from_a_dataset_of_batches_equals_adapt_from_the_array(images):
    import tensorflow as tf

    ds = tf.data.Dataset.from_tensor_slices((images, np.arange(20))).batch(7)
    from_ds = ImageNormalization("per_channel").adapt(ds)
    from_array = ImageNormalization("per_channel").adapt(images, batch_size=3)
    np.testing.assert_allclose(from_ds.normalization.mean, from_array.normalization.mean,
                               rtol=1e-6)
    np.testing.assert_allclose(from_ds.normalization.std, from_array.normalization.std,
                               rtol=1e-6)


@pytest.mark.parametrize("bad, words", [
    (lambda im: im.astype(np.float32) / 255.0, ["[0, 1]", "[0, 255]"]),
    (lambda im: im.astype(np.float32) - 10.0, ["[-10", "[0, 255]"]),
    (lambda im: im[0], ["(n, height, width, channels)"]),
])
def test_adapt_refuses_images_of_the_wrong_range_or_rank(images, bad, words):
    with pytest.raises(ValueError) as error:
        ImageNormalization("per_pixel_mean").adapt(bad(images))
    for word in words:
        assert word in str(error.value)


def test_a_layer_without_statistics_refuses_to_run_and_names_the_fix(images):
    inputs = keras.Input((6, 5, 3))
    model = keras.Model(inputs, ImageNormalization("per_pixel_mean", name="preprocessing")(
        inputs))
    with pytest.raises(ValueError, match=r"has no statistics.*adapt\(train_images\)"):
        model(images.astype(np.float32))
    model.get_layer("preprocessing").adapt(images)
    assert model(images.astype(np.float32)).shape == (20, 6, 5, 3)


@pytest.mark.parametrize("kwargs, words", [
    (dict(mode="scale", mean=[0.5]), ["takes no mean"]),
    (dict(mode="per_channel", mean=[0.5, 0.5, 0.5]), ["needs both mean and std"]),
    (dict(mode="per_channel", mean=[0.5] * 3, std=[0.1, 0.0, 0.1]), ["positive"]),
    (dict(mode="per_pixel_mean", mean=[0.5] * 3), ["(height, width, channels)"]),
    (dict(mode="whitening"), ["normalization='whitening'", "per_pixel_mean"]),
])
def test_bad_statistics_are_refused_in_one_line(kwargs, words):
    with pytest.raises(ValueError) as error:
        ImageNormalization(**kwargs)
    for word in words:
        assert word in str(error.value)


def test_statistics_of_another_image_size_are_refused_at_build(images):
    layer = ImageNormalization("per_pixel_mean").adapt(images)
    with pytest.raises(ValueError, match="mean image is 6x5; the input is 8x8"):
        layer(keras.Input((8, 8, 3)))
    with pytest.raises(ValueError, match="3 channels; the input has 1"):
        ImageNormalization("per_channel").adapt(images)(keras.Input((6, 5, 1)))


def test_config_round_trip_and_keras_file_keep_the_statistics(images, tmp_path):
    inputs = keras.Input((6, 5, 3))
    layer = ImageNormalization("per_pixel_mean", name="preprocessing").adapt(images)
    model = keras.Model(inputs, keras.layers.Flatten()(layer(inputs)))
    expected = keras.ops.convert_to_numpy(model(images.astype(np.float32)))
    clone = ImageNormalization.from_config(layer.get_config())
    np.testing.assert_array_equal(clone.normalization.mean, layer.normalization.mean)
    model.save(tmp_path / "m.keras")
    loaded = keras.models.load_model(tmp_path / "m.keras")
    np.testing.assert_allclose(keras.ops.convert_to_numpy(loaded(images.astype(np.float32))),
                               expected, atol=1e-7)
    assert find_preprocessing(loaded).name == "preprocessing"


def test_mixed_precision_normalises_in_float32_and_outputs_the_compute_dtype(images):
    keras.config.set_dtype_policy("mixed_bfloat16")
    layer = ImageNormalization("per_channel").adapt(images)
    out = layer(images.astype(np.float32))
    assert keras.backend.standardize_dtype(out.dtype) == "bfloat16"
    x = images / 255.0
    expected = (x - x.mean(axis=(0, 1, 2))) / x.std(axis=(0, 1, 2))
    np.testing.assert_allclose(keras.ops.convert_to_numpy(keras.ops.cast(out, "float32")),
                               expected, atol=0.02)


def test_mixed_precision_does_not_round_float_pixels_before_normalising():
    # 127.7 in bfloat16 is 127.5, which the mean 127.5/255 would cancel to 0.
    keras.config.set_dtype_policy("mixed_bfloat16")
    layer = ImageNormalization("per_channel", mean=np.array([0.5], np.float32),
                               std=np.array([0.001], np.float32))
    out = layer(np.full((1, 2, 2, 1), 127.7, np.float32))
    expected = (127.7 / 255.0 - 0.5) / 0.001   # 0.784
    np.testing.assert_allclose(keras.ops.convert_to_numpy(keras.ops.cast(out, "float32")),
                               expected, rtol=0.01)
    assert "autocast" not in layer.get_config()


def test_model_inputs_feeds_pixels_or_the_runs_normalisation(images):
    norm = Normalization.from_images("per_channel", images)
    inputs = keras.Input((6, 5, 3))
    plain = keras.Model(inputs, keras.layers.Flatten()(inputs))
    embedded = keras.Model(inputs, ImageNormalization("scale")(inputs))
    pixels = images.astype(np.float32)
    assert model_inputs(embedded, pixels) is pixels
    np.testing.assert_allclose(np.asarray(model_inputs(plain, pixels, norm)),
                               np.asarray(norm(pixels)))
    with pytest.raises(ValueError, match="takes normalised inputs"):
        model_inputs(plain, pixels)


def test_statistics_cannot_change_after_the_layer_has_run(images):
    inputs = keras.Input((6, 5, 3))
    layer = ImageNormalization("per_channel", name="preprocessing").adapt(images)
    model = keras.Model(inputs, layer(inputs))
    model.predict(images.astype(np.float32), verbose=0)
    with pytest.raises(ValueError, match="has already run with its current statistics"):
        layer.adapt(images[:5])


def test_preprocessing_is_found_inside_a_nested_backbone(images):
    inputs = keras.Input((6, 5, 3))
    backbone = keras.Model(inputs, keras.layers.Flatten()(
        ImageNormalization("scale", name="preprocessing")(inputs)))
    outer_inputs = keras.Input((6, 5, 3))
    model = keras.Model(outer_inputs, keras.layers.Dense(2)(backbone(outer_inputs)))
    assert find_preprocessing(model).name == "preprocessing"
    pixels = images.astype(np.float32)
    assert model_inputs(model, pixels) is pixels

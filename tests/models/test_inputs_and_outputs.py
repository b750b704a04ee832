"""What models take and give: embedded preprocessing, pooled features, stage
outputs, and weights loaded from a trained model."""

import keras
import numpy as np
import pytest

import keras_identity as ki
from keras_identity.data import Normalization

pytestmark = pytest.mark.core_leg


@pytest.fixture
def cifar_pixels(rng):
    return rng.integers(0, 256, (4, 32, 32, 3)).astype(np.float32)


@pytest.mark.parametrize("build, shape", [
    (lambda **kw: ki.models.preact_resnet(20, seed=3, **kw), (32, 32, 3)),
    (lambda **kw: ki.models.resnet(20, stage_mode="scan", seed=3, **kw), (32, 32, 3)),
    (lambda **kw: ki.models.highway_net(10, **kw), (28, 28, 1)),
    (lambda **kw: ki.models.highway_net(7, dataset="cifar10", **kw), (32, 32, 3)),
])
def test_a_model_with_its_preprocessing_equals_the_model_on_normalised_inputs(
        build, shape, rng):
    pixels = rng.integers(0, 256, (6,) + shape).astype(np.float32)
    norm = Normalization.from_images("per_channel", pixels)
    keras.utils.set_random_seed(1)
    embedded = build(include_preprocessing=True, normalization=norm)
    keras.utils.set_random_seed(1)
    plain = build()
    plain.set_weights(embedded.get_weights())
    assert embedded.count_params() == plain.count_params()
    np.testing.assert_allclose(embedded.predict(pixels, verbose=0),
                               plain.predict(np.asarray(norm(pixels)), verbose=0), atol=1e-5)


def test_default_normalisation_follows_the_recipe():
    assert ki.models.preact_resnet(20, include_preprocessing=True).get_layer(
        "preprocessing").mode == "per_pixel_mean"
    assert ki.models.highway_net(7, dataset="cifar10", include_preprocessing=True).get_layer(
        "preprocessing").mode == "per_channel"
    assert ki.models.highway_net(10, include_preprocessing=True).get_layer(
        "preprocessing").mode == "scale"
    imagenet = ki.models.resnet(18, dataset="imagenet", include_preprocessing=True)
    np.testing.assert_allclose(imagenet.get_layer("preprocessing").normalization.std,
                               [0.229, 0.224, 0.225], rtol=1e-6)


@pytest.mark.parametrize("pooling, reduce", [("avg", np.mean), ("max", np.max)])
def test_pooling_reduces_the_last_feature_map(pooling, reduce, cifar_pixels):
    keras.utils.set_random_seed(2)
    features = ki.models.preact_resnet(20, include_top=False, seed=2)
    pooled = ki.models.preact_resnet(20, include_top=False, pooling=pooling, seed=2)
    pooled.set_weights(features.get_weights())
    maps = features.predict(cifar_pixels, verbose=0)
    assert maps.shape == (4, 8, 8, 64)
    np.testing.assert_allclose(pooled.predict(cifar_pixels, verbose=0),
                               reduce(maps, axis=(1, 2)), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("kwargs, words", [
    (dict(pooling="avg"), ["pooling='avg' applies only with include_top=False"]),
    (dict(include_top=False, pooling="sum"), ["pooling='sum'", "'avg', 'max'"]),
    (dict(include_top=False, num_classes=100), ["num_classes=100 applies only"]),
    (dict(include_top=False, classifier_activation=None),
     ["classifier_activation=None applies only with include_top=True"]),
    (dict(normalization="scale"), ["applies only with include_preprocessing=True"]),
    (dict(include_preprocessing=True, normalization=3), ["normalization=3"]),
    (dict(weights="imagenet"), ["weights='imagenet'", ".keras or .weights.h5"]),
    (dict(weights="/no/such.keras"), ["does not exist"]),
])
def test_bad_top_preprocessing_and_weights_arguments_are_refused(kwargs, words):
    with pytest.raises(ValueError) as error:
        ki.models.preact_resnet(20, **kwargs)
    for word in words:
        assert word in str(error.value)
    # The registry check used by the programs says the same without building.
    with pytest.raises(ValueError) as error:
        ki.models.registry.check_model_kwargs("preact_resnet", 20, "cifar10", **kwargs)
    assert words[0] in str(error.value)


def test_highway_pooling_applies_to_convolutional_nets_only():
    with pytest.raises(ValueError, match="only to convolutional nets"):
        ki.models.highway_net(10, include_top=False, pooling="avg")
    assert ki.models.highway_net(10, include_top=False).output_shape == (None, 50)
    assert ki.models.highway_net(7, dataset="cifar10", include_top=False,
                                 pooling="max").output_shape == (None, 128)


@pytest.mark.parametrize("build, shapes", [
    (lambda: ki.models.preact_resnet(20), [(32, 32, 16), (16, 16, 32), (8, 8, 64)]),
    (lambda: ki.models.preact_resnet(164, stage_mode="scan"),
     [(32, 32, 64), (16, 16, 128), (8, 8, 256)]),
    (lambda: ki.models.resnet(18, dataset="imagenet", input_shape=(64, 64, 3)),
     [(16, 16, 64), (8, 8, 128), (4, 4, 256), (2, 2, 512)]),
    (lambda: ki.models.highway_net(10, dataset="cifar10"),
     [(32, 32, 32), (16, 16, 64), (8, 8, 128)]),
])
def test_feature_extractor_returns_every_stage(build, shapes):
    model = build()
    features = ki.models.feature_extractor(model)
    assert list(features.output) == [f"stage{s + 1}" for s in range(len(shapes))]
    assert [tuple(t.shape[1:]) for t in features.output.values()] == shapes
    assert features.count_params() <= model.count_params()


def test_feature_extractor_shares_the_weights_and_computes_the_stages(cifar_pixels):
    model = ki.models.preact_resnet(20, seed=4)
    features = ki.models.feature_extractor(model)
    last = keras.Model(model.inputs, model.get_layer("final_bn").input)
    np.testing.assert_allclose(features.predict(cifar_pixels, verbose=0)["stage3"],
                               last.predict(cifar_pixels, verbose=0), atol=1e-6)
    with pytest.raises(ValueError, match="has no stages"):
        ki.models.feature_extractor(ki.models.highway_net(10))


def test_weights_from_a_keras_file_across_stage_modes_and_without_the_top(
        tmp_path, cifar_pixels):
    trained = ki.models.preact_resnet(110, stage_mode="scan", seed=5,
                                      include_preprocessing=True, normalization="scale")
    trained.save(tmp_path / "trained.keras")
    backbone = ki.models.preact_resnet(110, stage_mode="unrolled", include_top=False,
                                       pooling="avg", include_preprocessing=True,
                                       normalization="scale",
                                       weights=str(tmp_path / "trained.keras"))
    cut = keras.Model(trained.inputs, trained.get_layer("avg_pool").output)
    # Untrained, 54 units: features of up to 1e6, which the forms' BN (the
    # loop's depthwise form below AVX-512, _tf_batch_norm.affine_batch_norm) round
    # differently in the sixth digit of the largest.
    expected = cut.predict(cifar_pixels, verbose=0)
    np.testing.assert_allclose(backbone.predict(cifar_pixels, verbose=0), expected,
                               rtol=1e-5, atol=max(1e-5, 1e-5 * float(np.abs(expected).max())))


def test_weights_that_do_not_fit_are_named(tmp_path):
    ki.models.preact_resnet(20).save(tmp_path / "r20.keras")
    with pytest.raises(ValueError, match=r"r20.keras.*shape.*include_top=False"):
        ki.models.preact_resnet(20, num_classes=100, weights=str(tmp_path / "r20.keras"))
    with pytest.raises(ValueError, match=r"r20.keras"):
        ki.models.preact_resnet(32, weights=str(tmp_path / "r20.keras"))


def test_weights_h5_of_the_same_architecture(tmp_path, cifar_pixels):
    source = ki.models.resnet(20, seed=6)
    source.save_weights(tmp_path / "r20.weights.h5")
    same = ki.models.resnet(20, weights=str(tmp_path / "r20.weights.h5"))
    np.testing.assert_allclose(same.predict(cifar_pixels, verbose=0),
                               source.predict(cifar_pixels, verbose=0), atol=1e-6)
    with pytest.raises(ValueError,
                       match=r"does not fit .*no place for .*dense.*model.s \.keras file"):
        ki.models.resnet(20, include_top=False, weights=str(tmp_path / "r20.weights.h5"))


def test_weights_bring_the_source_models_normalisation(tmp_path, rng):
    pixels = rng.integers(0, 256, (8, 32, 32, 3)).astype(np.uint8)
    norm = Normalization.from_images("per_channel", pixels)
    ki.models.preact_resnet(20, include_preprocessing=True, normalization=norm).save(
        tmp_path / "src.keras")
    backbone = ki.models.preact_resnet(20, include_top=False, include_preprocessing=True,
                                       weights=str(tmp_path / "src.keras"))
    layer = backbone.get_layer("preprocessing")
    assert layer.mode == "per_channel" and layer.adapted
    np.testing.assert_allclose(layer.normalization.std, norm.std)


def test_weights_from_a_training_checkpoint_with_optimizer_variables(tmp_path, cifar_pixels):
    source = ki.models.resnet(8, seed=7)
    source.compile(optimizer="sgd", loss="sparse_categorical_crossentropy")
    source.fit(cifar_pixels, np.arange(4) % 10, epochs=1, verbose=0)
    source.save_weights(tmp_path / "ckpt.weights.h5")  # holds optimizer/vars too
    same = ki.models.resnet(8, weights=str(tmp_path / "ckpt.weights.h5"))
    np.testing.assert_allclose(same.predict(cifar_pixels, verbose=0),
                               source.predict(cifar_pixels, verbose=0), atol=1e-6)

import numpy as np
import pytest

import keras_identity as ki


def test_listing_names_the_papers_configurations():
    names = ki.models.list_models()
    for name in ("preact_resnet164", "preact_resnet1001", "resnet110", "resnet110_1layer",
                 "preact_resnet200_imagenet", "resnet52_mnist", "highway50_mnist",
                 "plain100_mnist", "highway19_cifar10"):
        assert name in names
    descriptions = ki.models.list_models(with_descriptions=True)
    assert "Table 3" in descriptions["preact_resnet110_1layer"]


def test_get_model_builds_and_accepts_overrides():
    model = ki.models.get_model("preact_resnet164", num_classes=100)
    assert model.name == "preact_resnet164" and model.output_shape == (None, 100)
    assert sum(int(np.prod(w.shape)) for w in model.trainable_weights) == \
        1_703_258 + 256 * 90 + 90
    net = ki.models.get_model("highway10_mnist")
    assert len(ki.layers.highway_layers(net)) == 9


def test_unknown_name():
    with pytest.raises(ValueError, match=r"name='resnet9'.*preact_resnet164"):
        ki.models.get_model("resnet9")


_SMALL = {"imagenet": (64, 64, 3), "mnist": (28, 28, 1), "cifar": (32, 32, 3)}


@pytest.mark.parametrize("name", ki.models.list_models())
def test_every_named_model_builds_and_runs_at_a_small_input(name):
    """Every entry of the registry builds (ImageNet nets at 64x64) and maps
    images to probability vectors of its classes.  In training mode: before
    any training, BatchNormalization's moving statistics are the identity, and
    in inference mode the 333- and 400-unit nets' activations double unit
    after unit past float32's range."""
    kind = "imagenet" if "imagenet" in name else "mnist" if "mnist" in name else "cifar"
    overrides = {"input_shape": _SMALL["imagenet"]} if kind == "imagenet" else {}
    model = ki.models.get_model(name, **overrides)
    images = np.random.default_rng(0).normal(size=(2,) + _SMALL[kind]).astype("float32")
    out = np.asarray(model(images, training=True))
    classes = {"imagenet": 1000}.get(kind, 100 if "cifar100" in name else 10)
    assert out.shape == (2, classes)
    assert np.all(np.isfinite(out)) and out.sum(axis=1) == pytest.approx([1.0, 1.0], abs=1e-4)


def test_each_model_flag_is_declared_once_as_a_builder_argument():
    """registry.MODEL_FLAGS is the flags' one declaration: each names an
    argument of a builder, enums take the library's own choices, and
    --gate_bias_init sets the highway net's b_T under its own name."""
    import inspect

    from keras_identity.models import registry

    parameters = {name for builder in registry.BUILDERS.values()
                  for name in inspect.signature(builder.function).parameters}
    for flag, (kind, choices, help_text) in registry.MODEL_FLAGS.items():
        assert flag in parameters and help_text.endswith("."), flag
        assert choices is None or kind is str
    assert registry.MODEL_FLAGS["recompute"][1] == ki.layers.RECOMPUTE
    assert registry.kwargs_from_flags("highway_net", gate_bias_init=-2.0) == {
        "transform_bias_init": -2.0}

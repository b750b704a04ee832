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

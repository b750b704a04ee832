"""A run's configuration (:mod:`keras_identity.training.config`): the flags'
values and combinations are checked in one line each, and the defaults."""

from pathlib import Path

import keras
import pytest

import keras_identity as ki
from keras_identity.data import Normalization
from keras_identity.training.config import ConfigError
from keras_identity.training.config import TrainConfig
from tests.backend import tensorflow_only

pytestmark = pytest.mark.quick  # the quick tier (docs/testing.md)


def _small(tmp_path, **kwargs):
    base = dict(model="highway_net", depth=3, train_examples=256, test_examples=64,
                epochs=1, batch_size=64, verbose=0, model_dir=str(tmp_path / "run"))
    base.update(kwargs)
    return TrainConfig(**base)


@pytest.mark.parametrize("kwargs, words", [
    (dict(model="resnet9"), ["model='resnet9'", "preact_resnet164"]),
    (dict(model="preact_resnet", depth=1000, dataset="cifar10"), ["depth=1000", "9n+2"]),
    (dict(strategy="gpu"), ["strategy='gpu'", "'mirrored'"]),
    (dict(precision="fp8"), ["precision='fp8'"]),
    (dict(recipe="adam"), ["recipe='adam'"]),
    (dict(model="highway_net", model_kwargs=dict(shortcut="dropout")),
     ["shortcut='dropout'", "resnet"]),
    (dict(model="preact_resnet", model_kwargs=dict(unit="original")),
     ["--model=resnet --unit=original"]),
    (dict(epochs=3, train_steps=10), ["exclusive"]),
    (dict(model="resnet", model_kwargs=dict(weights="r.keras")), ["model_kwargs sets 'weights'"]),
    (dict(batch_size=0), ["batch_size=0"]),
    pytest.param(dict(jit_compile=True, deterministic=True), ["exclusive", "XLA"],
                 marks=tensorflow_only),
    (dict(model="plain_net", model_kwargs=dict(gate_bias_init=-1.0)), ["gate_bias_init"]),
    (dict(model="resnet", model_kwargs=dict(stage_mode="looped")),
     ["stage_mode='looped'", "'scan'"]),
    (dict(model="preact_resnet", model_kwargs=dict(stage_mode="unrolled", recompute="unit")),
     ["recompute='unit'", "unrolled"]),
    # Builder arguments are validated by the builder's own checks, once.
    (dict(model="resnet", model_kwargs=dict(gate_bias_init=-6.0)),
     ["gate_bias_init=-6.0 does not apply to shortcut='identity'"]),
    (dict(model="highway_net", model_kwargs=dict(stage_mode="scan")),
     ["stage_mode='scan' does not apply to 'highway_net'", "resnet"]),
    (dict(model="resnet", model_kwargs=dict(depth=20)), ["model_kwargs sets 'depth'"]),
    (dict(precision=None), ["precision=None", "'mixed_bfloat16'"]),
    (dict(verbose=3), ["verbose=3", "0, 1, 2"]),
    (dict(model="resnet", model_kwargs=dict(
        shortcut=ki.layers.shortcuts.ExclusiveGating(gate_bias_init=-6.0))),
     ["ExclusiveGating(gate_bias_init=-6.0)", "shortcut='exclusive_gating'"]),
])
def test_bad_configurations(kwargs, words):
    with pytest.raises(ConfigError) as error:
        TrainConfig(**kwargs).validate()
    for word in words:
        assert word in str(error.value)


def test_defaults_train_the_highway_paper_net():
    config = TrainConfig().validate()
    assert (config.model, config.resolved_depth, config.dataset) == ("highway_net", 50, "mnist")
    assert config.resolved_recipe == "highway_mnist"
    assert Normalization("scale").mode == "scale"


@pytest.mark.parametrize("kwargs, words", [
    (dict(train_examples=0), ["train_examples=0"]),
    (dict(test_examples=-1), ["test_examples=-1"]),
    (dict(learning_rate=-0.1), ["learning_rate=-0.1", "(0.0, inf]"]),
    (dict(learning_rate=float("nan")), ["learning_rate=nan"]),
    (dict(warmup_steps=-5), ["warmup_steps=-5", ">= 0"]),
    (dict(momentum=1.0), ["momentum=1.0", "[0.0, 1.0)"]),
    (dict(weight_decay=-1e-4), ["weight_decay=-0.0001"]),
    (dict(keep_checkpoints=0), ["keep_checkpoints=0"]),
    (dict(eval_crop=300), ["eval_crop=300", "224"]),
    (dict(lr_decay=0.0), ["lr_decay=0.0", "(0.0, 1.0]"]),
    (dict(lr_decay=0.9, recipe="highway_mnist_conv"),
     ["lr_decay applies to recipes with an exponential schedule", "'highway_mnist_conv'"]),
])
def test_numeric_flags_are_validated(kwargs, words):
    with pytest.raises(ConfigError) as error:
        _small(Path("/tmp"), **kwargs).validate()
    for word in words:
        assert word in str(error.value)


def test_checkpoint_format_is_checked_against_the_backend():
    from keras_identity.training import orbax_checkpoints

    if keras.backend.backend() == "jax" and orbax_checkpoints.available():
        assert TrainConfig().validate().resolved_checkpoint_format == "orbax"
        assert TrainConfig(checkpoint_format="orbax").validate().resolved_checkpoint_format \
            == "orbax"
    elif keras.backend.backend() != "jax":
        assert TrainConfig().validate().resolved_checkpoint_format == "h5"
        with pytest.raises(ConfigError, match=r"^checkpoint_format='orbax' is not valid on the "
                                              r"tensorflow backend; Orbax checkpoints are "
                                              r"the JAX route's"):
            TrainConfig(checkpoint_format="orbax").validate()
    assert TrainConfig(checkpoint_format="h5").validate().resolved_checkpoint_format == "h5"
    with pytest.raises(ConfigError, match="checkpoint_format"):
        TrainConfig(checkpoint_format="zip").validate()


@pytest.mark.parametrize("name, backend, words", [
    ("input_workers", "jax", "it sets the JAX route's worker processes (--backend=jax)"),
    ("intra_op_threads", "tensorflow", "it sets TensorFlow's CPU thread pools"),
])
def test_a_backends_own_setting_is_checked_against_the_backend(name, backend, words):
    with pytest.raises(ConfigError, match=rf"^{name}=-1 is not valid; expected an integer "
                                          rf">= 0\.$"):
        TrainConfig(**{name: -1}).validate()
    if keras.backend.backend() == backend:
        assert getattr(TrainConfig(**{name: 0}).validate(), name) == 0
        assert getattr(TrainConfig(**{name: 3}).validate(), name) == 3
    else:
        with pytest.raises(ConfigError) as error:
            TrainConfig(**{name: 2}).validate()
        assert str(error.value).startswith(
            f"{name} is not valid on the {keras.backend.backend()} backend; {words}")


@pytest.mark.parametrize("model, depth, dataset, kwargs, recorded", [
    ("preact_resnet", 50, "imagenet", {}, False),
    ("preact_resnet200_imagenet", None, "imagenet", {}, False),
    ("resnet", 50, "imagenet", {"unit": "full_preactivation"}, False),
    ("resnet", 50, "imagenet", {"stride_on_1x1": False}, False),
    ("preact_resnet", 50, "imagenet", {"stride_on_1x1": True}, None),
    ("resnet", 50, "imagenet", {}, None),
    ("preact_resnet", 164, "cifar10", {}, None),
])
def test_a_runs_identity_records_a_stride_on_the_3x3(model, depth, dataset, kwargs, recorded):
    # ImageNet pre-activation nets stride the 3x3 by default (Table 5's
    # released model); the first 1x1 was the only default before, and a
    # run's identity leaves defaults out.  So the 3x3 is recorded and the
    # 1x1 left out: a run started under the earlier default (no key) never
    # resumes on the other architecture, and one with stride_on_1x1=true does.
    from keras_identity.training import run_files

    config = TrainConfig(model=model, depth=depth, dataset=dataset, model_kwargs=kwargs)
    arguments = config.identity_arguments()
    assert arguments.get("stride_on_1x1") == recorded
    before = {k: v for k, v in arguments.items() if k != "stride_on_1x1"}
    lines = run_files.differences({"model_kwargs": before}, {"model_kwargs": arguments})
    assert lines == ([] if recorded is None else ["stride_on_1x1: None != False"])

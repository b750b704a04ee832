"""The model a run trains (:mod:`keras_identity.training.trained_model`):
the builder's arguments pass through, and the optimizer is built before the
first step."""

import dataclasses
import os

import keras
import numpy as np
import pytest

import keras_identity as ki
from keras_identity.training import run_setup
from keras_identity.training import trained_model
from keras_identity.training.config import TrainConfig
from tests.backend import tensorflow_only


@pytest.fixture
def mnist_npz(shared_dir):
    return os.path.join(shared_dir, "data", "mnist.npz")


@tensorflow_only  # TensorFlow retraces a step whose first trace creates variables
def test_compile_model_builds_the_optimizer_so_the_step_is_traced_once():
    model = ki.models.preact_resnet(20, input_shape=(8, 8, 3), seed=0)
    ki.training.compile_model(model, keras.optimizers.SGD(0.1, momentum=0.9))
    assert model.optimizer.built
    # one momentum slot per trainable weight, created before any step
    slots = [v for v in model.optimizer.variables if "momentum" in v.path]
    assert len(slots) == len(model.trainable_variables)
    traces = []
    step = model.train_step

    def counting_step(data):
        traces.append(1)
        return step(data)

    model.train_step = counting_step
    rng = np.random.default_rng(0)
    model.fit(rng.normal(size=(4, 8, 8, 3)).astype("float32"), rng.integers(0, 10, 4),
              batch_size=4, epochs=2, verbose=0)
    assert len(traces) == 1  # Keras alone (optimizer built in the step) traces twice


def test_model_kwargs_reach_the_builder(mnist_npz):
    config = TrainConfig(model="resnet", depth=8, dataset="mnist", model_kwargs=dict(
        shortcut="exclusive_gating", gate_bias_init=-3.0, dimension_shortcut="B",
        stage_mode="scan"))
    data = run_setup.load_data(dataclasses.replace(config, data_dir=mnist_npz,
                                                  train_examples=64, test_examples=16))
    model = trained_model.build_model(config.validate(), data, seed=0)
    assert isinstance(model.get_layer("stage1_units2to3"), ki.layers.ResidualStack)
    np.testing.assert_array_equal(
        model.get_layer("stage1_units2to3").shortcut_weights["gate/bias"].numpy(), -3.0)
    assert config.builder_arguments() == dict(
        depth=8, dataset="mnist", shortcut="exclusive_gating", gate_bias_init=-3.0,
        dimension_shortcut="B", stage_mode="scan")
    # A highway net's gate bias is b_T (transform_bias_init) for the same flag.
    assert ki.models.registry.kwargs_from_flags("highway_net", gate_bias_init=-2.0) == {
        "transform_bias_init": -2.0}

import keras_tuner
import numpy as np
import pytest

from keras_identity.recipes import get_recipe
from keras_identity.recipes import resolve
from keras_identity.training import ConfigError
from keras_identity.training import TrainConfig
from keras_identity.training import run_setup
from keras_identity.tuning import DEFAULT_GATE_BIASES
from keras_identity.tuning import Range
from keras_identity.tuning import TrainingHyperModel
from keras_identity.tuning import parse_range

pytestmark = pytest.mark.quick  # the quick tier (docs/testing.md)


@pytest.fixture
def mnist_small():
    return run_setup.load_data(TrainConfig(train_examples=200, test_examples=50))


def make(config, data, space=None, **kwargs):
    recipe = get_recipe(config.resolved_recipe)
    return TrainingHyperModel(config, data, recipe, resolve(recipe, num_train=200, epochs=1),
                              space=space, **kwargs)


def test_default_space_is_exactly_the_papers_eleven_values(mnist_small):
    assert DEFAULT_GATE_BIASES == (0.0, -1.0, -2.0, -3.0, -4.0, -5.0, -6.0, -7.0, -8.0, -9.0,
                                   -10.0)
    hypermodel = make(TrainConfig(model="highway_net", depth=3), mnist_small)
    hp = keras_tuner.HyperParameters()
    hypermodel.declare(hp)
    assert [p.name for p in hp.space] == ["gate_bias_init"]
    assert hp.space[0].values == list(DEFAULT_GATE_BIASES)


def test_highway_trial_sets_the_transform_bias(mnist_small):
    hypermodel = make(TrainConfig(model="highway_net", depth=3), mnist_small)
    hp = keras_tuner.HyperParameters()
    hp.Fixed("gate_bias_init", -7.0)
    model = hypermodel.build(hp)
    np.testing.assert_array_equal(model.get_layer("highway2").transform_gate.bias, -7.0)
    assert model.optimizer is not None


def test_gated_resnet_trial_with_extra_choices(mnist_small):
    config = TrainConfig(model="resnet", depth=6,
                         model_kwargs=dict(shortcut="shortcut_only_gating"))
    hypermodel = make(config, mnist_small, dict(gate_bias_init=(-6.0,), learning_rate=(0.05,),
                                                weight_decay=(1e-3,), depth=(6, 8)))
    hp = keras_tuner.HyperParameters()
    values = hypermodel.declare(hp)
    assert sorted(values) == ["depth", "gate_bias_init", "learning_rate", "weight_decay"]
    hp.values.update({"gate_bias_init": -6.0, "learning_rate": 0.05, "weight_decay": 1e-3,
                      "depth": 8})
    model = hypermodel.build(hp)
    np.testing.assert_array_equal(model.get_layer("stage1_unit3").gate.bias, -6.0)
    assert model.optimizer.coupled_weight_decay == pytest.approx(1e-3)
    assert float(model.optimizer.learning_rate) == pytest.approx(0.05)


@pytest.mark.parametrize("config, words", [
    (TrainConfig(model="resnet", depth=20, model_kwargs=dict(shortcut="identity")),
     ["shortcut='identity'"]),
    (TrainConfig(model="plain_net", depth=10), ["plain_net", "no gate bias"]),
])
def test_models_without_a_gate_bias_are_refused(config, words, mnist_small):
    with pytest.raises(ConfigError) as error:
        make(config, mnist_small)   # the default space: the gate bias
    for word in words:
        assert word in str(error.value)


def test_depth_study_space_sets_activation_momentum_and_decay(mnist_small):
    """Srivastava et al.'s Fig. 1 search: learning rate, momentum, exponential
    decay, activation (and b_T for highway nets)."""
    space = dict(learning_rate=Range(1e-3, 1.0, log=True), momentum=Range(0.5, 0.99),
                 lr_decay=Range(0.8, 1.0), activation=("relu", "tanh"))
    hypermodel = make(TrainConfig(model="plain_net", depth=3), mnist_small, space)
    hp = keras_tuner.HyperParameters()
    hypermodel.declare(hp)
    kinds = {p.name: p for p in hp.space}
    assert list(kinds) == ["learning_rate", "momentum", "lr_decay", "activation"]
    assert kinds["learning_rate"].sampling == "log"
    assert (kinds["momentum"].min_value, kinds["momentum"].max_value) == (0.5, 0.99)
    assert kinds["activation"].values == ["relu", "tanh"]
    hp.values.update(learning_rate=0.02, momentum=0.7, lr_decay=0.85, activation="tanh")
    config = hypermodel.trial_config(hp)
    assert (config.learning_rate, config.momentum, config.lr_decay) == (0.02, 0.7, 0.85)
    model = hypermodel.build(hp)
    assert model.get_layer("plain2").activation.__name__ == "tanh"
    assert model.optimizer.momentum == pytest.approx(0.7)
    schedule = model.optimizer._learning_rate
    # One epoch (200 // 128 = 1 step) decays the rate by the factor drawn.
    assert float(schedule(0)) == pytest.approx(0.02)
    assert float(schedule(1)) == pytest.approx(0.02 * 0.85)


def test_parse_range():
    assert parse_range("momentums", "0.99:0.5") == Range(0.5, 0.99)
    assert parse_range("learning_rates", "1e-3:1", log=True) == Range(1e-3, 1.0, True)
    for text, word in [("1:1", "low:high"), ("a:b", "low:high"), ("0:1", "low > 0")]:
        with pytest.raises(ValueError, match=word):
            parse_range("learning_rates", text, log=True)


@pytest.mark.parametrize("config, space, words", [
    (TrainConfig(model="plain_net", depth=3), {},
     ["space is empty", "model='plain_net' has no gate bias"]),
    (TrainConfig(model="highway_net", depth=3, momentum=0.9), dict(momentum=(0.5, 0.9)),
     ["momentum is both fixed and searched (momentums)"]),
    (TrainConfig(model="plain_net", depth=3, model_kwargs=dict(activation="tanh")),
     dict(activation=("relu",)), ["activation is both fixed and searched"]),
    (TrainConfig(model="resnet", depth=8), dict(activation=("relu",)),
     ["activations applies to highway_net and plain_net"]),
    (TrainConfig(model="highway_net", depth=3), dict(activation=("sigmoid",)),
     ["activations='sigmoid'"]),
    (TrainConfig(model="highway_net", depth=3), dict(momentum=Range(0.5, 1.5)),
     ["momentums=1.5"]),
    (TrainConfig(model="highway_net", depth=3, recipe="highway_mnist_conv"),
     dict(lr_decay=(0.9,)),
     ["lr_decays applies to recipes with an exponential schedule"]),
])
def test_bad_spaces_are_refused_in_one_line(config, space, words, mnist_small):
    with pytest.raises(ConfigError) as error:
        make(config, mnist_small, space)
    message = str(error.value)
    assert "\n" not in message
    for word in words:
        assert word in message


def test_a_depth_searchs_trials_get_the_plan_a_run_of_their_depth_resolves(tmp_path):
    """The ``cifar`` recipe warms up at depths 110 and 1001 only: in a depth
    search over 20 and 110, each trial trains the plan ``keras-identity-train``
    resolves for its depth on the same data (the 110 trial with its warm-up
    at 0.01, the 20 trial without), not the configuration's."""
    import dataclasses

    rng = np.random.default_rng(0)
    data_file = tmp_path / "cifar-like.npz"
    np.savez(data_file, x_train=rng.integers(0, 256, (128, 32, 32, 3), dtype=np.uint8),
             y_train=np.arange(128) % 10, x_test=rng.integers(0, 256, (20, 32, 32, 3),
                                                              dtype=np.uint8),
             y_test=np.arange(20) % 10)
    config = TrainConfig(model="resnet", depth=20, dataset="cifar10", data_dir=str(data_file),
                         epochs=1, batch_size=32, model_dir=str(tmp_path / "tune"))
    setup = run_setup.set_up(config, validation_split=0.25)
    hypermodel = TrainingHyperModel(config, setup.data, setup.recipe, setup.plan,
                                    space={"depth": (20, 110)},
                                    normalization=setup.normalization)
    for depth, warmup, first_rate in ((110, 3, 0.01 * 32 / 128), (20, 0, 0.1 * 32 / 128)):
        hp = keras_tuner.HyperParameters()
        hypermodel.declare(hp)
        hp.values["depth"] = depth
        program = run_setup.set_up(dataclasses.replace(config, depth=depth),
                                   validation_split=0.25).plan
        assert hypermodel.trial_plan(hypermodel.trial_config(hp)) == program
        assert program.warmup_steps == warmup    # the 3 steps of the one epoch
        model = hypermodel.build(hp)
        assert float(model.optimizer.learning_rate) == pytest.approx(first_rate)

import pytest

from keras_identity.training import ConfigError
from keras_identity.tuning import Range
from keras_identity.tuning import run_search
from tests.tuning.searches import quiet
from tests.tuning.searches import search_config


@pytest.mark.parametrize("kwargs, train_kwargs, words", [
    (dict(tuner="anneal"), {}, ["tuner='anneal'"]),
    (dict(), dict(strategy="multi_worker"), ["multi_worker"]),
    (dict(validation_split=0.0), {}, ["validation_split=0.0"]),
    (dict(max_trials=0), {}, ["max_trials=0"]),
    (dict(), dict(model="plain_net"), ["no gate bias"]),
    (dict(gate_biases=(-1.0,)), dict(model="plain_net"), ["gate_biases applies to"]),
    (dict(learning_rates=Range(1e-3, 1.0, True)), {}, ["learning_rates", "tuner='random'"]),
    (dict(tuner="random", momentums=Range(0.5, 0.9)), {}, ["momentums", "max_trials"]),
    (dict(objective="test_error"), {}, ["objective='test_error'"]),
    (dict(learning_rates=()), {}, ["learning_rates is empty"]),
    (dict(lr_decays=(0.9,)), dict(recipe="highway_mnist_conv"),
     ["lr_decays applies to recipes with an exponential schedule"]),
    (dict(depths=Range(3, 5)), {}, ["depths and activations take lists"]),
])
def test_bad_searches(tmp_path, kwargs, train_kwargs, words):
    search = search_config(tmp_path, **kwargs)
    for key, value in train_kwargs.items():
        setattr(search.train, key, value)
    with pytest.raises(ConfigError) as error:
        search.validate()
    for word in words:
        assert word in str(error.value)


@pytest.mark.parametrize("kwargs, train_kwargs, words", [
    (dict(gate_biases=(0.0, float("nan"))), {}, ["gate_biases=nan"]),
    (dict(learning_rates=(0.1, -0.1)), {}, ["learning_rates=-0.1"]),
    (dict(weight_decays=(-1.0,)), {}, ["weight_decays=-1.0"]),
    (dict(depths=(10.5,)), {}, ["depths=10.5"]),
])
def test_search_values_are_validated(tmp_path, kwargs, train_kwargs, words):
    search = search_config(tmp_path, **kwargs)
    with pytest.raises(ConfigError) as error:
        search.validate()
    for word in words:
        assert word in str(error.value)


def test_a_fixed_gate_bias_is_not_searched_by_default(tmp_path):
    search = search_config(tmp_path, learning_rates=(0.05,))
    search.train.model_kwargs = {"transform_bias_init": -3.0}
    assert search.validate().space == {"learning_rate": (0.05,)}
    search.gate_biases = (-1.0, -2.0)
    with pytest.raises(ConfigError, match="gate_bias_init is both fixed and searched"):
        search.validate()


def test_a_changed_search_space_is_refused_not_ignored(tmp_path):
    run_search(search_config(tmp_path, gate_biases=(0.0, -1.0), max_trials=1), print_fn=quiet)
    for kwargs, train_kwargs, word in [
            (dict(gate_biases=(0.0, -5.0)), {}, "gate_biases: [0.0, -1.0] != [0.0, -5.0]"),
            (dict(gate_biases=(0.0, -1.0)), dict(epochs=2), "epochs: 1 != 2"),
            (dict(gate_biases=(0.0, -1.0)), dict(train_examples=2000),
             "train_examples: 3000 != 2000"),
            # A run's flag the search's hand-written list had left out.
            (dict(gate_biases=(0.0, -1.0)), dict(test_examples=500),
             "test_examples: None != 500")]:
        search = search_config(tmp_path, max_trials=2, **kwargs)
        for key, value in train_kwargs.items():
            setattr(search.train, key, value)
        with pytest.raises(ConfigError) as error:
            run_search(search, print_fn=quiet)
        assert "holds another search" in str(error.value) and word in str(error.value)


def test_a_searchs_identity_is_its_runs_identity_and_its_space(tmp_path):
    """search.json holds every flag a training run's identity holds (one list,
    run_files.run_identity), so a flag that changes a run changes the
    search; and the search's own settings beside them."""
    from keras_identity.training import run_files
    from keras_identity.training import run_setup
    from keras_identity.tuning.config import search_identity

    search = search_config(tmp_path, gate_biases=(0.0, -1.0)).validate()
    setup = run_setup.set_up(search.train, validation_split=search.validation_split)
    identity = search_identity(search, setup)
    run = run_files.run_identity(search.train, setup.data, setup.recipe, setup.plan,
                                 setup.normalization, setup.augmentation)
    assert {k: identity[k] for k in run} == run
    assert set(identity) - set(run) == {
        "gate_biases", "learning_rates", "momentums", "lr_decays", "activations",
        "weight_decays", "depths", "tuner", "objective", "epochs", "validation_split"}
    assert identity["gate_biases"] == [0.0, -1.0] and identity["depths"] == []

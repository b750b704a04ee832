"""From a configuration to a run (:mod:`keras_identity.training.run_setup`):
the data a run trains on."""

import pytest

from keras_identity.training import run_setup
from keras_identity.training.config import TrainConfig
from tests.backend import jax_only


@jax_only
def test_input_workers_are_refused_for_data_in_memory():
    with pytest.raises(ValueError, match=r"^input_workers=2 is not valid for built-in MNIST "
                                         r"\(keras_identity/data/mnist.npz\), which is held "
                                         r"in memory"):
        run_setup.load_data(TrainConfig(input_workers=2).validate())
    assert run_setup.load_data(TrainConfig(input_workers=0).validate()).num_train == 60_000

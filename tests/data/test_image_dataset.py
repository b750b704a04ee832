import numpy as np
import pytest

from keras_identity.data import load_dataset


def test_validation_split_is_stratified_and_drops_the_test_set():
    data = load_dataset("mnist").subset(num_train=2000, seed=1)
    split = data.with_validation_split(0.1, seed=0)
    assert len(split.x_val) + len(split.x_train) == 2000
    assert split.x_test is None and split.y_test is None
    counts = np.bincount(split.y_val, minlength=10) / np.bincount(data.y_train, minlength=10)
    assert np.all(np.abs(counts - 0.1) < 0.03)
    with pytest.raises(ValueError, match="validation_split=1.5"):
        data.with_validation_split(1.5)

"""deletion_study (Veit et al. 2016): residual nets survive deleted units."""

import keras
import numpy as np
import pytest

import keras_identity as ki


def _data(model, n=64, seed=0):
    x = np.random.default_rng(seed).integers(0, 256, (n, *model.input_shape[1:])).astype(
        np.float32)
    return x, model.predict(x, verbose=0).argmax(axis=1)   # baseline error 0


def test_looped_and_unrolled_forms_give_the_same_study():
    keras.utils.set_random_seed(0)
    looped = ki.models.preact_resnet(14, input_shape=(8, 8, 3), num_classes=5,
                                     stage_mode="scan")
    x, y = _data(looped)
    a = ki.analysis.deletion_study(looped, x, y, draws=2, seed=3)
    b = ki.analysis.deletion_study(ki.models.unroll(looped), x, y, draws=2, seed=3)
    assert a == b
    assert a["baseline"] == 0.0 and len(a["units"]) == 6 and a["k"] == [1, 2, 3, 4, 5, 6]
    assert a["changes_shape"] == [False, False, True, False, True, False]
    assert all(e is not None for e in a["single"]) and max(a["single"]) > 0
    assert np.shape(a["random"]) == (6, 2)
    # Every unit deleted: what is left is the stem, the shortcuts and the head.
    assert a["random"][-1][0] == a["random"][-1][1]


def test_a_plain_net_keeps_the_units_that_change_shape():
    keras.utils.set_random_seed(1)
    plain = ki.models.resnet(14, input_shape=(8, 8, 3), num_classes=5,
                             shortcut="constant_scaling", shortcut_scale=0.0)
    x, y = _data(plain)
    result = ki.analysis.deletion_study(plain, x, y, draws=1)
    kept = [e is None for e in result["single"]]
    assert kept == result["changes_shape"] == [False, False, True, False, True, False]
    assert result["k"] == [1, 2, 3, 4]


def test_bad_arguments_are_one_line(tmp_path):
    net = ki.models.preact_resnet(8, input_shape=(8, 8, 3), num_classes=3)
    x, y = _data(net, n=8)
    with pytest.raises(ValueError, match=r"max_deleted=9 is not valid; expected an integer "
                                         r"in \[1, 3\]"):
        ki.analysis.deletion_study(net, x, y, max_deleted=9)
    with pytest.raises(ValueError, match="has no residual units to delete"):
        ki.analysis.deletion_study(ki.models.highway_net(3), np.zeros((2, 28, 28, 1)),
                                   np.zeros(2))
    results = {"pre-act": ki.analysis.deletion_study(net, x, y, draws=2)}
    ki.analysis.plot_deletions(results, str(tmp_path / "deletions.png"), title="t")
    assert (tmp_path / "deletions.png").stat().st_size > 1000

"""benchmarks.step_profile: the convolutions it times are the net's."""

import pytest

from benchmarks import run as bench
from benchmarks import step_profile
from tests.backend import default_route


@pytest.mark.parametrize("depth, count", [(164, 1 + 3 * (4 + 3 * 17)), (110, 1 + 3 * 2 * 18)])
def test_conv_shapes_are_every_convolution_of_the_net(depth, count):
    shapes = step_profile.conv_shapes(depth, batch=1)
    assert sum(shapes.values()) == count
    # Their multiply-adds are the forward pass's, less the classifier's.
    macs = sum(c * (h // s) * (w // s) * k * k * cin * cout
               for (n, h, w, cin, cout, k, s), c in shapes.items())
    classifier = (256 if depth == 164 else 64) * 10
    assert 2 * (macs + classifier) == bench.forward_flops(depth)


@pytest.mark.parametrize("settings, flag", [
    (dict(depth=21), "depth"), (dict(batch=0), "--batch=0"), (dict(rounds=0), "--rounds=0"),
    (dict(conv_threads=["1", "0"]), "--conv_threads=1,0"),
    (dict(conv_threads=["two"]), "--conv_threads=two"), (dict(conv_threads=["\u00b2"]), "--conv"),
    (dict(conv_threads=["1", "1"]), "--conv_threads=1,1"), (dict(step=False), "--nostep")])
def test_settings_are_refused_in_one_line_naming_the_flag(settings, flag):
    given = dict(depth=20, batch=2, repeats=1, step=True, conv_threads=[], rounds=1)
    with pytest.raises(ValueError, match=flag):
        step_profile.check_settings(**dict(given, **settings))
    assert step_profile.check_settings(**dict(given, conv_threads=["2", "1"])) == [2, 1]


@default_route
@pytest.mark.needs_tensorflow
def test_thread_sums_time_both_frameworks_in_fresh_processes():
    shapes = step_profile.conv_shapes(20, batch=1)
    (row,) = step_profile.thread_sums(shapes, [1], repeats=1, rounds=2, torch=True)
    assert row["threads"] == 1 and len(row["tensorflow_runs_ms"]) == 2
    assert row["tensorflow"].count(".") >= 2  # the worker's TensorFlow version
    assert row["tensorflow_ms"] > 0 and row["tensorflow_gain"] == 1.0
    if row["pytorch_ms"] is None:  # PyTorch not installed (the bench extra): said so
        assert "pytorch: exit 1" in row["note"] and "torch" in row["note"]
    else:
        assert len(row["pytorch_runs_ms"]) == 2 and row["ratio"] > 0 and row["torch"]

"""keras.distribution on JAX: DataParallel over local devices splits the
global batch as tf.distribute does, with the same losses as one device."""

import json
import os
import subprocess
import sys

import pytest

from keras_identity.training import strategies
from tests.backend import jax_only

pytestmark = jax_only

RUN = r"""
import json, sys
from keras_identity.training import TrainConfig, train
config = TrainConfig(model="highway_net", depth=10, dataset="mnist", train_steps=6,
                     steps_per_epoch=3, batch_size=32, train_examples=512,
                     test_examples=250, model_dir=sys.argv[1], verbose=0)
lines = []
result = train(config, print_fn=lines.append)
print(json.dumps({"history": [[h["loss"], h["test_loss"], h["test_error"]]
                              for h in result["history"]], "lines": lines}))
"""


def _train(tmp_path, devices):
    env = dict(os.environ, KERAS_BACKEND="jax", XLA_FLAGS=" ".join(
        [os.environ.get("XLA_FLAGS", ""), f"--xla_force_host_platform_device_count={devices}"]))
    out = subprocess.run([sys.executable, "-c", RUN, str(tmp_path / f"d{devices}")],
                         env=env, capture_output=True, text=True, check=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def test_data_parallel_on_two_devices_equals_one_device(tmp_path):
    one, two = _train(tmp_path, 1), _train(tmp_path, 2)
    assert "JAX one device (1 CPU)" in one["lines"][1]
    assert "JAX DataParallel (2 CPU)" in two["lines"][1]
    # Training losses, and the test loss and error over 250 images (the last
    # batch padded with zero-weight examples on two devices, not on one).
    assert len(one["history"]) == len(two["history"]) == 2
    for a, b in zip(one["history"], two["history"]):
        assert a == pytest.approx(b, abs=1e-5)
    assert one["history"][-1][2] * 250 == pytest.approx(round(one["history"][-1][2] * 250))


def test_strategy_names_resolve_to_keras_distributions():
    import jax

    auto = strategies.get_strategy("auto")
    assert isinstance(auto, strategies.KerasDistribution)
    assert auto.num_replicas_in_sync == len(jax.local_devices())
    single = strategies.get_strategy("one_device")
    assert single.num_replicas_in_sync == 1 and single.distribution is None
    assert strategies.describe(single) == "JAX one device (1 CPU)"
    assert strategies.is_chief(auto) and not strategies.is_tpu(auto)


@pytest.mark.parametrize("name, tpu, match", [
    ("multi_worker", "", "strategy='multi_worker' is TensorFlow's"),
    ("tpu", "", r"strategy=.tpu. found no TPU: JAX sees \d+ CPU"),
    ("auto", "grpc://10.0.0.2:8470", "tpu='grpc://10.0.0.2:8470' does not apply on the JAX"),
])
def test_unavailable_distributions_are_refused_in_one_line(name, tpu, match):
    with pytest.raises(ValueError, match=match):
        strategies.get_strategy(name, tpu)


def test_tpu_chips_that_jax_cannot_see_name_the_install(monkeypatch):
    monkeypatch.setattr(strategies.glob, "glob", lambda pattern: ["/dev/accel0"])
    with pytest.raises(ValueError, match=r"TPU chips but JAX .* sees \d+ CPU: install jax\[tpu\]"):
        strategies.get_strategy("auto")
    assert strategies.get_strategy("default").num_replicas_in_sync == 1


def test_input_placement_of_a_keras_distribution_reads_this_processes_rows():
    strategy = strategies.get_strategy("default")
    assert strategies.input_placement(strategy) == dict(pad_to_batch=False, process_index=0,
                                                        process_count=1)

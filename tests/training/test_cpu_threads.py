"""TensorFlow's CPU thread pools in training: the choice by batch and cores,
applied before TensorFlow's runtime starts, refused after it."""

import os
import subprocess
import sys

import pytest

from keras_identity.training import cpu_threads
from tests.conftest import REPO


@pytest.mark.parametrize("intra, batch, cores, accelerator, expected", [
    (None, 16, 2, False, (1, 2)),      # 8 images a core: two operations at once
    (None, 17, 2, False, None),        # more: TensorFlow's own split
    (None, 64, 2, False, None),
    (None, 128, 16, False, (8, 2)),
    (None, 16, 2, True, None),         # a GPU or TPU trains
    (None, 4, 1, False, None),         # one core: nothing to split
    (0, 16, 2, False, None),           # TensorFlow's own, asked for
    (1, 64, 8, False, (1, 8)),
    (3, 64, 8, False, (3, 2)),
    (2, 16, 2, True, (2, 2)),          # asked for: applied on any device
])
def test_the_pools_chosen_for_batch_and_cores(intra, batch, cores, accelerator, expected):
    chosen = cpu_threads.choose(intra, batch, cores=cores, accelerator=accelerator)
    assert (chosen if chosen is None else chosen[:2]) == expected


def test_bad_intra_op_threads_are_refused():
    with pytest.raises(ValueError, match=r"^intra_op_threads=-1 is not valid; expected an "
                                         r"integer >= 0\.$"):
        cpu_threads.choose(-1, 16, cores=2)


@pytest.mark.needs_tensorflow
def test_configure_sets_the_pools_before_the_runtime_and_refuses_after():
    probe = (
        "import tensorflow as tf\n"
        "from keras_identity.training import cpu_threads\n"
        "print('LINE', cpu_threads.configure(None, 8 * cpu_threads.cpu_kernels.cores()))\n"
        "print('POOLS', tf.config.threading.get_intra_op_parallelism_threads(),"
        " tf.config.threading.get_inter_op_parallelism_threads())\n"
        "from keras_identity.layers.residual import _tf_batch_parts\n"
        "print('PARTS', _tf_batch_parts.conv_parts())\n"
        "print('OWN', cpu_threads.configure(0, 16))\n"
        "print('RESET', tf.config.threading.get_intra_op_parallelism_threads())\n"
        "tf.constant(1.0) + 1.0\n"
        "print('AUTO', cpu_threads.configure(None, 16))\n"
        "try:\n"
        "    cpu_threads.configure(1, 16)\n"
        "except ValueError as error:\n"
        "    print('REFUSED', error)\n")
    done = subprocess.run([sys.executable, "-c", probe], cwd=REPO, text=True,
                          capture_output=True, timeout=300,
                          env=dict(os.environ, KERAS_BACKEND="tensorflow"))
    assert done.returncode == 0, done.stderr[-2000:]
    lines = dict(line.split(" ", 1) for line in done.stdout.splitlines())
    cores = cpu_threads.cpu_kernels.cores()
    if cores >= 2:
        assert lines["LINE"].startswith(f"TensorFlow CPU threads: {cores // 2} per operation, "
                                        f"2 operations at once (keras_identity's choice for a "
                                        f"batch of {8 * cores} on {cores} cores;")
        assert lines["POOLS"] == f"{cores // 2} 2"
        # One thread per operation: the looped stages' forward convolutions
        # are split in two along the batch (layers.residual._tf_batch_parts).
        assert lines["PARTS"] == ("2" if cores == 2 else "1")
    assert lines["OWN"] == "TensorFlow CPU threads: its own split (--intra_op_threads=0)"
    assert lines["RESET"] == "0"
    # After the runtime started: the default leaves the pools, a value given is refused.
    if cores >= 2:
        assert lines["AUTO"] == ("TensorFlow CPU threads: as they were (its runtime had "
                                 "started before the run)")
    assert lines["REFUSED"].startswith("intra_op_threads=1 cannot be applied: TensorFlow's "
                                       "runtime has already started in this process")

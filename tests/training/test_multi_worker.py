"""MultiWorkerMirroredStrategy with two worker processes on 127.0.0.1."""

import json
import os
import socket
import subprocess
import sys

import numpy as np

from tests.conftest import REPO
from tests.backend import tensorflow_only

pytestmark = tensorflow_only  # tf.distribute strategies (JAX: tests/training/test_jax_distribution.py)

FLAGS = ["--model=highway_net", "--depth=4", "--train_examples=2048", "--test_examples=256",
         "--batch_size=64", "--steps_per_epoch=8", "--epochs=2", "--seed=1",
         "--deterministic", "--verbose=0"]


def _free_ports(n):
    sockets = [socket.socket() for _ in range(n)]
    for s in sockets:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in sockets]
    for s in sockets:
        s.close()
    return ports


def _run(args, env=None):
    return subprocess.Popen([sys.executable, "-m", "keras_identity_cli.train", *FLAGS, *args],
                            cwd=REPO, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)


def test_two_workers_match_one(tmp_path):
    ports = _free_ports(2)
    cluster = {"worker": [f"127.0.0.1:{p}" for p in ports]}
    workers = []
    for index in range(2):
        env = dict(os.environ, TF_CONFIG=json.dumps(
            {"cluster": cluster, "task": {"type": "worker", "index": index}}))
        workers.append(_run(["--strategy=multi_worker", f"--model_dir={tmp_path / 'mw'}"],
                            env))
    single = _run(["--strategy=default", f"--model_dir={tmp_path / 'one'}"])
    outputs = [p.communicate(timeout=300)[0] for p in workers + [single]]
    for process, output in zip(workers + [single], outputs):
        assert process.returncode == 0, output[-2000:]
    assert "CollectiveAllReduceStrategy (2 replicas)" in outputs[0]
    multi = json.loads((tmp_path / "mw" / "history.json").read_text())
    one = json.loads((tmp_path / "one" / "history.json").read_text())
    assert [r["step"] for r in multi] == [8, 16]
    np.testing.assert_allclose([r["loss"] for r in multi], [r["loss"] for r in one],
                               rtol=1e-5)
    np.testing.assert_allclose([r["test_error"] for r in multi],
                               [r["test_error"] for r in one], atol=1e-6)
    # Only the chief writes the run's outputs; the other worker uses a scratch dir.
    assert (tmp_path / "mw" / "model.keras").exists()
    assert (tmp_path / "mw" / ".worker1").is_dir()

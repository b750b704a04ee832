"""MultiWorkerMirroredStrategy with two worker processes on 127.0.0.1."""

import json
import os
import socket
import subprocess
import sys

import numpy as np

from tests.conftest import REPO
from tests.backend import tensorflow_only
from tests.programs import LineWatch

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


def test_sigterm_to_one_worker_stops_both_at_one_step_and_they_resume(tmp_path):
    """A preemption notice that reaches one worker only: both save the same
    step (agreed through the strategy's all-reduce) and exit 75; the same
    commands resume and end as an uninterrupted run does."""
    import signal

    def start(model_dir, extra):
        ports = _free_ports(2)
        cluster = {"worker": [f"127.0.0.1:{p}" for p in ports]}
        return [_run(["--strategy=multi_worker", f"--model_dir={model_dir}", *extra],
                     dict(os.environ, TF_CONFIG=json.dumps(
                         {"cluster": cluster, "task": {"type": "worker", "index": i}})))
                for i in range(2)]

    extra = ["--epochs=3", "--checkpoint_every=epoch"]
    # The uninterrupted reference: one process, which two workers equal (the
    # test above).
    straight = _run(["--strategy=default", f"--model_dir={tmp_path / 'straight'}", *extra])
    output = straight.communicate(timeout=300)[0]
    assert straight.returncode == 0, output[-2000:]

    workers = start(tmp_path / "run", extra)
    output = LineWatch(workers[0].stdout, "epoch 1 ")
    assert output.wait(300), output.text()[-2000:]
    workers[1].send_signal(signal.SIGTERM)
    other = workers[1].communicate(timeout=120)[0]
    assert workers[0].wait(timeout=120) == 75 and workers[1].returncode == 75, (
        output.text()[-2000:] + other[-2000:])
    output.join()
    steps = {line.split(" at step ")[1].split()[0]
             for line in output.lines + other.splitlines()
             if line.startswith("stopped by SIGTERM")}
    assert len(steps) == 1 and 8 <= int(steps.pop()) < 24, output.text() + other

    resumed = start(tmp_path / "run", extra)
    outputs = [p.communicate(timeout=300)[0] for p in resumed]
    assert [p.returncode for p in resumed] == [0, 0], outputs[0][-2000:]
    assert "resuming from the checkpoint at step" in outputs[0]
    ours = json.loads((tmp_path / "run" / "history.json").read_text())
    theirs = json.loads((tmp_path / "straight" / "history.json").read_text())
    assert [r["step"] for r in ours] == [8, 16, 24]
    np.testing.assert_allclose([r["loss"] for r in ours], [r["loss"] for r in theirs],
                               rtol=1e-5)

"""One JAX run across processes (jax.distributed): two CPU processes on
127.0.0.1 train together as one process over two devices does, only process 0
writes the run's files (both write their Orbax checkpoints together), a
resumed run restores the same checkpoint in both, and a process that dies
stops the other with one line."""

import json
import os
import random
import signal
import socket
import subprocess
import sys
import time

import pytest

from keras_identity.training import processes
from tests.backend import jax_only
from tests.programs import LineWatch
from tests.programs import error_lines


FLAGS = ["--model=highway_net", "--depth=10", "--batch_size=32", "--steps_per_epoch=3",
         "--test_examples=250", "--verbose=0", "--seed=3"]


@pytest.mark.parametrize("arguments, message", [
    (dict(coordinator_address="127.0.0.1:1234"), "--num_processes, --process_id missing"),
    (dict(num_processes=2, process_id=0), "--coordinator_address missing"),
    (dict(coordinator_address="localhost", num_processes=2, process_id=0),
     "expected HOST:PORT"),
    (dict(coordinator_address="h:70000", num_processes=2, process_id=0), "expected HOST:PORT"),
    (dict(coordinator_address="h:80", num_processes=0, process_id=0), "integer >= 1"),
    (dict(coordinator_address="h:80", num_processes=2, process_id=2), r"in \[0, 2\)"),
])
def test_the_process_flags_are_checked_in_one_line(arguments, message):
    with pytest.raises(ValueError, match=message):
        processes.check_arguments(**arguments)
    assert processes.check_arguments() is False
    assert processes.check_arguments("10.0.0.2:1234", 4, 3) is True


def _port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _env(devices=None):
    env = dict(os.environ, KERAS_BACKEND="jax", PYTHONUNBUFFERED="1")
    flags = [f for f in env.get("XLA_FLAGS", "").split()
             if not f.startswith("--xla_force_host_platform_device_count")]
    if devices:
        flags.append(f"--xla_force_host_platform_device_count={devices}")
    env["XLA_FLAGS"] = " ".join(flags)
    return env


def _command(model_dir, extra):
    examples = [] if any(a.startswith("--train_examples") for a in extra) else [
        "--train_examples=512"]
    return [sys.executable, "-m", "keras_identity_cli.train", *FLAGS, *examples,
            f"--model_dir={model_dir}", *extra]


def _start_pair(model_dir, extra):
    port = _port()
    return [subprocess.Popen(
        _command(model_dir, extra + [f"--coordinator_address=127.0.0.1:{port}",
                                     "--num_processes=2", f"--process_id={i}"]),
        env=_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for i in range(2)]


def _finish(procs, timeout=600):
    outputs = []
    for proc in procs:
        out, err = proc.communicate(timeout=timeout)
        outputs.append((proc.returncode, out, err))
    return outputs


def _losses(model_dir):
    with open(os.path.join(model_dir, "history.json")) as f:
        return [[row["loss"], row["test_loss"], row["test_error"]] for row in json.load(f)]


@jax_only
def test_two_processes_train_as_one_process_over_two_devices(tmp_path):
    reference = tmp_path / "one_process"
    subprocess.run(_command(reference, ["--train_steps=6"]), env=_env(devices=2), check=True,
                   capture_output=True, text=True, timeout=600)
    together = tmp_path / "two_processes"
    (rc0, out0, err0), (rc1, out1, err1) = _finish(_start_pair(together, ["--train_steps=6"]))
    assert (rc0, rc1) == (0, 0), err0[-2000:] + err1[-2000:]
    assert "JAX DataParallel (2 processes, 2 CPU)" in out0
    # Process 1 says what it runs, and leaves the per-epoch lines to process 0.
    assert "JAX DataParallel (2 processes, 2 CPU)" in out1
    assert "epoch 2 step 6/6" in out0 and "epoch 1 step" not in out1
    # Equal losses, test losses and errors (250 test images, the last batch
    # padded): the same global batches and gradients, summed across processes
    # by Gloo instead of within one process (rounding only).
    for a, b in zip(_losses(reference), _losses(together)):
        assert a == pytest.approx(b, abs=1e-5)
    # Written once, by process 0: no per-process copies.
    names = sorted(os.listdir(together))
    assert "model.keras" in names and not any(n.startswith(".worker") for n in names)
    assert sorted(os.listdir(together / "tensorboard")) == ["train", "validation"]

    # Resumed with a longer run: both restore the checkpoint of step 6.
    (rc0, out0, err0), (rc1, _, err1) = _finish(_start_pair(together, ["--train_steps=9"]))
    assert (rc0, rc1) == (0, 0), err0[-2000:] + err1[-2000:]
    assert "resuming from the checkpoint at step 6" in out0
    assert [row[0] for row in _losses(together)][:2] == [row[0] for row in
                                                         _losses(reference)][:2]
    assert len(_losses(together)) == 3
    # One Orbax checkpoint per step, written by both; the keep rule's
    # removals (step 3) the same in both.
    checkpoints = together / "checkpoints"
    assert sorted(os.listdir(checkpoints)) == ["ckpt_000000006", "ckpt_000000009"]

    # The newest checkpoint unreadable: both pass it over, set it aside
    # together and resume from step 6.
    (checkpoints / "ckpt_000000009" / "state" / "metadata").write_text("{")
    (rc0, out0, err0), (rc1, _, err1) = _finish(_start_pair(together, ["--train_steps=12"]))
    assert (rc0, rc1) == (0, 0), err0[-2000:] + err1[-2000:]
    assert "resuming from the checkpoint at step 6" in out0
    assert sorted(os.listdir(checkpoints)) == ["ckpt_000000009", "ckpt_000000009.unread",
                                               "ckpt_000000012"]


@jax_only
def test_a_process_that_dies_stops_the_other_with_one_line(tmp_path):
    port = _port()
    err_path = tmp_path / "process0.err"
    with open(err_path, "w") as err_file:
        procs = [subprocess.Popen(
            _command(tmp_path / "run", ["--train_steps=3000", "--steps_per_epoch=1000",
                                        f"--coordinator_address=127.0.0.1:{port}",
                                        "--num_processes=2", f"--process_id={i}"]),
            env=_env(), stdout=subprocess.PIPE if i == 0 else subprocess.DEVNULL,
            stderr=err_file if i == 0 else subprocess.DEVNULL, text=True) for i in range(2)]
    # Process 0 prints its model line once both processes are connected (the
    # run's processes start together); the kill comes while they compile or
    # train.
    output = LineWatch(procs[0].stdout, "model ")
    assert output.wait(180), output.text()[-2000:] + err_path.read_text()[-2000:]
    time.sleep(2)
    procs[1].send_signal(signal.SIGKILL)
    procs[1].wait()
    started = time.time()
    rc0 = procs[0].wait(timeout=150)
    output.join()
    err0 = err_path.read_text()
    assert rc0 != 0
    assert time.time() - started < processes.HEARTBEAT_TIMEOUT_S + 30
    errors = error_lines(err0)
    assert errors and "another process of this 2-process run stopped" in errors[-1], err0[-3000:]


@jax_only
@pytest.mark.parametrize("differs, words", [
    ("train_examples", "the run's inputs"), ("model_dir", "--model_dir")])
def test_processes_with_other_inputs_are_refused_in_one_line(tmp_path, differs, words):
    """Hosts that would train on other data (another subset) or write other
    directories never train apart: both stop before the first step, naming
    the disagreement, and nothing is written."""
    port = _port()
    procs = [subprocess.Popen(
        _command(tmp_path / (f"run{i}" if differs == "model_dir" else "run"), [
            "--train_steps=6", f"--coordinator_address=127.0.0.1:{port}",
            "--num_processes=2", f"--process_id={i}",
            f"--train_examples={512 + 64 * i}" if differs == "train_examples" else
            "--train_examples=512"]),
        env=_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for i in range(2)]
    for rc, _, err in _finish(procs, timeout=300):
        assert rc == 2
        errors = error_lines(err)
        assert len(errors) == 1 and f"the processes disagree on {words}" in errors[0]
    assert not any((tmp_path / name / "run.json").exists() for name in ("run", "run0", "run1"))


def test_a_taken_coordinator_port_is_one_line_before_jax_starts():
    with socket.socket() as holder:
        holder.bind(("", 0))
        holder.listen()
        port = holder.getsockname()[1]
        with pytest.raises(ValueError) as error:
            processes.check_port_free(f"127.0.0.1:{port}")
    message = str(error.value)
    assert "\n" not in message and f"port {port} is in use by another program" in message
    processes.check_port_free(f"127.0.0.1:{port}")   # free again once closed


@jax_only
def test_process_0_on_a_taken_port_exits_with_one_line(tmp_path):
    with socket.socket() as holder:
        holder.bind(("", 0))
        holder.listen()
        port = holder.getsockname()[1]
        done = subprocess.run(
            _command(tmp_path / "run", ["--train_steps=6", "--num_processes=2",
                                        f"--coordinator_address=127.0.0.1:{port}",
                                        "--process_id=0"]),
            env=_env(), capture_output=True, text=True, timeout=300)
    assert done.returncode == 2
    errors = error_lines(done.stderr)
    assert len(errors) == 1 and f"port {port} is in use by another program" in errors[0]


@jax_only
@pytest.mark.parametrize("present", [0, 1])
def test_a_process_whose_peer_never_comes_ends_in_one_line(tmp_path, present):
    """Only process ``present`` of 2 starts: it says what it waits for, and
    after --initialization_timeout_s one line names the one that did not
    come; status 1, no stack trace."""
    started = time.time()
    result = subprocess.run(
        _command(tmp_path / "run", [f"--coordinator_address=127.0.0.1:{_port()}",
                                    "--num_processes=2", f"--process_id={present}",
                                    "--initialization_timeout_s=4"]),
        env=_env(), capture_output=True, text=True, timeout=300)
    assert result.returncode == 1, result.stderr[-2000:]
    assert time.time() - started < 4 + 60  # the timeout, and the program's start
    waiting = ("waiting for 1 of 2 processes at --coordinator_address=127.0.0.1:"
               if present == 0 else "waiting for process 0 at --coordinator_address=")
    assert waiting in result.stderr and "up to 4 s" in result.stderr
    errors = error_lines(result.stderr)
    missing = "process 1 of 2 did not connect" if present == 0 else (
        "process 0 of 2 did not answer")
    assert len(errors) == 1 and missing in errors[0] and "within 4 s" in errors[0], \
        result.stderr[-2000:]
    assert "Traceback" not in result.stderr and not os.path.exists(tmp_path / "run")


# After process 0's first epoch line, the notice comes at once or after a
# random delay: ten moments in all, nine of them in the slow run.
_SLOW_DELAYS = sorted(round(d, 2) for d in random.Random(7).sample(
    [x / 100 for x in range(5, 100)], 9))


@jax_only
@pytest.mark.parametrize("delay", [0.0] + [pytest.param(d, marks=pytest.mark.slow)
                                           for d in _SLOW_DELAYS])
def test_sigterm_to_one_process_stops_both_at_one_step_and_they_resume(tmp_path, delay):
    """A preemption notice that reaches one host only: both processes save
    the same step and exit 75; the same commands resume, and the run ends as
    an uninterrupted run over the two processes' devices does."""
    extra = ["--train_steps=24", "--steps_per_execution=1", "--checkpoint_every=epoch"]
    # The uninterrupted reference: one process over two devices, which two
    # processes equal (the test above).
    straight = tmp_path / "straight"
    done = subprocess.run(_command(straight, extra), env=_env(devices=2), capture_output=True,
                          text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]

    run = tmp_path / "run"
    procs = _start_pair(run, extra)
    assert LineWatch(procs[0].stdout, "epoch 1 ").wait(300)
    time.sleep(delay)
    procs[1].send_signal(signal.SIGTERM)
    codes = [proc.wait(timeout=120) for proc in procs]
    errs = [proc.stderr.read() for proc in procs]
    assert codes == [75, 75], errs[0][-2000:] + errs[1][-2000:]
    steps = {line.split(" at step ")[1].split()[0] for err in errs for line in err.splitlines()
             if line.startswith("stopped by SIGTERM")}
    assert len(steps) == 1 and 3 <= int(steps.pop()) < 24, errs
    (rc0, out0, err0), (rc1, _, err1) = _finish(_start_pair(run, extra))
    assert (rc0, rc1) == (0, 0), err0[-2000:] + err1[-2000:]
    assert "resuming from the checkpoint at step" in out0
    for a, b in zip(_losses(straight), _losses(run)):
        assert a == pytest.approx(b, abs=1e-5)
    assert len(_losses(run)) == 8

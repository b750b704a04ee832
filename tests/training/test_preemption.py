"""A stopped run loses seconds, not an epoch (keras_identity.training.preemption):
a stop signal at any moment saves the step in progress, checkpoints inside an
epoch keep the epoch's metric sums, and the resumed run ends where an
uninterrupted one does: same weights, optimizer state and history."""

import json
import os
import random
import signal
import subprocess
import sys
import time

import keras
import numpy as np
import pytest

from keras_identity.training import Stopped
from keras_identity.training import TrainConfig
from keras_identity.training import checkpoints
from keras_identity.training import fit_loop
from keras_identity.training import orbax_checkpoints
from keras_identity.training import preemption
from keras_identity.training import recorders
from keras_identity.training import train
from tests.backend import BACKEND
from tests.backend import backend_neutral
from tests.backend import default_route
from tests.conftest import REPO

STEPS_PER_EPOCH = 8
EPOCHS = 3
TOTAL = STEPS_PER_EPOCH * EPOCHS


def quiet(*_):
    pass


SENT = []  # when each signal was sent


def _send(number=signal.SIGTERM):
    SENT.append(time.monotonic())
    os.kill(os.getpid(), number)


def _config(model_dir, **kwargs):
    base = dict(model="highway_net", depth=3, train_examples=256, test_examples=64,
                epochs=EPOCHS, batch_size=32, verbose=0, seed=1, deterministic=True,
                steps_per_execution=1, checkpoint_every="epoch", model_dir=str(model_dir))
    base.update(kwargs)
    return TrainConfig(**base)


def _final(model_dir):
    model = keras.saving.load_model(os.path.join(model_dir, "model.keras"))
    return ([np.asarray(w) for w in model.get_weights()],
            [np.asarray(keras.ops.convert_to_numpy(v)) for v in model.optimizer.variables])


def _same_run(result, straight, model_dir, straight_dir):
    """The resumed run's weights, optimizer state and history are the
    uninterrupted run's (to float tolerance)."""
    for ours, theirs in zip(*(_final(d) for d in (model_dir, straight_dir))):
        assert len(ours) == len(theirs)
        for a, b in zip(ours, theirs):
            np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7)
    assert [r["step"] for r in result["history"]] == [8, 16, 24]
    for ours, theirs in zip(result["history"], straight["history"]):
        for key in ("loss", "train_error", "test_loss", "test_error", "learning_rate"):
            assert ours[key] == pytest.approx(theirs[key], rel=1e-6, abs=1e-7), key


@pytest.fixture(scope="module")
def straight(tmp_path_factory):
    model_dir = tmp_path_factory.mktemp("straight")
    return train(_config(model_dir), quiet), model_dir


def _signal_at_step(monkeypatch, step, number=signal.SIGTERM):
    """Sends ``number`` to this process as step ``step`` ends (before the
    next one starts)."""
    original = fit_loop.StopOnNaN.on_train_batch_end

    def end(self, batch, logs=None):
        if self.step(batch) == step:
            _send(number)
        return original(self, batch, logs)

    monkeypatch.setattr(fit_loop.StopOnNaN, "on_train_batch_end", end)


def _latest(directory):
    """The newest checkpoint's state, as the run's backend writes them (Orbax
    on JAX)."""
    kind = (orbax_checkpoints.OrbaxCheckpointer if BACKEND == "jax"
            and orbax_checkpoints.available() else checkpoints.Checkpointer)
    reader = kind(directory)
    try:
        return reader.latest()
    finally:
        reader.close()


def _signal_during_checkpoint_write(monkeypatch, step):
    """Sends SIGTERM while the checkpoint of ``step`` is being written (its
    weights file written, its state not yet)."""
    for kind in (checkpoints.Checkpointer, orbax_checkpoints.OrbaxCheckpointer):
        def save(self, model, original=kind.save, **kwargs):
            if kwargs["step"] == step:
                _send()
            return original(self, model, **kwargs)

        monkeypatch.setattr(kind, "save", save)


def _signal_during_evaluation(monkeypatch, epoch):
    """Sends SIGTERM when the evaluation of epoch ``epoch`` (1-based) starts."""
    original = recorders.RunRecorder.on_test_begin

    def begin(self, logs=None):
        if len(self.history) == epoch - 1:
            _send()
        return original(self, logs)

    monkeypatch.setattr(recorders.RunRecorder, "on_test_begin", begin)


# Ten moments: seven random steps inside epochs, an epoch's last step, a
# checkpoint being written and an evaluation.
_STEPS = sorted(random.Random(43).sample(
    [s for s in range(1, TOTAL) if s % STEPS_PER_EPOCH], 7))
MOMENTS = ([("step", s) for s in _STEPS] + [("step", 2 * STEPS_PER_EPOCH)]
           + [("checkpoint write", STEPS_PER_EPOCH), ("evaluation", 2)])


@pytest.mark.parametrize("where, when", MOMENTS, ids=[f"{w}-{n}" for w, n in MOMENTS])
def test_sigterm_at_any_moment_resumes_as_if_never_stopped(tmp_path, monkeypatch, straight,
                                                           where, when):
    model_dir = tmp_path / "run"
    handler = signal.getsignal(signal.SIGTERM)
    with monkeypatch.context() as patch:
        if where == "step":
            _signal_at_step(patch, when)
        elif where == "checkpoint write":
            _signal_during_checkpoint_write(patch, when)
        else:
            _signal_during_evaluation(patch, when)
        try:
            finished = train(_config(model_dir), quiet)
        except Stopped as error:
            stopped, finished = error, None
    # The step in progress ends and is saved: a step's signal stops after it
    # (on TensorFlow; the JAX route decides beside the next steps, so a few
    # more, at most to the epoch's end, may run first); an epoch's last step,
    # its checkpoint or its evaluation stop at its end.  Within seconds.
    assert time.monotonic() - SENT[-1] < 5
    last_epoch = when > TOTAL - STEPS_PER_EPOCH
    if finished is not None:
        # On JAX the batch-end callbacks run in a thread pool beside the
        # next steps, so under load a signal of the last epoch can be seen
        # only at the run's end: the run then simply ends, complete.
        assert BACKEND == "jax" and where == "step" and last_epoch, "the run did not stop"
        assert signal.getsignal(signal.SIGTERM) is handler
        _same_run(finished, straight[0], model_dir, straight[1])
        return
    expected = {"step": when, "checkpoint write": when,
                "evaluation": when * STEPS_PER_EPOCH}[where]
    if where == "step" and when % STEPS_PER_EPOCH and BACKEND == "jax":
        assert expected <= stopped.step <= -(-expected // STEPS_PER_EPOCH) * STEPS_PER_EPOCH
    else:
        assert stopped.step == expected
    assert f"at step {stopped.step}" in str(stopped)
    assert signal.getsignal(signal.SIGTERM) is handler  # the handlers are put back
    state = _latest(str(model_dir / "checkpoints"))
    assert state["step"] == stopped.step
    assert ("metrics" in state) == bool(state["step"] % STEPS_PER_EPOCH)
    result = train(_config(model_dir), quiet)
    _same_run(result, straight[0], model_dir, straight[1])


def test_checkpoints_inside_epochs_change_nothing_of_the_run(tmp_path, straight):
    lines = []
    result = train(_config(tmp_path / "run", checkpoint_every="3"), lines.append)
    saved = [line for line in lines if line.startswith("checkpoint at step")]
    # Counted from each epoch's start (every call a step here): steps 3, 6,
    # 11, 14, 19, 22, on every backend.
    assert [line.split()[3] for line in saved] == ["3", "6", "11", "14", "19", "22"]
    _same_run(result, straight[0], tmp_path / "run", straight[1])


def test_every_due_checkpoint_is_written_with_several_steps_per_call(tmp_path):
    """Issue 61, case 13: with --checkpoint_every=8 --steps_per_execution=8
    the JAX route wrote none in an epoch's first calls (its decision ran in
    Keras's asynchronous callback threads, calls behind the main thread), so
    a kill there restarted the run from step 0.  Every due one is written,
    as on TensorFlow: after each call of 4 steps but the epoch's last."""
    lines = []
    train(_config(tmp_path / "run", train_examples=1024, epochs=2, steps_per_execution=4,
                  checkpoint_every="4"), lines.append)
    saved = [int(line.split()[3]) for line in lines if line.startswith("checkpoint at step")]
    assert saved == [s for s in range(4, 64, 4) if s % 32], lines


def test_a_checkpoint_inside_an_epoch_keeps_its_metric_sums(tmp_path, monkeypatch):
    _signal_at_step(monkeypatch, 3)
    with pytest.raises(Stopped) as stopped:
        train(_config(tmp_path / "run"), quiet)
    state = _latest(str(tmp_path / "run" / "checkpoints"))
    steps_in_epoch = stopped.value.step
    if BACKEND == "jax" and steps_in_epoch == STEPS_PER_EPOCH:
        assert "metrics" not in state  # acted on at the epoch's end: its own checkpoint
        return
    # The loss tracker's (total, count) and the accuracy's: sums over the
    # epoch's steps so far.
    counts = [values[-1] for values in state["metrics"] if len(values) == 2]
    assert counts and all(c in (steps_in_epoch, steps_in_epoch * 32) for c in counts), state
    assert state["epoch"] == 0 and state["history"] == []


@pytest.mark.parametrize("value, expected", [
    ("500", (500, None)), ("90s", (None, 90.0)), ("10m", (None, 600.0)),
    ("1.5h", (None, 5400.0)), ("epoch", (None, None)), (" 10M ", (None, 600.0))])
def test_checkpoint_every_reads_steps_and_times(value, expected):
    assert preemption.parse_checkpoint_every(value) == expected


@pytest.mark.parametrize("value", ["0", "-5", "2.5", "10 minutes", "0m", "", "steps"])
def test_checkpoint_every_refuses_other_values_in_one_line(value):
    with pytest.raises(ValueError, match=r"^checkpoint_every=.* is not valid; expected a "
                                         r"number of steps \(500\), a training time"):
        preemption.parse_checkpoint_every(value)


def test_stop_signal_names_a_signal_other_than_term_and_int():
    assert preemption.signal_number("USR1") == signal.SIGUSR1
    assert preemption.signal_number("SIGUSR2") == signal.SIGUSR2
    with pytest.raises(ValueError, match="SIGTERM always stops a run"):
        preemption.signal_number("TERM")
    with pytest.raises(ValueError, match=r"^stop_signal='KILL' is not valid; expected one of "
                                         r"SIGUSR1"):
        preemption.signal_number("KILL")
    with pytest.raises(ValueError, match="checkpoint_every="):
        _config("x", checkpoint_every="often").validate()
    with pytest.raises(ValueError, match="stop_signal="):
        _config("x", stop_signal="SEGV").validate()


# ------------------------------------------------ the program, as a scheduler meets it
_PROGRAM = ["--model=highway_net", "--depth=3", "--train_examples=256", "--test_examples=64",
            "--batch_size=32", "--seed=1", "--deterministic"]


def _start(model_dir, *extra):
    return subprocess.Popen(
        [sys.executable, "-m", "keras_identity_cli.train", *_PROGRAM,
         f"--model_dir={model_dir}", *extra],
        cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env=dict(os.environ, PYTHONUNBUFFERED="1"))


def _read_until(proc, words, lines):
    """Reads ``proc``'s standard output into ``lines`` until a line holds ``words``."""
    for line in proc.stdout:
        lines.append(line.rstrip("\n"))
        if words in line:
            return
    raise AssertionError(f"{words!r} never printed: {lines[-5:]}")


@default_route
def test_a_scheduler_signal_saves_exits_75_and_the_same_command_resumes(tmp_path):
    """SLURM's --signal=USR1@120 with --stop_signal=USR1: one line, status 75
    (requeue), and the requeued command continues; a log file (stdout not a
    terminal) holds a line per epoch and per checkpoint, no progress bars."""
    model_dir = tmp_path / "run"
    # 20 epochs of 8 steps: the signal comes after the second, long before the end.
    arguments = ("--epochs=20", "--stop_signal=USR1", "--checkpoint_every=5")
    proc, lines = _start(model_dir, *arguments), []
    _read_until(proc, "epoch 2 ", lines)
    proc.send_signal(signal.SIGUSR1)
    out, err = proc.communicate(timeout=120)
    lines += out.splitlines()
    assert proc.returncode == preemption.STOP_STATUS == 75, err[-2000:]
    stopped = [line for line in err.splitlines() if line.startswith("stopped by SIGUSR1")]
    assert len(stopped) == 1 and stopped[0].endswith(
        f"the checkpoint of that step is in {model_dir}/checkpoints; run the same command "
        f"to resume (exit status 75)"), err[-2000:]
    step = int(stopped[0].split(" at step ")[1].split()[0].replace(",", ""))
    assert 16 <= step < 160
    state = _latest(str(model_dir / "checkpoints"))
    assert state["step"] == step
    epochs = [line for line in lines if line.startswith("epoch ")]
    saved = [line for line in lines if line.startswith("checkpoint at step")]
    assert len(lines) <= len(epochs) + len(saved) + 4, lines  # + the run's header lines
    assert not any("\r" in line or "━" in line for line in lines)

    again = subprocess.run(
        [sys.executable, "-m", "keras_identity_cli.train", *_PROGRAM,
         f"--model_dir={model_dir}", *arguments],
        cwd=REPO, capture_output=True, text=True, timeout=300)
    assert again.returncode == 0, again.stderr[-2000:]
    assert f"resuming from the checkpoint at step {step} " in again.stdout
    with open(model_dir / "history.json") as f:
        history = json.load(f)
    assert [row["step"] for row in history] == list(range(8, 161, 8))


@default_route
def test_a_second_signal_exits_at_once():
    """The first signal is answered at the next step; a second one, before
    that, ends the process at once with 128 + its number."""
    script = ("import os, signal, time\n"
              "from keras_identity.training import preemption\n"
              "with preemption.StopSignals('USR1') as signals:\n"
              "    os.kill(os.getpid(), signal.SIGUSR1)\n"
              "    time.sleep(0.5)\n"
              "    print('first:', signals.received, flush=True)\n"
              "    os.kill(os.getpid(), signal.SIGTERM)\n"
              "    time.sleep(5)\n"
              "print('not reached')\n")
    result = subprocess.run([sys.executable, "-c", script], cwd=REPO, capture_output=True,
                            text=True, timeout=120)
    assert result.returncode == 128 + signal.SIGTERM, result.stderr[-2000:]
    assert "first: SIGUSR1" in result.stdout and "not reached" not in result.stdout
    assert "SIGUSR1 received: saving a checkpoint after the step in progress" in result.stderr
    assert ("a second stop signal (SIGTERM): exiting at once, without saving the step in "
            "progress") in result.stderr


def test_a_signal_after_the_last_step_lets_the_run_end(tmp_path, monkeypatch):
    """Training is complete: the run ends as usual (model.keras written), and
    says nothing of a checkpoint to resume from."""
    _signal_at_step(monkeypatch, TOTAL)
    result = train(_config(tmp_path / "run"), quiet)
    assert result["steps"] == TOTAL
    assert (tmp_path / "run" / "model.keras").exists()


@backend_neutral
def test_the_roll_call_waits_again_for_a_process_that_connected_and_left():
    """Process 0 of 3 meets: a probe that is not one of ours, process 1
    connecting and leaving, then processes 1 and 2: everyone goes on."""
    import socket
    import threading

    from keras_identity.training import processes

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    address, results = f"127.0.0.1:{port}", {}

    def meet(process_id):
        try:
            processes.roll_call(address, 3, process_id, 20)
            results[process_id] = "ok"
        except Exception as error:  # reported below
            results[process_id] = repr(error)

    first = threading.Thread(target=meet, args=(0,))
    first.start()
    for _ in range(100):
        try:
            junk = socket.create_connection(("127.0.0.1", port))
            break
        except OSError:
            time.sleep(0.1)
    junk.sendall(b"\xff\xfe GET / HTTP/1.1\r\n")
    junk.close()
    gone = socket.create_connection(("127.0.0.1", port))
    gone.sendall(b"keras_identity roll call 1 3\n")
    time.sleep(0.3)
    gone.close()
    others = [threading.Thread(target=meet, args=(i,)) for i in (1, 2)]
    for thread in others:
        thread.start()
    for thread in [first, *others]:
        thread.join(60)
    assert results == {0: "ok", 1: "ok", 2: "ok"}


def test_checkpoints_inside_epochs_leave_the_reported_history_bit_equal(tmp_path):
    """With several steps per compiled call (JAX's default), a fit resumed
    inside an epoch puts the epoch's metric sums back before its first call,
    so the loss and error sum in an uninterrupted epoch's order."""
    arguments = dict(train_examples=1024, epochs=2, steps_per_execution=4)
    straight = train(_config(tmp_path / "straight", **arguments), quiet)
    lines = []
    result = train(_config(tmp_path / "run", checkpoint_every="3", **arguments), lines.append)
    assert any(line.startswith("checkpoint at step") for line in lines), lines
    for key in ("loss", "train_error", "test_loss", "test_error"):
        assert [r[key] for r in result["history"]] == [r[key] for r in straight["history"]], key


def test_a_step_is_placed_in_its_epoch_the_same_way_when_saved_stopped_and_resumed():
    """P05b: the checkpoint said "(epoch 1)" when saved and "(epoch 0)" when
    resumed; now every line uses preemption.place."""
    assert preemption.place(12, 8) == "inside epoch 2"
    assert preemption.place(16, 8) == "end of epoch 2"
    assert preemption.place(0, 8) == "end of epoch 0"
    stopped = Stopped("SIGTERM", 12, 8, "runs/x/checkpoints")
    assert "at step 12 (inside epoch 2): the checkpoint" in str(stopped)
    assert stopped.epoch == 2

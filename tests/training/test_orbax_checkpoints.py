"""The JAX route's Orbax checkpoints (``keras_identity.training.orbax_checkpoints``):
what a checkpoint holds and restores, that training goes on while it is
written without changing it, a checkpoint killed before its commit or
damaged passed over for the newest readable one, the keep policy, and runs
that resume across formats and backends."""

import json
import os
import re
import shutil

import keras
import numpy as np
import pytest

from keras_identity.training import ConfigError
from keras_identity.training import checkpoints
from keras_identity.training import orbax_checkpoints
from keras_identity.training import train
from tests.backend import jax_only
from tests.training import test_run_files

pytestmark = jax_only


def _config(model_dir, **kwargs):
    """test_run_files' run, with the JAX route's default checkpoints."""
    return test_run_files._config(model_dir, **{"checkpoint_format": None, **kwargs})


def quiet(*_):
    pass


def _model(units=8, seed=0):
    keras.utils.set_random_seed(seed)
    model = keras.Sequential([keras.Input((6,)), keras.layers.Dense(units),
                              keras.layers.BatchNormalization(), keras.layers.Dense(3)])
    model.compile(optimizer=keras.optimizers.SGD(0.1, momentum=0.9),
                  loss="sparse_categorical_crossentropy")
    model.optimizer.build(model.trainable_variables)
    return model


def _batch(seed=1):
    rng = np.random.default_rng(seed)
    return rng.normal(size=(16, 6)).astype("float32"), rng.integers(0, 3, size=16)


def _values(model):
    return [np.array(v.numpy()) for v in model.weights + list(model.optimizer.variables)]


def _assert_equal(a, b):
    assert len(a) == len(b)
    for x, y in zip(a, b):
        np.testing.assert_array_equal(x, y)


def _trained(model, steps=2):
    for _ in range(steps):
        model.train_on_batch(*_batch())
    return model


def test_a_checkpoint_restores_weights_optimizer_and_state_exactly(tmp_path):
    model = _trained(_model())
    saver = orbax_checkpoints.OrbaxCheckpointer(str(tmp_path / "c"), identity={"seed": 1})
    history = [{"epoch": 1, "loss": float("nan")}]
    saver.save(model, step=6, epoch=1, history=history, extra={"metrics": [[1.5, 2.0]]})
    saver.close()
    assert os.listdir(tmp_path / "c") == ["ckpt_000000006"]
    fresh = _model(seed=5)
    reader = orbax_checkpoints.OrbaxCheckpointer(str(tmp_path / "c"), identity={"seed": 1})
    state = reader.restore(fresh)
    _assert_equal(_values(fresh), _values(model))
    assert int(fresh.optimizer.iterations.numpy()) == 2
    assert state["step"] == 6 and state["epoch"] == 1 and state["metrics"] == [[1.5, 2.0]]
    assert state["weights"] == "ckpt_000000006" and state["identity"] == {"seed": 1}
    assert np.isnan(state["history"][0]["loss"])  # NaN stays NaN


@pytest.fixture
def held_write(monkeypatch):
    """Holds every checkpoint's state file back until ``release()``: the
    write stays in flight as long as a test needs."""
    import asyncio
    import threading

    from orbax.checkpoint._src.handlers import json_checkpoint_handler

    gate = threading.Event()
    original = json_checkpoint_handler.JsonCheckpointHandler._save_fn

    async def held(self, x, directory):
        await asyncio.to_thread(gate.wait, 60)
        return await original(self, x, directory)

    monkeypatch.setattr(json_checkpoint_handler.JsonCheckpointHandler, "_save_fn", held)
    return gate.set


def test_training_goes_on_while_a_checkpoint_is_written_and_does_not_change_it(
        tmp_path, held_write):
    """The save returns before the files are written; the steps after it
    (Keras on JAX donates the variables' buffers to the next step) and the
    history's next row leave the checkpoint as things were at the save."""
    model = _trained(_model())
    at_save = _values(model)
    history = [{"epoch": 1, "loss": 1.0}]
    saver = orbax_checkpoints.OrbaxCheckpointer(str(tmp_path / "c"))
    saver.save(model, step=2, epoch=1, history=history)
    assert saver.writing()
    _trained(model, steps=3)
    history.append({"epoch": 2, "loss": 0.5})
    assert saver.writing() and os.listdir(tmp_path / "c") != ["ckpt_000000002"]
    held_write()
    saver.finish()
    assert not saver.writing() and os.listdir(tmp_path / "c") == ["ckpt_000000002"]
    after = _values(model)
    assert not all(np.array_equal(a, b) for a, b in zip(at_save, after))
    fresh = _model(seed=5)
    state = orbax_checkpoints.OrbaxCheckpointer(str(tmp_path / "c")).restore(fresh)
    _assert_equal(_values(fresh), at_save)
    assert state["history"] == [{"epoch": 1, "loss": 1.0}]


def _three(tmp_path, keep=3):
    """Checkpoints of steps 2, 4 and 6 of one model; the values at each."""
    model = _model()
    saver = orbax_checkpoints.OrbaxCheckpointer(str(tmp_path / "c"), keep=keep)
    values = {}
    for step in (2, 4, 6):
        _trained(model, 1)
        values[step] = _values(model)
        saver.save(model, step=step, epoch=step // 2, history=[{"step": step}])
    saver.close()
    return tmp_path / "c", values


def test_a_checkpoint_killed_before_its_commit_is_not_resumed(tmp_path):
    directory, values = _three(tmp_path)
    # Killed mid-write: locally still under Orbax's temporary name (in a
    # bucket, without its commit file: test_bucket_runs).
    os.rename(directory / "ckpt_000000006", directory / "ckpt_000000006.orbax-checkpoint-tmp-1")
    reader = orbax_checkpoints.OrbaxCheckpointer(str(directory))
    fresh = _model(seed=5)
    assert reader.restore(fresh)["step"] == 4
    _assert_equal(_values(fresh), values[4])


@pytest.mark.parametrize("damage", ["state garbled", "state deleted", "arrays garbled",
                                    "arrays deleted"])
def test_a_damaged_checkpoint_is_passed_over_for_the_newest_readable_one_and_kept(
        tmp_path, damage):
    directory, values = _three(tmp_path)
    newest = directory / "ckpt_000000006"
    if damage == "state garbled":
        (newest / "state" / "metadata").write_text('{"step": ')
    elif damage == "state deleted":
        shutil.rmtree(newest / "state")
    else:
        for root, _, names in os.walk(newest / "weights"):
            for name in names:
                if damage == "arrays deleted":
                    os.remove(os.path.join(root, name))
                elif "ocdbt" in root or name == "manifest.ocdbt":
                    with open(os.path.join(root, name), "r+b") as f:
                        f.write(b"\x00" * 64)
    fresh = _model(seed=5)
    reader = orbax_checkpoints.OrbaxCheckpointer(str(directory), keep=1)
    with pytest.warns(UserWarning, match="ckpt_000000006"):
        state = reader.restore(fresh)
    assert state["step"] == 4
    _assert_equal(_values(fresh), values[4])
    # The unreadable checkpoint is set aside, not deleted nor written over.
    assert (directory / "ckpt_000000006.unread").is_dir()
    reader.save(fresh, step=6, epoch=3, history=[])
    reader.close()
    # keep=1: the run's own step 4 (restored) made room for its step 6; the
    # run it continues is the whole folder's, so step 2 went too.
    assert sorted(os.listdir(directory)) == ["ckpt_000000006", "ckpt_000000006.unread"]


def test_the_keep_policy_removes_only_the_runs_own_checkpoints(tmp_path):
    directory = tmp_path / "c"
    model = _model()
    # Another run's checkpoint (other flags), older, and an unreadable one.
    other = orbax_checkpoints.OrbaxCheckpointer(str(directory), identity={"seed": 2})
    other.save(model, step=1, epoch=1, history=[])
    other.close()
    mine = orbax_checkpoints.OrbaxCheckpointer(str(directory), keep=1, identity={"seed": 1})
    for step in (2, 3):
        mine.save(model, step=step, epoch=step, history=[])
    mine.close()
    shutil.copytree(directory / "ckpt_000000003", directory / "ckpt_000000000")
    (directory / "ckpt_000000000" / "state" / "metadata").write_text("{")
    assert sorted(os.listdir(directory)) == ["ckpt_000000000", "ckpt_000000001",
                                             "ckpt_000000003"]
    resumed = orbax_checkpoints.OrbaxCheckpointer(str(directory), keep=1, identity={"seed": 1})
    assert resumed.restore(model)["step"] == 3
    for step in (4, 5):
        resumed.save(model, step=step, epoch=step, history=[])
    resumed.close()
    assert sorted(os.listdir(directory)) == ["ckpt_000000000", "ckpt_000000001",
                                             "ckpt_000000005"]


def test_a_checkpoint_that_does_not_hold_the_models_variables_is_not_loaded(tmp_path):
    saver = orbax_checkpoints.OrbaxCheckpointer(str(tmp_path / "c"))
    saver.save(_model(units=8), step=1, epoch=1, history=[])
    saver.close()
    with pytest.raises(checkpoints.CheckpointError,
                       match=r"can be read: ckpt_000000001 \(ValueError: .*shape"):
        orbax_checkpoints.OrbaxCheckpointer(str(tmp_path / "c")).restore(_model(units=4))


def test_state_of_other_flags_is_never_restored(tmp_path):
    saver = orbax_checkpoints.OrbaxCheckpointer(str(tmp_path / "c"), identity={"seed": 1})
    saver.save(_model(), step=1, epoch=1, history=[])
    saver.close()
    other = orbax_checkpoints.OrbaxCheckpointer(str(tmp_path / "c"), identity={"seed": 2})
    with pytest.raises(checkpoints.CheckpointError, match="trained with other flags"):
        other.restore(_model())


# --- runs ---------------------------------------------------------------------


def test_a_jax_run_writes_orbax_checkpoints_and_resumes_as_if_uninterrupted(tmp_path):
    first = train(_config(tmp_path / "run", epochs=2), quiet)
    assert sorted(os.listdir(tmp_path / "run" / "checkpoints")) == [
        "ckpt_000000004", "ckpt_000000008"]
    lines = []
    resumed = train(_config(tmp_path / "run", epochs=3), lines.append)
    straight = train(_config(tmp_path / "straight", epochs=3), quiet)
    assert any(line.startswith("resuming from the checkpoint at step 8") for line in lines)
    assert [r["loss"] for r in resumed["history"]] == [r["loss"] for r in straight["history"]]
    assert [r["loss"] for r in first["history"]] == [r["loss"] for r in straight["history"][:2]]
    assert sorted(os.listdir(tmp_path / "run" / "checkpoints")) == [
        "ckpt_000000008", "ckpt_000000012"]


def test_an_hdf5_run_continues_as_orbax_and_its_old_checkpoints_go_in_turn(tmp_path):
    train(_config(tmp_path / "run", epochs=2, checkpoint_format="h5"), quiet)
    lines = []
    resumed = train(_config(tmp_path / "run", epochs=4), lines.append)
    straight = train(_config(tmp_path / "straight", epochs=4), quiet)
    assert any(line.startswith("resuming from the checkpoint at step 8") for line in lines)
    np.testing.assert_allclose([r["loss"] for r in resumed["history"]],
                               [r["loss"] for r in straight["history"]], rtol=1e-6)
    # Its own HDF5 checkpoints (and their index) made room for the new ones.
    assert sorted(os.listdir(tmp_path / "run" / "checkpoints")) == [
        "ckpt_000000012", "ckpt_000000016"]


def test_an_orbax_run_is_refused_in_one_line_by_an_hdf5_checkpointer(tmp_path):
    train(_config(tmp_path / "run", epochs=1), quiet)
    with pytest.raises(ConfigError) as error:
        train(_config(tmp_path / "run", epochs=2, checkpoint_format="h5"), quiet)
    message = str(error.value)
    assert "\n" not in message
    assert "holds Orbax checkpoints (the newest: ckpt_000000004)" in message
    assert os.listdir(tmp_path / "run" / "checkpoints") == ["ckpt_000000004"]


def test_changed_flags_are_refused_from_the_checkpoints_own_record(tmp_path):
    train(_config(tmp_path / "run", epochs=1), quiet)
    os.remove(tmp_path / "run" / "run.json")
    with pytest.raises(ConfigError, match=r"learning_rate: 0.05 != 0.02"):
        with pytest.warns(UserWarning, match="compared with the record in its checkpoint"):
            train(_config(tmp_path / "run", epochs=2, learning_rate=0.02), quiet)
    assert os.listdir(tmp_path / "run" / "checkpoints") == ["ckpt_000000004"]
    state = json.loads((tmp_path / "run" / "checkpoints" / "ckpt_000000004" / "state"
                        / "metadata").read_text())
    assert state["identity"]["learning_rate"] == 0.05


def test_too_little_space_is_one_line_before_the_write_and_the_one_before_is_intact(
        tmp_path, monkeypatch):
    from keras_identity import storage

    saver = orbax_checkpoints.OrbaxCheckpointer(str(tmp_path / "c"))
    model = _model()
    saver.save(model, step=1, epoch=1, history=[])
    saver.finish()
    usage = shutil.disk_usage(str(tmp_path))
    monkeypatch.setattr(storage.shutil, "disk_usage", lambda path: usage._replace(free=1024))
    with pytest.raises(checkpoints.WriteError) as error:
        saver.save(model, step=2, epoch=2, history=[])
    message = str(error.value)
    assert "\n" not in message and message.startswith(
        f"cannot write the checkpoint of step 2 into {tmp_path / 'c'} (No space left on device")
    assert "the checkpoint of step 1 is intact: free space" in message
    saver.close()
    assert os.listdir(tmp_path / "c") == ["ckpt_000000001"]


def test_the_docs_read_a_runs_newest_checkpoint_with_orbax_alone(tmp_path):
    """docs/training.md's example: Orbax's own CheckpointManager lists the
    run's steps and restores arrays equal to model.keras's."""
    from keras_identity.models import load_model
    from tests.conftest import REPO

    result = train(_config(tmp_path / "run", epochs=2), quiet)
    text = open(os.path.join(REPO, "docs", "training.md")).read()
    example = text.split("**Reading a checkpoint with Orbax alone.**")[1]
    code = example.split("```python\n")[1].split("```")[0]
    found = {}
    exec(code.replace("runs/RUN", str(tmp_path / "run")), found)
    assert found["manager"].all_steps() == [4, 8] and found["epoch"] == 2
    model = load_model(result["model_path"])
    _assert_equal([np.asarray(a) for a in found["arrays"]], [w.numpy() for w in model.weights])
    assert len(found["checkpoint"]["weights"]["optimizer"]) == len(model.optimizer.variables)


@pytest.mark.parametrize("name", ["run[1]", "a[b]c"])
def test_a_bracketed_path_is_refused_before_the_first_step(tmp_path, name):
    """Orbax's file layer takes "[1]" for a glob pattern: its checkpoint
    there commits no arrays and never resumes (a disk or a bucket alike), so
    the run is refused before it writes anything; HDF5 keeps such paths."""
    with pytest.raises(ConfigError, match=rf"'{re.escape(str(tmp_path / name))}/checkpoints': "
                                          r"Orbax checkpoints .* bracketed part .*; give a "
                                          r"--model_dir without brackets, or "
                                          r"--checkpoint_format=h5$"):
        train(_config(tmp_path / name, epochs=1), quiet)
    assert not (tmp_path / name / "checkpoints").exists()
    assert train(_config(tmp_path / name, epochs=1, checkpoint_format="h5"),
                 quiet)["steps"] == 4
    assert train(_config(tmp_path / "lone[", epochs=1), quiet)["steps"] == 4


_LATE_CALLBACK = r"""
import asyncio, sys, time
import tensorstore as ts
from keras_identity.training import orbax_checkpoints
orbax_checkpoints._quiet_late_callbacks()

# A TensorStore future awaited in a loop that is closed before it completes
# (as Orbax's reads and writes are when a store fails): its callback meets
# the closed loop.
promise, future = ts.Promise.new()

async def wait_briefly():
    asyncio.ensure_future(future)
    await asyncio.sleep(0.01)

loop = asyncio.new_event_loop()
loop.run_until_complete(wait_briefly())
loop.close()
promise.set_result(1)
time.sleep(0.2)

class Broken:   # any other unraisable error is still printed
    def __del__(self):
        raise ValueError("a real error")

broken = Broken()
del broken
print("done")
"""


def test_late_tensorstore_callbacks_print_no_event_loop_is_closed_tracebacks():
    import subprocess
    import sys

    from tests.conftest import REPO

    result = subprocess.run([sys.executable, "-c", _LATE_CALLBACK], cwd=REPO,
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0 and result.stdout.strip() == "done", result.stderr[-3000:]
    assert "Event loop is closed" not in result.stderr, result.stderr[-3000:]
    assert "ValueError: a real error" in result.stderr, result.stderr[-3000:]
    assert result.stderr.count("Traceback") == 1, result.stderr[-3000:]


_ORPHANED_TASK = r"""
import asyncio, gc, logging
import tensorstore as ts
from absl import logging as absl_logging
from keras_identity.training import orbax_checkpoints
absl_logging.use_absl_handler()  # as a program's app.run() does
orbax_checkpoints._quiet_errors()

# A read of a checkpoint that is not there, in a task nothing awaits (as
# Orbax's when a checkpoint is passed over), then a task of other code.
async def orphan(awaitable):
    task = asyncio.ensure_future(awaitable)
    await asyncio.sleep(0.3)
    del task

async def other():
    raise ValueError("another task's error")

missing = ts.open({"driver": "zarr", "kvstore": {"driver": "memory"}, "path": "nothing/"},
                  open=True)
asyncio.run(orphan(missing))
asyncio.run(orphan(other()))
gc.collect()
print("done")
"""


def test_a_tensorstore_read_left_behind_logs_no_traceback():
    """asyncio's "Task exception was never retrieved" for TensorStore's error
    (Orbax's read of a checkpoint passed over, logged whenever the task is
    collected) is dropped; another task's is still logged."""
    import subprocess
    import sys

    from tests.conftest import REPO

    result = subprocess.run([sys.executable, "-c", _ORPHANED_TASK], cwd=REPO,
                            capture_output=True, text=True, timeout=120, check=False)
    assert result.returncode == 0 and result.stdout.strip() == "done", result.stderr[-3000:]
    assert "tensorstore_spec" not in result.stderr, result.stderr[-3000:]
    assert result.stderr.count("Task exception was never retrieved") == 1, result.stderr[-3000:]
    assert "ValueError: another task's error" in result.stderr, result.stderr[-3000:]


@pytest.mark.parametrize("locked", [True, False])
def test_temporary_folders_of_steps_passed_are_removed_by_the_lock_holder(tmp_path, locked):
    from keras_identity.training import run_lock

    # Writes killed before their commit (a SIGKILL during Orbax's background
    # write) left Orbax's temporary folders of steps 3 and 9 in the run's
    # checkpoint folder; the resumed run writes step 4.
    directory = tmp_path / "c"
    for step in (3, 9):
        leftover = directory / f"ckpt_00000000{step}.orbax-checkpoint-tmp" / "weights"
        leftover.mkdir(parents=True)
        (leftover / "d").write_bytes(b"partial")
    lock = run_lock.RunLock(str(tmp_path)).acquire() if locked else None
    try:
        saver = orbax_checkpoints.OrbaxCheckpointer(str(directory))
        saver.save(_trained(_model(), 1), step=4, epoch=1, history=[])
        saver.close()
    finally:
        if lock is not None:
            lock.release()
    # Step 3's is gone (the run passed it; no write will finish it), step 9's
    # stays (not passed); without the run's lock, nothing is removed.
    assert sorted(os.listdir(directory)) == (
        ["ckpt_000000004", "ckpt_000000009.orbax-checkpoint-tmp"] if locked else
        ["ckpt_000000003.orbax-checkpoint-tmp", "ckpt_000000004",
         "ckpt_000000009.orbax-checkpoint-tmp"])


def test_a_run_killed_during_a_background_write_resumes_as_if_uninterrupted(tmp_path):
    # SIGKILL while Orbax writes a checkpoint's arrays in the background (its
    # temporary folder present), then the same command: the run resumes from
    # the checkpoint before, ends with the uninterrupted run's history, and
    # leaves no temporary folder once it has passed that step.
    import signal
    import subprocess
    import sys
    import time

    from tests.conftest import REPO

    def command(model_dir):
        return [sys.executable, "-m", "keras_identity_cli.train", "--model=highway_net",
                "--depth=30", "--batch_size=64", "--steps_per_epoch=10",
                "--train_examples=1280", "--test_examples=96", "--verbose=0", "--seed=3",
                "--steps_per_execution=1", "--train_steps=20", "--checkpoint_every=2",
                f"--model_dir={model_dir}"]

    env = dict(os.environ, KERAS_BACKEND="jax")
    straight = tmp_path / "straight"
    done = subprocess.run(command(straight), cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    killed = tmp_path / "killed"
    folder = killed / "checkpoints"
    proc = subprocess.Popen(command(killed), cwd=REPO, env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    caught = None
    try:
        deadline = time.monotonic() + 300
        while caught is None and proc.poll() is None and time.monotonic() < deadline:
            try:
                names = os.listdir(folder)
            except OSError:
                names = []
            writing = [n for n in names if ".orbax-checkpoint-tmp" in n]
            if writing and any(n.startswith("ckpt_") and "tmp" not in n for n in names):
                proc.send_signal(signal.SIGSTOP)   # a write in flight, one committed before
                if any(".orbax-checkpoint-tmp" in n for n in os.listdir(folder)):
                    proc.send_signal(signal.SIGKILL)   # still in flight once stopped
                    caught = writing[0]
                    continue
                proc.send_signal(signal.SIGCONT)   # it committed in between: look again
            time.sleep(0.001)
    finally:
        proc.kill()
        proc.wait()
    assert caught is not None, "no background write was seen in flight"
    assert any(".orbax-checkpoint-tmp" in n for n in os.listdir(folder))
    resumed = subprocess.run(command(killed), cwd=REPO, env=env, capture_output=True,
                             text=True, timeout=600)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "resuming from the checkpoint at step" in resumed.stdout
    assert "Traceback" not in resumed.stderr
    history = [json.loads((run / "history.json").read_text()) for run in (straight, killed)]
    assert [[row["loss"], row["test_loss"]] for row in history[1]] == \
        [[row["loss"], row["test_loss"]] for row in history[0]]
    assert not [n for n in os.listdir(folder) if ".orbax-checkpoint-tmp" in n], \
        os.listdir(folder)

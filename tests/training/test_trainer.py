import dataclasses
import json
import os

import keras
import numpy as np
import pytest

import keras_identity as ki
from keras_identity.training import ConfigError
from keras_identity.training import TrainConfig
from keras_identity.training import TrainingDiverged
from keras_identity.training import train
from keras_identity.training import trainer
from tests.training.test_run_files import _small  # a run small enough to resume


def quiet(*_):
    pass


@pytest.fixture
def mnist_npz(shared_dir):
    return os.path.join(shared_dir, "data", "mnist.npz")


@pytest.fixture
def cifar_like(tmp_path, rng):
    path = tmp_path / "cifar-like.npz"
    np.savez(path, x_train=rng.integers(0, 256, (256, 32, 32, 3), dtype=np.uint8),
             y_train=rng.integers(0, 10, 256), x_test=rng.integers(0, 256, (64, 32, 32, 3),
                                                                    dtype=np.uint8),
             y_test=rng.integers(0, 10, 64))
    return str(path)


@pytest.mark.core_leg
def test_short_real_mnist_run_is_well_above_chance(tmp_path, mnist_npz):
    config = TrainConfig(model="highway_net", depth=10, data_dir=mnist_npz,
                         train_examples=12_000, test_examples=2_000, epochs=2, verbose=0,
                         model_dir=str(tmp_path / "run"))
    result = train(config, print_fn=quiet)
    assert result["test_error"] < 0.15  # chance is 0.90
    assert result["steps"] == 2 * (12_000 // 128)
    run = tmp_path / "run"
    for name in ("history.csv", "history.json", "curves.png", "model.keras", "config.json",
                 "preprocessing.json"):
        assert (run / name).exists(), name
    orbax = config.resolved_checkpoint_format == "orbax"
    assert sorted(os.listdir(run / "checkpoints")) == (
        ["ckpt_000000093", "ckpt_000000186"] if orbax else
        ["ckpt-000000093.state.json", "ckpt-000000093.weights.h5", "ckpt-000000186.state.json",
         "ckpt-000000186.weights.h5", "state.json"])
    assert os.listdir(run / "tensorboard")
    history = json.loads((run / "history.json").read_text())
    assert [row["epoch"] for row in history] == [1, 2]
    assert history[-1]["images_per_sec"] > 0
    # The saved model includes its preprocessing: on raw pixels it reproduces
    # the reported test error.
    prep = ki.data.load_preprocessing(str(run / "preprocessing.json"))
    data = ki.data.load_dataset("mnist", mnist_npz).subset(12_000, 2_000, seed=0)
    model = keras.models.load_model(run / "model.keras")
    assert model.get_layer("preprocessing").mode == prep["normalization"].mode == "scale"
    probs = model.predict(data.x_test, verbose=0)
    error = np.mean(probs.argmax(axis=1) != data.y_test)
    assert error == pytest.approx(result["test_error"], abs=1e-6)
    assert prep["class_names"] == [str(i) for i in range(10)]


def test_repeatable_and_resume_is_exact(tmp_path):
    base = dict(model="highway_net", depth=4, train_examples=1_000, test_examples=200,
                steps_per_epoch=5, batch_size=50, deterministic=True, seed=3, verbose=0)
    straight = train(TrainConfig(epochs=4, model_dir=str(tmp_path / "a"), **base), quiet)
    train(TrainConfig(epochs=2, model_dir=str(tmp_path / "b"), **base), quiet)
    lines = []
    resumed = train(TrainConfig(epochs=4, model_dir=str(tmp_path / "b"), **base), lines.append)
    assert any("resuming from the checkpoint at step 10 (end of epoch 2)" in l for l in lines)
    assert [r["loss"] for r in resumed["history"]] == [r["loss"] for r in straight["history"]]
    a = keras.models.load_model(straight["model_path"]).get_weights()
    b = keras.models.load_model(resumed["model_path"]).get_weights()
    assert all(np.array_equal(x, y) for x, y in zip(a, b))


def test_stop_at_step_keeps_the_schedule_and_resumes_exactly(tmp_path):
    # A stepwise recipe (lr /10 at 50% and 75% of the run): stopping at step 10
    # of 20 must keep the drops at 10 and 15, not move them to 5 and 8.
    base = dict(model="highway_net", depth=4, recipe="highway_mnist_conv", epochs=4,
                train_examples=1_000, test_examples=200, steps_per_epoch=5, batch_size=50,
                deterministic=True, seed=3, verbose=0)
    straight = train(TrainConfig(model_dir=str(tmp_path / "a"), **base), quiet)
    lines = []
    first = train(TrainConfig(stop_at_step=10, model_dir=str(tmp_path / "b"), **base),
                  lines.append)
    assert first["steps"] == 10
    assert any("stopping at step 10 of 20" in l for l in lines)
    rates = [r["learning_rate"] for r in straight["history"]]
    assert rates[0] == rates[1] > rates[2] > rates[3]
    assert [r["learning_rate"] for r in first["history"]] == rates[:2]
    again = []
    train(TrainConfig(stop_at_step=10, model_dir=str(tmp_path / "b"), **base), again.append)
    assert any("already at step 10" in l for l in again)
    resumed = train(TrainConfig(model_dir=str(tmp_path / "b"), **base), quiet)
    assert [r["loss"] for r in resumed["history"]] == [r["loss"] for r in straight["history"]]
    a = keras.models.load_model(straight["model_path"]).get_weights()
    b = keras.models.load_model(resumed["model_path"]).get_weights()
    assert all(np.array_equal(x, y) for x, y in zip(a, b))
    with pytest.raises(ConfigError, match=r"stop_at_step=7 is not valid; expected a multiple "
                                          r"of the epoch \(5 steps"):
        train(TrainConfig(stop_at_step=7, model_dir=str(tmp_path / "c"), **base), quiet)


def test_divergence_names_the_step(tmp_path):
    # (At 1e4 the loss saturates at a large finite value on JAX, whose Keras
    # cross-entropy clips the probabilities; 1e30 overflows the weights.)
    config = TrainConfig(model="plain_net", depth=6, learning_rate=1e30, train_examples=2_000,
                         test_examples=100, epochs=1, verbose=0, model_dir=str(tmp_path))
    with pytest.raises(TrainingDiverged, match=r"became nan at step \d+ \(epoch 1\)"):
        train(config, quiet)


def test_mixed_bfloat16_xla_step_as_on_a_tpu(tmp_path, cifar_like, monkeypatch):
    # On a CPU without bfloat16 instructions (Cascade Lake's flags) the run says so.
    from keras_identity import _cpu_kernels

    monkeypatch.setattr(_cpu_kernels, "_x86", lambda: True)
    monkeypatch.setattr(_cpu_kernels, "cpu_flags", lambda: frozenset(
        {"avx2", "avx512f", "avx512bw", "avx512vl", "avx512dq", "avx512_vnni"}))
    lines = []
    config = TrainConfig(model="preact_resnet", depth=11, model_kwargs=dict(
                         shortcut="exclusive_gating", gate_bias_init=-2.0), dataset="cifar10", data_dir=cifar_like,
                         precision="mixed_bfloat16", jit_compile=True, train_steps=2,
                         batch_size=16, verbose=0, model_dir=str(tmp_path))
    result = train(config, lines.append)
    assert result["steps"] == 2 and np.isfinite(result["loss"])
    assert result["jit_compile"] is True
    assert sum(line.startswith("note: --precision=mixed_bfloat16 on a CPU without bfloat16 "
                               "instructions (this CPU has neither AVX512_BF16 nor AMX)")
               for line in lines) == 1, lines
    model = keras.models.load_model(result["model_path"])
    unit = model.get_layer("stage2_unit1")
    assert unit.compute_dtype == "bfloat16" and unit.gate.compute_dtype == "float32"
    assert model.output.dtype == "float32"


def test_cifar_recipe_applies_augmentation_and_per_pixel_mean(tmp_path, cifar_like):
    config = TrainConfig(model="resnet", depth=8, dataset="cifar10", data_dir=cifar_like,
                         train_steps=1, batch_size=32, verbose=0, model_dir=str(tmp_path))
    train(config, quiet)
    prep = ki.data.load_preprocessing(str(tmp_path / "preprocessing.json"))
    assert prep["normalization"].mode == "per_pixel_mean"
    assert np.asarray(prep["normalization"].mean).shape == (32, 32, 3)
    saved = json.loads((tmp_path / "config.json").read_text())
    assert saved["model"] == "resnet" and saved["depth"] == 8


def test_missing_data_is_a_config_error(tmp_path):
    config = TrainConfig(model="resnet", depth=8, dataset="cifar10", data_dir="/no/data",
                         model_dir=str(tmp_path))
    with pytest.raises(ConfigError, match="does not exist"):
        train(config, quiet)


# --- a changed input never silently resumes a run (issue 20: 1, 3, 6, 8) ------

def test_a_run_may_only_grow(tmp_path):
    train(_small(tmp_path, epochs=2), quiet)
    lines = []
    result = train(_small(tmp_path, epochs=3), lines.append)
    assert any("length changes from 8 to 12 steps" in l for l in lines)
    assert result["steps"] == 12
    with pytest.raises(ConfigError, match=r"at step 12; this length \(8 steps\) ends before"):
        train(_small(tmp_path, epochs=2), quiet)


def test_a_run_grown_from_inside_an_epoch_stops_at_its_length(tmp_path):
    # 6 steps (an epoch of 4 and a half), then 12. On JAX a call runs several
    # steps; resumed from step 6 it must run 2 (not the epoch's 4), or it would
    # stop at 14 and the run could not be resumed at its own length.
    train(_small(tmp_path, epochs=None, train_steps=6), quiet)
    lines = []
    result = train(_small(tmp_path, epochs=None, train_steps=12), lines.append)
    assert result["steps"] == 12
    assert any("resuming from the checkpoint at step 6" in line for line in lines)


def test_global_batch_larger_than_the_training_set_is_refused(tmp_path):
    with pytest.raises(ConfigError, match=r"batch_size=100000 is not valid: the training set "
                                          r"has 256 images"):
        train(_small(tmp_path, batch_size=100_000), quiet)
    assert not (tmp_path / "run").exists()


def test_unwritable_model_dir_is_one_line(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    with pytest.raises(ConfigError, match=r"model_dir=.*file/run.* is not a writable directory"):
        train(_small(tmp_path, model_dir=str(blocker / "run")), quiet)


def test_truncated_latest_checkpoint_falls_back_to_the_previous(tmp_path):
    """HDF5 checkpoints (JAX's Orbax ones: test_orbax_checkpoints)."""
    train(_small(tmp_path, epochs=2, keep_checkpoints=2, checkpoint_format="h5"), quiet)
    directory = tmp_path / "run" / "checkpoints"
    newest = sorted(directory.glob("ckpt-*.weights.h5"))[-1]
    newest.write_bytes(newest.read_bytes()[:1000])
    lines = []
    with pytest.warns(UserWarning, match=rf"skipped unreadable checkpoint\(s\) {newest.name}"):
        result = train(_small(tmp_path, epochs=3, keep_checkpoints=2, checkpoint_format="h5"),
                       lines.append)
    assert any("resuming from the checkpoint at step 4" in l for l in lines)
    assert result["steps"] == 12
    # A corrupt state.json names the file (and the checkpoints' own states are used).
    (directory / "state.json").write_text("{not json")
    with pytest.warns(UserWarning, match="state.json is not readable"):
        train(_small(tmp_path, epochs=3, keep_checkpoints=2, checkpoint_format="h5"), quiet)
    for state in directory.glob("*.json"):
        state.write_text("{")
    with pytest.raises(ConfigError, match=r"state.json is not readable .* no checkpoint"):
        train(_small(tmp_path, epochs=3, keep_checkpoints=2, checkpoint_format="h5"), quiet)


def test_lr_decay_sets_the_exponential_schedule_and_the_run_identity(tmp_path, mnist_npz):
    config = TrainConfig(model="highway_net", depth=3, data_dir=mnist_npz, train_examples=512,
                         test_examples=128, epochs=2, lr_decay=0.5, verbose=0,
                         model_dir=str(tmp_path / "run"))
    result = train(config, print_fn=quiet)
    rates = [row["learning_rate"] for row in result["history"]]
    # The rate decays continuously by 0.5 per epoch of 4 steps from the
    # recipe's 0.1 (logged at each epoch's last step, step 3 and 7).
    assert rates == pytest.approx([0.1 * 0.5 ** 0.75, 0.1 * 0.5 ** 1.75])
    identity = json.loads((tmp_path / "run" / "run.json").read_text())["identity"]
    assert identity["lr_decay"] == 0.5
    # Without the flag the identity records lr_decay None.
    plain = dataclasses.replace(config, lr_decay=None)
    prepared = trainer.prepare(dataclasses.replace(plain, model_dir=str(tmp_path / "b")))
    prepared.lock.release()
    assert prepared.identity["lr_decay"] is None
    with pytest.raises(ConfigError, match=r"lr_decay: 0.5 != None"):
        trainer.prepare(plain)
    with pytest.raises(ConfigError, match=r"lr_decay: 0.5 != 0.8"):
        train(dataclasses.replace(config, lr_decay=0.8), print_fn=quiet)


# --- hardening, round three (issue 31: 3, 4, 6) ----------------------------------

_HOLD_LOCK = """
import importlib.util, sys, time
spec = importlib.util.spec_from_file_location("run_lock", sys.argv[1])
module = importlib.util.module_from_spec(spec)
spec.loader.exec_module(module)
lock = module.RunLock(sys.argv[2]).acquire()
print("locked", flush=True)
time.sleep(600)
"""


def test_a_second_training_in_one_model_dir_is_refused_and_a_killed_one_leaves_no_lock(
        tmp_path):
    import subprocess
    import sys

    from keras_identity.training import run_lock

    config = _small(tmp_path)
    os.makedirs(config.model_dir)
    holder = subprocess.Popen([sys.executable, "-c", _HOLD_LOCK, run_lock.__file__,
                               config.model_dir], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "locked"
        with pytest.raises(ConfigError) as error:
            train(config, quiet)
        message = str(error.value)
        assert f"model_dir={config.model_dir!r} is in use by another training (pid " \
               f"{holder.pid} on " in message and "\n" not in message
        assert not os.path.exists(os.path.join(config.model_dir, "run.json"))
    finally:
        holder.kill()  # as kill -9: the kernel drops its lock
        holder.wait()
    assert train(config, quiet)["steps"] == 4
    assert train(_small(tmp_path, epochs=2), quiet)["steps"] == 8  # released after each run


# --- hardening (issue 61: 3): a lock lost mid-run stops the run ---------------


def _losing_the_lock_at(epoch_line, lock_path, then=None):
    """A print_fn that deletes ``lock_path`` when the run prints
    ``epoch_line`` (an epoch's summary, printed before that epoch's
    checkpoint is written), then calls ``then``."""
    def print_fn(line):
        if line.startswith(epoch_line) and os.path.exists(lock_path):
            os.remove(lock_path)
            if then is not None:
                then()
    return print_fn


def test_a_run_whose_lock_is_deleted_stops_before_its_next_checkpoint(tmp_path):
    from keras_identity.training import Stopped
    from keras_identity.training import run_lock
    from tests.training.test_preemption import _latest

    config = _small(tmp_path, epochs=3)
    lock_path = os.path.join(config.model_dir, ".lock")
    with pytest.raises(Stopped) as lost:
        train(config, _losing_the_lock_at("epoch 2 ", lock_path))
    message = str(lost.value)
    assert isinstance(lost.value, run_lock.LockLost) and "\n" not in message
    assert message == (
        f"the lock {lock_path} was deleted while this run held it: this run stopped at step 8 "
        f"without writing its checkpoint (another training may be writing "
        f"{config.model_dir}); make sure no other training writes there, then run the same "
        f"command to resume")
    assert (lost.value.step, lost.value.epoch, lost.value.saved) == (8, 2, False)
    assert _latest(os.path.join(config.model_dir, "checkpoints"))["step"] == 4
    history = json.loads((tmp_path / "run" / "history.json").read_text())
    assert [row["step"] for row in history] == [4]     # epoch 2's files were not written
    # The same command resumes from the last checkpoint and holds a new lock.
    assert train(config, quiet)["steps"] == 12


def test_a_run_whose_lock_is_taken_by_a_second_run_stops_before_its_next_checkpoint(
        tmp_path):
    import re

    from keras_identity.training import Stopped
    from keras_identity.training import run_lock
    from tests.training.test_preemption import _latest

    config = _small(tmp_path, epochs=3)
    lock_path = os.path.join(config.model_dir, ".lock")
    second = run_lock.RunLock(config.model_dir)
    try:
        with pytest.raises(Stopped, match=(
                rf"^the lock {re.escape(lock_path)} was replaced \(deleted while this run held "
                rf"it\) and is now held by pid {os.getpid()} on .*: this run stopped at step 4 "
                rf"without writing")):
            train(config, _losing_the_lock_at("epoch 1 ", lock_path, second.acquire))
        assert _latest(os.path.join(config.model_dir, "checkpoints")) is None
        with pytest.raises(ConfigError, match="is in use by another training"):
            train(config, quiet)   # the second holder still holds it
    finally:
        second.release()


def test_a_lost_lock_ends_the_program_in_one_line_with_status_75(tmp_path):
    import subprocess
    import sys

    from tests.programs import stop_by_taking_the_lock

    model_dir = tmp_path / "run"
    env = dict(os.environ, PYTHONUNBUFFERED="1", KERAS_BACKEND=keras.backend.backend())
    proc = subprocess.Popen(
        [sys.executable, "-m", "keras_identity_cli.train", "--model=highway_net", "--depth=3",
         "--batch_size=64", "--train_examples=256", "--test_examples=64", "--verbose=0",
         "--train_steps=80", f"--model_dir={model_dir}"], env=env, stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True)
    stop_by_taking_the_lock(proc, f"{model_dir}/.lock", os.remove)
    assert not (model_dir / "model.keras").exists()


def test_an_empty_test_set_is_refused_before_training(tmp_path):
    path = tmp_path / "empty-test.npz"
    rng = np.random.default_rng(0)
    np.savez(path, x_train=rng.integers(0, 256, (64, 28, 28), dtype=np.uint8),
             y_train=rng.integers(0, 10, 64), x_test=np.zeros((0, 28, 28), np.uint8),
             y_test=np.zeros((0,), np.int64))
    with pytest.raises(ConfigError, match=r"the test set of mnist has no images"):
        train(_small(tmp_path, data_dir=str(path), train_examples=None, test_examples=None),
              quiet)
    assert not os.path.exists(tmp_path / "run" / "history.json")


def test_a_full_disk_is_one_line_and_keeps_the_previous_checkpoint(tmp_path, monkeypatch):
    import errno

    from keras_identity import storage
    from keras_identity.training import WriteError

    # HDF5 checkpoints (JAX's Orbax ones: test_orbax_checkpoints).
    train(_small(tmp_path, epochs=1, checkpoint_format="h5"), quiet)
    checkpoint_dir = tmp_path / "run" / "checkpoints"
    before = sorted(os.listdir(checkpoint_dir))
    # Too little space: refused before HDF5 touches the disk.
    usage = storage.shutil.disk_usage(str(checkpoint_dir))
    monkeypatch.setattr(storage.shutil, "disk_usage",
                        lambda path: usage._replace(free=300 * 1024))
    with pytest.raises(WriteError) as error:
        train(_small(tmp_path, epochs=2, checkpoint_format="h5"), quiet)
    message = str(error.value)
    assert (f"cannot write the checkpoint of step 8 into {checkpoint_dir}" in message
            and "No space left on device" in message and "step 4 is intact" in message)
    assert sorted(os.listdir(checkpoint_dir)) == before
    monkeypatch.undo()

    # The disk fills up while the weights are written: no partial file stays
    # behind (a real disk: tests/training/test_run_files.py).
    replace = os.replace

    def full(source, target):
        if target.endswith(".weights.h5"):
            raise OSError(errno.ENOSPC, "No space left on device")
        replace(source, target)

    monkeypatch.setattr(storage.os, "replace", full)
    with pytest.raises(WriteError, match="step 4 is intact"):
        train(_small(tmp_path, epochs=2, checkpoint_format="h5"), quiet)
    assert sorted(os.listdir(checkpoint_dir)) == before
    monkeypatch.undo()
    lines = []
    assert train(_small(tmp_path, epochs=2, checkpoint_format="h5"), lines.append)["steps"] == 8
    assert any("resuming from the checkpoint at step 4" in l for l in lines)


@pytest.mark.parametrize("latest, said", [
    (None, "no checkpoint was written: free space and run the same command"),
    (4, "the checkpoint of step 4 is intact: free space and run the same command to resume"),
    # A store that does not answer now: its checkpoints are not said to be none.
    (OSError, "the checkpoints written before are intact (they cannot be listed now): free "
              "space and run the same command to resume")])
def test_a_failed_write_with_no_checkpoint_yet_says_none_was_written(monkeypatch, latest, said):
    import errno
    import types

    from keras_identity.training import WriteError
    from keras_identity.training import checkpoints

    def full(*_, **__):  # the disk fills during the first checkpoint's write
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(trainer.fit_loop, "fit_resumable", full)
    def newest():
        if latest is OSError:
            raise OSError("the store cannot be reached")
        return None if latest is None else {"step": latest}

    checkpointer = types.SimpleNamespace(directory="run/checkpoints", latest=newest)
    checkpointer.intact_step = lambda: checkpoints.Checkpointer.intact_step(checkpointer)
    recorder = types.SimpleNamespace(checkpointer=checkpointer, history=[],
                                     epoch_progress=dict)
    plan = types.SimpleNamespace(steps_per_epoch=4, total_steps=8)
    with pytest.raises(WriteError) as error:
        trainer._fit_and_save(None, None, None, [], recorder, strategy=None, plan=plan,
                              start_step=0, end_step=8, checkpointer=checkpointer,
                              work_dir="run", verbose=0, print_fn=quiet)
    message = str(error.value)
    assert message == f"cannot write into run (No space left on device); {said}"
    assert "None" not in message

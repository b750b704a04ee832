"""Runs whose ``--model_dir`` is a bucket (``gs://``, a local GCS emulator:
the ``gcs_emulator`` fixture): every file in the bucket and nothing on the
machine's disk, resumed on a fresh machine (a new working directory and
temporary folder) equal to an uninterrupted run, a damaged index passed
over as on a local disk, one run at a time, and a missing bucket in one
line.  On the backend the leg runs (TensorFlow, or JAX with and without
TensorFlow installed)."""

import json
import os
import re
import signal
import subprocess
import sys

import keras
import numpy as np
import pytest

from keras_identity import storage
from keras_identity import store_clients
from keras_identity.training import ConfigError
from keras_identity.training import Stopped
from keras_identity.models import pretrained
from keras_identity.training import model_card
from keras_identity.training import orbax_checkpoints
from keras_identity.training import run_lock
from keras_identity.training import train
from tests.backend import jax_only
from tests.programs import files_left
from tests.training.test_preemption import _latest
from tests.training.test_run_files import _config  # the same run as on a local disk
from tests.programs import LineWatch
from tests.programs import error_lines
from tests.programs import run_refusals
from tests.programs import stop_by_taking_the_lock

FLAGS = ["--model=highway_net", "--depth=10", "--batch_size=32", "--steps_per_epoch=4",
         "--train_examples=512", "--test_examples=96", "--verbose=0", "--seed=3",
         "--steps_per_execution=1"]

# What a finished run keeps (TensorBoard's event files are named by time and
# host; an Orbax checkpoint's array files by their contents).
ORBAX = keras.backend.backend() == "jax" and orbax_checkpoints.available()
CHECKPOINTS = (["ckpt_000000008", "ckpt_000000012"] if ORBAX else [
    "ckpt-000000008.state.json", "ckpt-000000008.weights.h5", "ckpt-000000012.state.json",
    "ckpt-000000012.weights.h5", "state.json"])
# FLAGS' run for train() in this process, in the leg's own checkpoint format.
RUN_OF_FLAGS = dict(checkpoint_format=None, depth=10, batch_size=32, steps_per_epoch=4,
                    train_examples=512, test_examples=96, seed=3, deterministic=False,
                    epochs=None, steps_per_execution=1)
RUN_FILES = ["config.json", "curves.png", "history.csv", "history.json", "model.keras",
             "model_card.json", "model_card.md", "preprocessing.json", "run.json"]


def _machine(tmp_path, name):
    """A fresh working directory and temporary folder (a new VM's)."""
    cwd, tmp = tmp_path / name / "cwd", tmp_path / name / "tmp"
    cwd.mkdir(parents=True)
    tmp.mkdir()
    return cwd, tmp


def _env(gcs_emulator, tmp):
    env = dict(os.environ, STORAGE_EMULATOR_HOST=gcs_emulator.url, TMPDIR=str(tmp),
               PYTHONUNBUFFERED="1", KERAS_BACKEND=keras.backend.backend())
    for name in ("GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT", "TENSORSTORE_GCS_HTTP_URL",
                 "GOOGLE_AUTH_TOKEN_FOR_TESTING", "EPATH_USE_TF"):
        env.pop(name, None)   # the one variable is enough
    return env


def _command(model_dir, *extra):
    return [sys.executable, "-m", "keras_identity_cli.train", *FLAGS,
            f"--model_dir={model_dir}", *extra]


def _train(gcs_emulator, machine, model_dir, *extra):
    cwd, tmp = machine
    return subprocess.run(_command(model_dir, *extra), cwd=cwd, env=_env(gcs_emulator, tmp),
                          capture_output=True, text=True, timeout=600)


def _losses(model_dir):
    return [[row["loss"], row["test_loss"], row["test_error"]]
            for row in storage.read_json(storage.join(model_dir, "history.json"))]


@pytest.fixture(scope="module")
def straight(gcs_emulator, tmp_path_factory):
    """A 12-step run (3 epochs) in the bucket, uninterrupted, and what it left
    on its machine."""
    model_dir = gcs_emulator("straight")
    machine = _machine(tmp_path_factory.mktemp("straight"), "vm")
    done = _train(gcs_emulator, machine, model_dir, "--train_steps=12")
    assert done.returncode == 0, done.stderr[-3000:]
    return model_dir, machine, done


def test_a_run_in_a_bucket_keeps_every_file_there_and_nothing_on_the_machine(straight,
                                                                            tmp_path):
    model_dir, machine, done = straight
    files = storage.list_files(model_dir)
    assert [f for f in files if "/" not in f] == RUN_FILES
    card = storage.read_json(storage.join(model_dir, "model_card.json"))  # its card there too
    assert card["recipe"]["steps"] == 12 and card["sha256"] == model_card.file_sha256(
        storage.join(model_dir, "model.keras"))
    preset = pretrained.register(model_dir, "x", str(tmp_path))  # a preset from the bucket
    assert preset.card == card and (tmp_path / preset.file).is_file()
    assert sorted({f.split("/")[1] for f in files if f.startswith("checkpoints/")}) == \
        CHECKPOINTS
    if ORBAX:  # each committed: its commit file is written last
        for name in CHECKPOINTS:
            assert f"checkpoints/{name}/commit_success.txt" in files
    assert not [f for f in files if "/" in f and f.split("/")[0] not in ("checkpoints",
                                                                          "tensorboard")]
    runs = {f.split("/")[1] for f in files if f.startswith("tensorboard/")}
    assert runs == {"train", "validation"}
    assert files_left(machine) == []  # no `gs:` folder, no staging left behind
    assert f"model saved to {model_dir}/model.keras" in done.stdout
    assert _latest(storage.join(model_dir, "checkpoints"))["step"] == 12
    assert len(_losses(model_dir)) == 3


@pytest.mark.parametrize("name", ["stopped", "stopped[1]"])
def test_a_run_stopped_by_sigterm_resumes_on_a_new_machine_as_if_uninterrupted(
        gcs_emulator, straight, tmp_path, name):
    # A folder named with glob characters (run[1]) too: fsspec's globbing
    # calls would take it as a pattern (run1).  Orbax's file layer globs its
    # paths, so on JAX such a run is refused before its first step, as on a
    # disk, and leaves nothing in the bucket.
    model_dir = gcs_emulator(name)
    if ORBAX and "[" in name:
        refused = _train(gcs_emulator, _machine(tmp_path, "first"), model_dir,
                         "--train_steps=12")
        lines = error_lines(refused.stderr)
        assert refused.returncode == 2 and len(lines) == 1, refused.stderr[-3000:]
        assert "Traceback" not in refused.stderr
        assert lines[0] == (
            f"error: '{model_dir}/checkpoints': Orbax checkpoints (the JAX route's) cannot be "
            f"read back from a path with a bracketed part ('[1]': Orbax's file layer takes it "
            f"for a glob pattern); give a --model_dir without brackets, or "
            f"--checkpoint_format=h5")
        assert not storage.exists(model_dir) or storage.list_files(model_dir) == []
        return
    cwd, tmp = first = _machine(tmp_path, "first")
    proc = subprocess.Popen(_command(model_dir, "--train_steps=12"), cwd=cwd,
                            env=_env(gcs_emulator, tmp), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    assert LineWatch(proc.stdout, "epoch 1 ").wait(300)
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=120) == 75, proc.stderr.read()[-3000:]
    stopped = [line for line in proc.stderr.read().splitlines()
               if line.startswith("stopped by SIGTERM")]
    assert len(stopped) == 1 and model_dir in stopped[0], stopped
    assert files_left(first) == []
    # The lock went with the run; a new machine resumes from the bucket alone.
    assert not storage.exists(storage.join(model_dir, ".lock"))
    second = _machine(tmp_path, "second")
    done = _train(gcs_emulator, second, model_dir, "--train_steps=12")
    assert done.returncode == 0, done.stderr[-3000:]
    assert "resuming from the checkpoint at step" in done.stdout
    assert _losses(model_dir) == _losses(straight[0])
    assert files_left(second) == []


def test_a_second_run_on_the_same_bucket_directory_is_refused_in_one_line(
        gcs_emulator, tmp_path):
    model_dir = gcs_emulator("locked")
    lock = run_lock.RunLock(model_dir).acquire()
    try:
        # A second holder is refused, also in this process.
        with pytest.raises(ValueError, match="is in use by another training"):
            run_lock.RunLock(model_dir).acquire()
        refused = _train(gcs_emulator, _machine(tmp_path, "vm"), model_dir, "--train_steps=4")
    finally:
        lock.release()
    assert refused.returncode == 2, refused.stderr[-3000:]
    lines = error_lines(refused.stderr)
    assert len(lines) == 1 and "is in use by another training" in lines[0], refused.stderr
    assert not storage.exists(storage.join(model_dir, ".lock"))   # released
    assert storage.list_files(model_dir) == []


def test_a_lock_left_by_a_lost_machine_is_taken_over_after_its_lease(gcs_emulator,
                                                                     monkeypatch):
    model_dir = gcs_emulator("lost")
    storage.write_json(storage.join(model_dir, ".lock"),
                       {"holder": "pid 1 on lost-vm", "token": "x", "renewed": 0})
    lock = run_lock.RunLock(model_dir).acquire()
    try:
        assert storage.read_json(storage.join(model_dir, ".lock"))["token"] == lock._token
    finally:
        lock.release()
    assert not storage.exists(storage.join(model_dir, ".lock"))


# --- hardening (issue 61: 2, 3): a clock that runs ahead, a lock lost mid-run --


def test_a_lock_whose_clock_runs_ahead_is_judged_by_this_hosts_clock(gcs_emulator,
                                                                     monkeypatch, capsys):
    import time

    model_dir = gcs_emulator("ahead")
    monkeypatch.setattr(run_lock, "LEASE_SECONDS", 1.5)   # this host's clock, not the lock's
    monkeypatch.setattr(run_lock, "WATCH_SECONDS", 0.2, raising=False)
    path = storage.join(model_dir, ".lock")
    storage.write_json(path, {"holder": "pid 1 on fast-clock-vm", "token": "x",
                              "renewed": time.time() + 3600})   # an hour ahead, then lost
    started = time.monotonic()
    lock = run_lock.RunLock(model_dir).acquire()
    try:
        assert storage.read_json(path)["token"] == lock._token
    finally:
        lock.release()
    assert 1.5 < time.monotonic() - started < 60
    out = capsys.readouterr().out
    assert f"the lock {path} (pid 1 on fast-clock-vm) records a renewal 3600 s ahead of this " \
           f"host's clock: watching it for up to 2 s" in out
    assert f"taking over the lock {path}: pid 1 on fast-clock-vm has not renewed it for " in out
    assert not storage.exists(path)


def test_a_live_holder_whose_clock_runs_ahead_is_still_refused(gcs_emulator, monkeypatch):
    import threading
    import time

    model_dir = gcs_emulator("ahead-alive")
    monkeypatch.setattr(run_lock, "LEASE_SECONDS", 30.0)
    monkeypatch.setattr(run_lock, "WATCH_SECONDS", 0.2, raising=False)
    path = storage.join(model_dir, ".lock")

    def renew():
        storage.write_json(path, {"holder": "pid 1 on fast-clock-vm", "token": "x",
                                  "renewed": time.time() + 3600})

    renew()
    renewal = threading.Timer(1.0, renew)   # the holder renews: it is alive
    renewal.start()
    try:
        with pytest.raises(ValueError, match=r"is in use by another training \(pid 1 on "
                                             r"fast-clock-vm, renewed 0 s ago; its clock is "
                                             r"\d+ s ahead of this host's\)"):
            run_lock.RunLock(model_dir).acquire()
    finally:
        renewal.join()
    assert storage.read_json(path)["token"] == "x"
    storage.remove(path)


def _losing_the_lease_at(epoch_line, lock_path, then=None):
    def print_fn(line):
        if line.startswith(epoch_line) and storage.exists(lock_path):
            storage.remove(lock_path)
            if then is not None:
                then()
    return print_fn


def test_a_run_whose_lease_is_deleted_stops_before_its_next_checkpoint(gcs_emulator):
    run = gcs_emulator("lease-deleted")
    lock_path = storage.join(run, ".lock")
    with pytest.raises(Stopped) as lost:
        train(_config(run, epochs=3), _losing_the_lease_at("epoch 2 ", lock_path))
    assert str(lost.value) == (
        f"the lock {lock_path} was deleted while this run held it: this run stopped at step 8 "
        f"without writing its checkpoint (another training may be writing {run}); make sure "
        f"no other training writes there, then run the same command to resume")
    assert storage.read_json(storage.join(run, "checkpoints", "state.json"))["step"] == 4
    assert not storage.exists(lock_path)   # not made again by the stopped run
    assert train(_config(run, epochs=3), lambda *_: None)["steps"] == 12   # resumed


def test_a_run_whose_lease_is_taken_by_a_second_run_stops_before_its_next_checkpoint(
        gcs_emulator):
    run = gcs_emulator("lease-taken")
    lock_path = storage.join(run, ".lock")
    second = run_lock.RunLock(run)
    try:
        with pytest.raises(Stopped, match=(
                rf"^the lock {re.escape(lock_path)} was taken over by pid {os.getpid()} on "
                rf".*: this run stopped at step 4 without writing its checkpoint")):
            train(_config(run, epochs=3), _losing_the_lease_at("epoch 1 ", lock_path,
                                                               second.acquire))
        assert storage.read_json(lock_path)["token"] == second._token   # left to its holder
    finally:
        second.release()
    assert not storage.exists(storage.join(run, "checkpoints", "state.json"))


def test_a_lost_lease_ends_the_program_in_one_line_with_status_75(gcs_emulator, tmp_path):
    model_dir = gcs_emulator("lease-lost-cli")
    cwd, tmp = _machine(tmp_path, "vm")
    proc = subprocess.Popen(_command(model_dir, "--train_steps=80"), cwd=cwd,
                            env=_env(gcs_emulator, tmp), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    stop_by_taking_the_lock(proc, storage.join(model_dir, ".lock"), storage.remove)
    assert not storage.exists(storage.join(model_dir, "model.keras"))
    assert (_latest(storage.join(model_dir, "checkpoints")) or {"step": 0})["step"] < 80


def test_a_missing_bucket_is_one_line_and_leaves_nothing(gcs_emulator, tmp_path):
    machine = _machine(tmp_path, "vm")
    refused = _train(gcs_emulator, machine, "gs://no-such-bucket-kid/run", "--train_steps=4")
    assert refused.returncode == 2, refused.stderr[-3000:]
    lines = error_lines(refused.stderr)
    assert len(lines) == 1 and "the bucket gs://no-such-bucket-kid does not exist" in lines[0]
    assert files_left(machine) == []


def test_paths_and_settings_a_store_cannot_take_are_refused_before_the_first_step(
        gcs_emulator, tmp_path):
    # A newline in --model_dir (in a bucket and on a disk), a run folder
    # whose files' object names would pass GCS's 1,024 bytes, and a store
    # timeout that is no bound: each one line, status 2, nothing written.
    cwd, tmp = _machine(tmp_path, "vm")
    folder = gcs_emulator("names")
    deep = folder + "/" + "d" * (1024 - len(folder.split("/", 3)[3]) - 40)
    cases = [[f"--model_dir={folder}\nx"], [f"--model_dir={tmp_path}/run\nx"],
             [f"--model_dir={deep}"]]
    env = _env(gcs_emulator, tmp)
    results = run_refusals("keras_identity_cli.train",
                           [FLAGS + ["--train_steps=4"] + case for case in cases], env=env)
    timeout = run_refusals("keras_identity_cli.train",
                           [FLAGS + ["--train_steps=4", f"--model_dir={folder}"]],
                           env=dict(env, KERAS_IDENTITY_STORE_TIMEOUT_S="1e9"))
    for (code, stderr), expected in zip(results + timeout, [
            "holds a control character ('\\n' at position", "holds a control character",
            "is too long for GCS: the run's file '", "KERAS_IDENTITY_STORE_TIMEOUT_"
            "S='1e9' is past the maximum of 3600 s"]):
        lines = error_lines(stderr)
        assert code == 2 and len(lines) == 1 and expected in lines[0], stderr[-3000:]
        assert "Traceback" not in stderr
    assert "object named with" in error_lines(results[2][1])[0]
    assert storage.list_files(folder) == [] if storage.exists(folder) else True
    assert not (tmp_path / "run\nx").exists()


# --- a damaged index in the bucket (tests/training/test_run_files.py's cases) --


@pytest.fixture(scope="module")
def two_epochs(gcs_emulator, tmp_path_factory):
    """A finished 2-epoch run (checkpoints at steps 4 and 8) on a local disk,
    and the same run trained straight through 3 epochs."""
    root = tmp_path_factory.mktemp("runs")
    train(_config(root / "two"), lambda *_: None)
    return root / "two", train(_config(root / "straight", epochs=3), lambda *_: None)


def _edit(path, **changes):
    storage.write_json(path, {**storage.read_json(path), **changes})


def _garble(path):
    storage.write_bytes(path, b'{"step": ')


def _killed_while_its_state_was_written(run, cut_short):
    directory = storage.join(run, "checkpoints")
    for name in ("ckpt-000000008.weights.h5", "ckpt-000000008.state.json", "state.json"):
        storage.remove(storage.join(directory, name))
    own = storage.join(directory, "ckpt-000000004.state.json")
    text = storage.read_bytes(own)
    storage.remove(own)
    storage.write_bytes(own + ".partial", text[:20] if cut_short else text)


BUCKET_DAMAGE = {
    "state.json deleted": (lambda run: storage.remove(
        storage.join(run, "checkpoints/state.json")), 8),
    "state.json garbled": (lambda run: _garble(storage.join(run, "checkpoints/state.json")), 8),
    "run.json garbled": (lambda run: _garble(storage.join(run, "run.json")), 8),
    "step 64 edited to 80": (lambda run: [_edit(storage.join(run, "checkpoints", name), step=80)
                                          for name in ("state.json",
                                                       "ckpt-000000008.state.json")], 4),
    "index names a missing step": (lambda run: _edit(
        storage.join(run, "checkpoints/state.json"), step=999_999_999,
        weights="ckpt-999999999.weights.h5"), 8),
    "killed while its state was written": (
        lambda run: _killed_while_its_state_was_written(run, False), 4),
    "killed while its state was written, cut short": (
        lambda run: _killed_while_its_state_was_written(run, True), None),
}


@pytest.mark.parametrize("damage", sorted(BUCKET_DAMAGE))
def test_a_damaged_index_in_a_bucket_is_passed_over_and_the_run_ends_as_uninterrupted(
        gcs_emulator, two_epochs, damage):
    finished, straight_run = two_epochs
    run = gcs_emulator("damaged")
    storage.upload_tree(str(finished), run)
    harm, resumed_at = BUCKET_DAMAGE[damage]
    harm(run)
    lines = []
    with pytest.warns(UserWarning):
        result = train(_config(run, epochs=3), lines.append)
    resumed = [line for line in lines if line.startswith("resuming from")]
    assert resumed == ([] if resumed_at is None else [
        f"resuming from the checkpoint at step {resumed_at} (end of epoch "
        f"{resumed_at // 4}) in {run}/checkpoints"]), lines
    assert [r["loss"] for r in result["history"]] == [r["loss"] for r in straight_run["history"]]
    with storage.local_copy(result["model_path"]) as local:
        ours = keras.models.load_model(local).get_weights()
    reference = keras.models.load_model(straight_run["model_path"]).get_weights()
    assert all(np.array_equal(a, b) for a, b in zip(ours, reference))


def test_a_checkpoint_from_a_run_with_other_flags_in_a_bucket_is_refused(gcs_emulator,
                                                                        two_epochs):
    run = gcs_emulator("other")
    storage.upload_tree(str(two_epochs[0]), run)
    before = {f: storage.read_bytes(storage.join(run, f)) for f in storage.list_files(run)}
    with pytest.raises(ConfigError, match=r"other flags .*learning_rate: 0.05 != 0.02"):
        train(_config(run, epochs=3, learning_rate=0.02), lambda *_: None)
    after = {f: storage.read_bytes(storage.join(run, f)) for f in storage.list_files(run)}
    assert after == before


# --- two JAX processes, one run in a bucket ------------------------------------


@pytest.mark.slow
@jax_only
def test_two_processes_share_one_bucket_run_and_resume_after_sigterm_to_one(
        gcs_emulator, tmp_path):
    """Slow (50-90 s on 2 cores: five training processes).  Its two halves are
    in the default run: two processes stopped by a SIGTERM to one resume as
    uninterrupted (tests/training/test_jax_processes.py), and a run in a
    bucket stopped by SIGTERM resumes on a new machine as uninterrupted
    (test_a_run_stopped_by_sigterm_resumes_on_a_new_machine_as_if_uninterrupted);
    two processes writing one run's Orbax checkpoints into a bucket, leaving
    nothing on either machine, only here."""
    from tests.training.test_jax_processes import _port

    def pair(model_dir, name):
        port = _port()
        machines = [_machine(tmp_path, f"{name}{i}") for i in range(2)]
        return [subprocess.Popen(
            _command(model_dir, "--train_steps=16", "--checkpoint_every=epoch",
                     f"--coordinator_address=127.0.0.1:{port}", "--num_processes=2",
                     f"--process_id={i}"),
            cwd=machines[i][0], env=_env(gcs_emulator, machines[i][1]),
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            for i in range(2)], machines

    # The uninterrupted reference: one process over two devices, which two
    # processes equal (tests/training/test_jax_processes.py).
    straight_dir = gcs_emulator("pair-straight")
    cwd, tmp = _machine(tmp_path, "s")
    straight = subprocess.run(
        _command(straight_dir, "--train_steps=16", "--checkpoint_every=epoch"), cwd=cwd,
        env=dict(_env(gcs_emulator, tmp), XLA_FLAGS=" ".join(
            [os.environ.get("XLA_FLAGS", ""), "--xla_force_host_platform_device_count=2"])),
        capture_output=True, text=True, timeout=600)
    assert straight.returncode == 0, straight.stderr[-3000:]
    assert "DataParallel (2 CPU)" in straight.stdout

    model_dir = gcs_emulator("pair")
    procs, machines = pair(model_dir, "a")
    assert LineWatch(procs[0].stdout, "epoch 1 ").wait(300)
    procs[1].send_signal(signal.SIGTERM)
    codes = [p.wait(timeout=120) for p in procs]
    errs = [p.stderr.read() for p in procs]
    assert codes == [75, 75], errs[0][-2000:] + errs[1][-2000:]
    for machine in machines:
        assert files_left(machine) == []
    procs, machines = pair(model_dir, "b")
    outputs = [p.communicate(timeout=600) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outputs[0][1][-2000:] + outputs[1][1][-2000:]
    assert "resuming from the checkpoint at step" in outputs[0][0]
    for a, b in zip(_losses(straight_dir), _losses(model_dir)):
        assert a == pytest.approx(b, abs=1e-5)
    assert len(_losses(model_dir)) == 4
    for machine in machines:
        assert files_left(machine) == []
    assert json.loads(storage.read_bytes(storage.join(model_dir, "run.json")))["backend"] == "jax"


def test_a_store_lost_during_a_checkpoint_is_one_line_and_the_one_before_is_intact(
        gcs_emulator, two_epochs, monkeypatch):
    from keras_identity.training import WriteError

    run = gcs_emulator("lost-network")
    storage.upload_tree(str(two_epochs[0]), run)
    before = {f: storage.read_bytes(storage.join(run, f)) for f in storage.list_files(run)}
    store = store_clients.filesystem("gs")
    pipe_file = store.pipe_file

    def dropped(path, *args, **kwargs):
        if path.endswith(".weights.h5"):
            raise ConnectionError("Cannot connect to host localhost:1 ssl:default "
                                  "[Connection refused]")
        return pipe_file(path, *args, **kwargs)

    monkeypatch.setattr(store, "pipe_file", dropped)
    with pytest.raises(WriteError) as error:
        train(_config(run, epochs=3), lambda *_: None)
    message = str(error.value)
    assert "\n" not in message
    assert message.startswith(f"cannot write the checkpoint of step 12 into {run}/checkpoints "
                              f"(writing {run}/checkpoints/ckpt-000000012.weights.h5 failed: "
                              f"the store cannot be reached"), message
    assert "the checkpoint of step 8 is intact" in message
    monkeypatch.undo()
    after = {f: storage.read_bytes(storage.join(run, f)) for f in storage.list_files(run)}
    del before[".lock"]   # the local run's lock, copied up: taken over and released

    def checkpoints(files):
        return {f: v for f, v in files.items() if f.startswith("checkpoints/")}

    # Nothing of the checkpoints was lost, and no partial objects were left.
    assert checkpoints(after) == checkpoints(before)
    assert [f for f in set(after) - set(before) if not f.startswith("tensorboard/")] == []


def test_a_write_refused_during_a_checkpoint_is_one_line_and_the_one_before_is_intact(
        gcs_emulator, straight):
    """Write permission lost under the checkpoint of step 12 (the emulator
    answers 403 there): in the run's own format (JAX: Orbax, written in the
    background, so the failure is met when the run waits for it)."""
    from keras_identity.training import WriteError
    from tests.gcs_emulator import REFUSED_WRITES

    run = gcs_emulator("refused")
    config = RUN_OF_FLAGS
    train(_config(run, train_steps=8, **config), lambda *_: None)
    folder = storage.join(run, "checkpoints")
    before = {f: storage.read_bytes(storage.join(folder, f)) for f in storage.list_files(folder)}
    name = "ckpt_000000012" if ORBAX else "ckpt-000000012"
    refused = storage.join(f"gs://{gcs_emulator.bucket}", REFUSED_WRITES)
    prefix = run.split("/", 3)[3] + "/checkpoints/" + name
    storage.write_text(refused, prefix + "\n")
    try:
        with pytest.raises(WriteError) as error:
            train(_config(run, train_steps=12, **config), lambda *_: None)
    finally:
        storage.remove(refused)
    message = str(error.value)
    assert "\n" not in message
    assert message.startswith(f"cannot write the checkpoint of step 12 into {run}/checkpoints ")
    assert "the checkpoint of step 8 is intact" in message
    after = {f: storage.read_bytes(storage.join(folder, f)) for f in storage.list_files(folder)}
    # The checkpoints before are intact, and nothing of step 12 was left.
    assert {f: v for f, v in after.items() if not f.startswith("state.json")} == {
        f: v for f, v in before.items() if not f.startswith("state.json")}
    # The same command then ends the run as the uninterrupted one.
    train(_config(run, train_steps=12, **config), lambda *_: None)
    np.testing.assert_allclose(_losses(run), _losses(straight[0]), rtol=1e-5)


@pytest.mark.skipif(not ORBAX, reason="Orbax checkpoints (the JAX route's)")
def test_an_orbax_checkpoint_without_its_commit_in_a_bucket_is_not_resumed_nor_overwritten(
        gcs_emulator, straight):
    """A VM lost while its checkpoint of step 12 was written leaves a folder
    without ``commit_success.txt``: the run resumes from step 8 and ends as
    the uninterrupted one, keeping that folder aside."""
    run = gcs_emulator("uncommitted")
    config = RUN_OF_FLAGS
    train(_config(run, train_steps=8, **config), lambda *_: None)
    folder = storage.join(run, "checkpoints")
    for relative in storage.list_files(storage.join(folder, "ckpt_000000008")):
        if relative != "commit_success.txt":
            storage.write_bytes(storage.join(folder, "ckpt_000000012", relative),
                                storage.read_bytes(storage.join(folder, "ckpt_000000008",
                                                                relative)))
    lines = []
    with pytest.warns(UserWarning, match="kept ckpt_000000012, a checkpoint this run did not "
                                         "write and cannot read, as ckpt_000000012.unread"):
        train(_config(run, train_steps=12, **config), lines.append)
    assert any(line.startswith("resuming from the checkpoint at step 8") for line in lines)
    np.testing.assert_allclose(_losses(run), _losses(straight[0]), rtol=1e-5)
    names = sorted({f.split("/")[0] for f in storage.list_files(folder)})
    assert names == ["ckpt_000000008", "ckpt_000000012", "ckpt_000000012.unread"]


def _fault_after_the_first_epoch(emulator, tmp_path, name, checkpoint_format, fault, delay,
                                 timeout):
    """Runs 12 steps into ``gs://…/<name>`` and calls ``fault`` once the
    first epoch ends (on Orbax ``delay`` s later, while its arrays are
    written in the background); ``(model_dir, exit status, stderr)``."""
    import time

    model_dir = emulator(name)
    cwd, tmp = _machine(tmp_path, name)
    env = dict(_env(emulator, tmp), KERAS_IDENTITY_STORE_TIMEOUT_S="1")
    proc = subprocess.Popen(_command(model_dir, "--train_steps=12",
                                     f"--checkpoint_format={checkpoint_format}"),
                            cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    try:
        assert LineWatch(proc.stdout, "epoch 1 ").wait(300)
        if checkpoint_format == "orbax":
            time.sleep(delay)
        fault()
        status = proc.wait(timeout=timeout)
        stderr = proc.stderr.read()
    finally:
        proc.kill()
        proc.wait()
    return model_dir, status, stderr


@pytest.mark.parametrize("checkpoint_format", [
    "h5", pytest.param("orbax", marks=pytest.mark.skipif(
        not ORBAX, reason="Orbax checkpoints (the JAX route's)"))])
def test_a_store_that_stops_answering_stops_the_run_in_one_line(stalling_gcs_emulator,
                                                                 tmp_path, checkpoint_format):
    # The store is stopped (SIGSTOP) once the first epoch ends, while its
    # checkpoint or the next one is written; the run used to wait for good.
    # HDF5 checkpoints (through keras_identity.storage) on either backend;
    # Orbax's (TensorStore's arrays written in the background: the stall
    # comes a moment later, while they are written) on JAX.
    model_dir, status, stderr = _fault_after_the_first_epoch(
        stalling_gcs_emulator, tmp_path, "stalled", checkpoint_format,
        stalling_gcs_emulator.stall, delay=0.15, timeout=60)  # the code before: no exit
    assert status not in (0, None), stderr[-3000:]
    assert "Traceback" not in stderr, stderr[-3000:]
    lines = error_lines(stderr)
    assert len(lines) == 1, stderr[-3000:]
    assert lines[0].startswith(f"error: cannot write ") and model_dir in lines[0], lines
    # 3 s for the first call that met the stall, 1 s for each one after it.
    assert re.search(r"failed: the store did not answer in [13] s \(KERAS_IDENTITY_STORE_"
                     r"TIMEOUT_S=1 s a request, retried\); check that the bucket answers",
                     lines[0]), lines


@pytest.mark.slow
@pytest.mark.skipif(not ORBAX, reason="Orbax checkpoints (the JAX route's)")
def test_a_store_that_stops_answering_between_checkpoints_names_the_write_that_stalled(
        stalling_gcs_emulator, tmp_path):
    """Slow (50-130 s on 2 cores): the stall must come while an epoch long
    enough to be caught trains after a background write's commit (900 steps
    of a 50-layer net).  A store that stops answering during a run, in one
    line on both checkpoint formats, is checked in the default run
    (test_a_store_that_stops_answering_stops_the_run_in_one_line); the line
    naming the earlier write whose commit could not be confirmed, with its
    cause and within the store's timeout, only here."""
    # The store stops answering in the second epoch, after the checkpoint of
    # step 300 was written in the background: the save of step 600 waits for
    # that write and confirms its commit by listing the folder, which the
    # store leaves unanswered.  The line used to name step 300 with an empty
    # cause ("()": fsspec's FSTimeoutError has no message), after Orbax's
    # listing had retried for over a minute.
    import time
    import urllib.parse
    import urllib.request

    model_dir = stalling_gcs_emulator("between")
    cwd, tmp = _machine(tmp_path, "between")
    env = dict(_env(stalling_gcs_emulator, tmp), KERAS_IDENTITY_STORE_TIMEOUT_S="1")
    proc = subprocess.Popen(_command(model_dir, "--depth=50", "--batch_size=256",
                                     "--steps_per_epoch=300", "--train_steps=900",
                                     "--train_examples=15360", "--checkpoint_every=epoch"),
                            cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    commit = (f"{stalling_gcs_emulator.url}/storage/v1/b/{stalling_gcs_emulator.bucket}/o/"
              + urllib.parse.quote(f"{model_dir.split('/', 3)[3]}/checkpoints/ckpt_000000300/"
                                   f"commit_success.txt", safe=""))

    def committed():
        try:
            with urllib.request.urlopen(commit, timeout=5) as answer:
                return answer.status == 200
        except OSError:
            return False

    try:
        assert LineWatch(proc.stdout, "epoch 1 ").wait(300)
        deadline = time.monotonic() + 60
        while not committed():   # step 300's write has ended; the second epoch trains
            assert time.monotonic() < deadline and proc.poll() is None
            time.sleep(0.1)
        stalling_gcs_emulator.stall()
        stalled_at = time.monotonic()
        status = proc.wait(timeout=120)
        waited = time.monotonic() - stalled_at
        stderr = proc.stderr.read()
    finally:
        proc.kill()
        proc.wait()
    assert status == 1, stderr[-3000:]
    _no_tracebacks(stderr)
    lines = error_lines(stderr)
    assert len(lines) == 1, stderr[-3000:]
    folder = f"{model_dir}/checkpoints"
    # 3 s for a first call that met the stall, 1 s where another (the lock's
    # lease, a run file) met it first.
    assert re.match(
        re.escape(f"error: cannot write the checkpoint of step 600 into {folder} (confirming "
                  f"the commit of ckpt_000000300, written before: listing {folder} failed: "
                  f"the store did not answer in ") + r"[13]" + re.escape(
                  " s (KERAS_IDENTITY_STORE_TIMEOUT_S=1 s a request, retried); check that the "
                  "bucket answers); the checkpoints written before are intact"), lines[0]), \
        lines[0]
    assert waited < 100, waited   # the rest of the epoch, then 3 s a call


def test_the_store_timeout_setting_is_checked_in_one_line(monkeypatch):
    monkeypatch.setenv("KERAS_IDENTITY_STORE_TIMEOUT_S", "soon")
    with pytest.raises(ValueError) as error:
        store_clients.store_timeout()
    assert str(error.value) == ("KERAS_IDENTITY_STORE_TIMEOUT_S='soon' is not a number of "
                                "seconds; expected a positive number (default 120), or unset it")
    monkeypatch.setenv("KERAS_IDENTITY_STORE_TIMEOUT_S", "1e9")   # in effect no bound
    with pytest.raises(ValueError) as error:
        store_clients.store_timeout()
    assert str(error.value) == ("KERAS_IDENTITY_STORE_TIMEOUT_S='1e9' is past the maximum of "
                                "3600 s a request (a larger bound is no bound on a store that "
                                "stops answering); expected a positive number up to 3600 "
                                "(default 120), or unset it")
    monkeypatch.setenv("KERAS_IDENTITY_STORE_TIMEOUT_S", "3600")
    assert store_clients.store_timeout() == store_clients.MAX_STORE_TIMEOUT_S == 3600
    monkeypatch.setenv("KERAS_IDENTITY_STORE_TIMEOUT_S", "2.5")
    assert store_clients.store_timeout() == 2.5
    monkeypatch.delenv("KERAS_IDENTITY_STORE_TIMEOUT_S")
    assert store_clients.store_timeout() == store_clients.STORE_TIMEOUT_S == 120


def _no_tracebacks(stderr):
    for noise in ("Traceback", "Event loop is closed", "out of retries", "prefetcher"):
        assert noise not in stderr, stderr[-3000:]


@pytest.mark.skipif(not ORBAX, reason="Orbax checkpoints (the JAX route's)")
def test_a_passed_over_orbax_checkpoint_in_a_bucket_is_set_aside_and_the_run_goes_on(
        gcs_emulator, tmp_path):
    # The newest checkpoint's array index deleted: the run resumes from the
    # one before, with a warning, and no tracebacks.  Orbax's client
    # (etils.epath's) kept a listing of its own, so the checkpoint set aside
    # was still listed there: it read the moved files (fsspec's read-ahead
    # logged tracebacks) and refused to write that step again ("Checkpoint
    # for step 8 already exists"); they are one client now.
    model_dir = gcs_emulator("no-manifest")
    first = _train(gcs_emulator, _machine(tmp_path, "first"), model_dir, "--train_steps=8")
    assert first.returncode == 0, first.stderr[-3000:]
    storage.remove(storage.join(model_dir, "checkpoints", "ckpt_000000008", "weights",
                                "manifest.ocdbt"))
    done = _train(gcs_emulator, _machine(tmp_path, "second"), model_dir, "--train_steps=12")
    assert done.returncode == 0, done.stderr[-3000:]
    _no_tracebacks(done.stderr)
    assert "resuming from the checkpoint at step 4 " in done.stdout
    warned = [line for line in done.stderr.splitlines() if "UserWarning" in line]
    assert len(warned) == 2 and "skipped unreadable checkpoint(s) ckpt_000000008" in \
        warned[0] and "kept ckpt_000000008, a checkpoint this run did not write and cannot " \
        "read, as ckpt_000000008.unread." in warned[1], warned
    names = storage.listdir(storage.join(model_dir, "checkpoints"))
    assert names == ["ckpt_000000008", "ckpt_000000008.unread", "ckpt_000000012"], names


@pytest.mark.parametrize("checkpoint_format", [
    "h5", pytest.param("orbax", marks=pytest.mark.skipif(
        not ORBAX, reason="Orbax checkpoints (the JAX route's)"))])
def test_a_store_killed_mid_run_is_one_line_without_tracebacks(stalling_gcs_emulator,
                                                                tmp_path, checkpoint_format):
    # The store killed once the first epoch ends (on Orbax a moment later,
    # while its arrays are written): gcsfs's 'out of retries' logs, fsspec's
    # read-ahead errors and TensorStore's 'Event loop is closed' callbacks
    # printed tracebacks before the line; a warning of the checkpoint that
    # failed behind the run's own error came beside it.
    model_dir, status, stderr = _fault_after_the_first_epoch(
        stalling_gcs_emulator, tmp_path, "killed", checkpoint_format,
        stalling_gcs_emulator.process.kill, delay=0.2, timeout=180)
    assert status == 1, stderr[-3000:]
    _no_tracebacks(stderr)
    assert "Warning" not in stderr, stderr[-3000:]
    lines = error_lines(stderr)
    assert len(lines) == 1 and model_dir in lines[0], stderr[-3000:]

"""A run's own files lost or damaged (``checkpoints/state.json``,
``run.json``, a checkpoint, ``.lock``): the run resumes from its newest
checkpoint or is refused in one line, and never deletes or overwrites a
checkpoint it did not write.  A run whose identity differs
(:mod:`keras_identity.training.run_files`: other flags or data) is never
resumed."""

import dataclasses
import hashlib
import json
import os
import re
import shutil

import keras
import numpy as np
import pytest

from keras_identity.training import ConfigError
from keras_identity.training import TrainConfig
from keras_identity.training import checkpoints
from keras_identity.training import prepare
from keras_identity.training import run_files
from keras_identity.training import train


def quiet(*_):
    pass


def _config(model_dir, **kwargs):
    base = dict(model="highway_net", depth=3, train_examples=256, test_examples=64,
                epochs=2, batch_size=64, verbose=0, seed=1, deterministic=True,
                keep_checkpoints=2, model_dir=str(model_dir),
                # The files named here (JAX's Orbax ones: test_orbax_checkpoints).
                checkpoint_format="h5")
    base.update(kwargs)
    return TrainConfig(**base)


def _digests(directory):
    """``{name: sha256}`` of every file under ``directory``."""
    found = {}
    for root, _, names in os.walk(directory):
        for name in names:
            path = os.path.join(root, name)
            with open(path, "rb") as f:
                found[os.path.relpath(path, directory)] = hashlib.sha256(f.read()).hexdigest()
    return found


@pytest.fixture(scope="module")
def two_epochs(tmp_path_factory):
    """A finished 2-epoch run (checkpoints at steps 4 and 8) and the same run
    trained straight through 3 epochs, for comparison."""
    root = tmp_path_factory.mktemp("runs")
    train(_config(root / "two"), quiet)
    straight = train(_config(root / "straight", epochs=3), quiet)
    return root / "two", straight


def _delete(path):
    os.remove(path)


def _garble(path):
    with open(path, "w") as f:
        f.write('{"step": ')


DAMAGE = {
    "state.json deleted": [("checkpoints/state.json", _delete)],
    "state.json garbled": [("checkpoints/state.json", _garble)],
    "run.json deleted": [("run.json", _delete)],
    "run.json garbled": [("run.json", _garble)],
    "both deleted": [("checkpoints/state.json", _delete), ("run.json", _delete)],
    "both garbled": [("checkpoints/state.json", _garble), ("run.json", _garble)],
}


def _copy(finished, tmp_path, name="run"):
    """A copy of the finished run in ``tmp_path / name``."""
    run = tmp_path / name
    shutil.copytree(finished, run)
    return run


def _damaged_copy(finished, tmp_path, damage):
    """A copy of the finished run with the files of ``DAMAGE[damage]`` harmed."""
    run = _copy(finished, tmp_path)
    for name, harm in DAMAGE[damage]:
        harm(run / name)
    return run


@pytest.mark.parametrize("damage", sorted(DAMAGE))
def test_a_run_without_its_index_files_resumes_from_its_newest_checkpoint(
        tmp_path, two_epochs, damage):
    finished, straight = two_epochs
    run = _damaged_copy(finished, tmp_path, damage)
    newest = run / "checkpoints" / "ckpt-000000008.weights.h5"
    before = newest.read_bytes()
    lines = []
    with pytest.warns(UserWarning, match=r"(missing|not readable)"):
        result = train(_config(run, epochs=3), lines.append)
    assert any("resuming from the checkpoint at step 8 (end of epoch 2)" in line for line in lines)
    assert result["steps"] == 12
    # Exactly the run trained straight through: the same losses and weights.
    assert [r["loss"] for r in result["history"]] == [r["loss"] for r in straight["history"]]
    ours = keras.models.load_model(result["model_path"]).get_weights()
    reference = keras.models.load_model(straight["model_path"]).get_weights()
    assert all(np.array_equal(a, b) for a, b in zip(ours, reference))
    # The checkpoint it resumed from is untouched (kept: keep_checkpoints=2).
    assert newest.read_bytes() == before
    assert sorted(p.name for p in (run / "checkpoints").glob("ckpt-*.weights.h5")) == [
        "ckpt-000000008.weights.h5", "ckpt-000000012.weights.h5"]
    # Both index files are whole again.
    assert json.loads((run / "run.json").read_text())["identity"]["seed"] == 1
    assert json.loads((run / "checkpoints" / "state.json").read_text())["step"] == 12


@pytest.mark.parametrize("damage", ["run.json deleted", "run.json garbled", "both deleted"])
def test_changed_flags_without_run_json_are_named_from_the_checkpoints_record(
        tmp_path, two_epochs, damage):
    finished, _ = two_epochs
    run = _damaged_copy(finished, tmp_path, damage)
    files = _digests(run)
    with pytest.warns(UserWarning), pytest.raises(ConfigError) as error:
        train(_config(run, epochs=3, depth=4), quiet)
    message = str(error.value)
    assert "\n" not in message
    assert "as its checkpoint of step 8 records them" in message
    assert "depth: 3 != 4" in message and "can be read" not in message
    assert _digests(run) == files   # nothing written, nothing removed


def test_checkpoints_without_a_record_of_their_flags_are_refused_not_trained_over(
        tmp_path, two_epochs):
    finished, _ = two_epochs
    run = _copy(finished, tmp_path)
    (run / "run.json").unlink()
    for state in (run / "checkpoints").glob("*.json"):
        saved = json.loads(state.read_text())
        saved.pop("identity", None)
        state.write_text(json.dumps(saved))
    files = _digests(run)
    with pytest.raises(ConfigError, match=r"run.json is missing and the checkpoints in .* "
                                          r"keep no record of the flags .* restore run.json"):
        train(_config(run, epochs=3), quiet)
    assert _digests(run) == files


def test_checkpoints_without_any_readable_state_are_refused_not_trained_over(
        tmp_path, two_epochs):
    finished, _ = two_epochs
    run = _copy(finished, tmp_path)
    for state in (run / "checkpoints").glob("*.json"):
        state.unlink()
    files = _digests(run)
    with pytest.raises(ConfigError, match=r"state.json is missing and no checkpoint in .* "
                                          r"has a state of its own .*; nothing was changed"):
        train(_config(run, epochs=3), quiet)
    assert _digests(run) == files


def _tiny_model():
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
    model.compile(optimizer="sgd", loss="mse")
    model.optimizer.build(model.trainable_variables)
    return model


def test_a_checkpoint_the_run_did_not_write_is_set_aside_never_overwritten(tmp_path):
    """A run that had to resume from an older checkpoint (the newest one is
    unreadable) keeps the unreadable one under another name when it reaches
    its step, and its keep policy removes only its own run's checkpoints."""
    directory = str(tmp_path / "checkpoints")
    first = checkpoints.Checkpointer(directory, keep=3, identity={"seed": 1})
    model = _tiny_model()
    for step in (1, 2, 3):
        first.save(model, step=step, epoch=step, history=[])
    newest = os.path.join(directory, "ckpt-000000003.weights.h5")
    with open(newest, "r+b") as f:
        f.truncate(100)
    damaged = open(newest, "rb").read()

    second = checkpoints.Checkpointer(directory, keep=1, identity={"seed": 1})
    with pytest.warns(UserWarning, match="skipped unreadable checkpoint"):
        assert second.restore(_tiny_model())["step"] == 2
    with pytest.warns(UserWarning, match="kept the checkpoint ckpt-000000003.weights.h5, "
                                         "which this run did not write, as "):
        second.save(model, step=3, epoch=3, history=[])
    assert open(newest + ".unread", "rb").read() == damaged
    second.save(model, step=4, epoch=4, history=[])
    names = sorted(os.listdir(directory))
    assert "ckpt-000000004.weights.h5" in names and "ckpt-000000003.weights.h5.unread" in names
    assert not any(n.startswith(("ckpt-000000001.", "ckpt-000000002.", "ckpt-000000003.w"))
                   and n.endswith(".h5") for n in names)
    state = json.load(open(os.path.join(directory, "ckpt-000000004.state.json")))
    assert state["identity"] == {"seed": 1} and state["step"] == 4


def test_state_json_behind_the_newest_checkpoint_resumes_from_the_newest(tmp_path):
    """Killed after a checkpoint was written but before state.json named it:
    the newest checkpoint (its own state) is the one resumed."""
    directory = str(tmp_path / "checkpoints")
    saver = checkpoints.Checkpointer(directory, keep=3)
    model = _tiny_model()
    saver.save(model, step=1, epoch=1, history=[])
    index = open(saver.state_path).read()
    saver.save(model, step=2, epoch=2, history=[])
    with open(saver.state_path, "w") as f:
        f.write(index)
    assert checkpoints.Checkpointer(directory).latest()["step"] == 2


def test_a_lock_file_that_is_a_directory_is_one_line(tmp_path):
    run = tmp_path / "run"
    (run / ".lock").mkdir(parents=True)
    with pytest.raises(ConfigError) as error:
        train(_config(run, epochs=1), quiet)
    message = str(error.value)
    assert "\n" not in message and ".lock is a directory" in message
    assert "it is the run's lock file: remove it" in message
    assert not os.path.exists(run / "run.json")


def test_a_workers_own_folder_keeps_only_its_newest_checkpoints_across_runs(tmp_path):
    """A TensorFlow worker's (or JAX process's) folder is its own: a new run's
    checkpointer, which never restores from it, still keeps only ``keep``."""
    directory = str(tmp_path / ".worker1" / "checkpoints")
    model = _tiny_model()
    checkpoints.Checkpointer(directory, keep=1, owns_directory=True).save(
        model, step=8, epoch=2, history=[])
    again = checkpoints.Checkpointer(directory, keep=1, owns_directory=True)
    again.save(model, step=4, epoch=1, history=[])   # a rerun from an older step
    again.save(model, step=8, epoch=2, history=[])
    assert sorted(os.listdir(directory)) == ["ckpt-000000008.state.json",
                                             "ckpt-000000008.weights.h5", "state.json"]


def test_a_directory_name_with_glob_characters_keeps_its_checkpoints(tmp_path):
    directory = str(tmp_path / "run[1]*?" / "checkpoints")
    saver = checkpoints.Checkpointer(directory, keep=2)
    model = _tiny_model()
    for step in (1, 2, 3):
        saver.save(model, step=step, epoch=step, history=[])
    assert sorted(f for f in os.listdir(directory) if f.endswith(".h5")) == [
        "ckpt-000000002.weights.h5", "ckpt-000000003.weights.h5"]
    os.remove(saver.state_path)
    with pytest.warns(UserWarning, match="state.json is missing"):
        assert checkpoints.Checkpointer(directory).latest()["step"] == 3


def test_a_state_whose_step_is_not_a_number_is_not_used(tmp_path):
    directory = str(tmp_path / "checkpoints")
    saver = checkpoints.Checkpointer(directory, keep=3)
    model = _tiny_model()
    saver.save(model, step=1, epoch=1, history=[])
    saver.save(model, step=2, epoch=2, history=[])
    for name in ("state.json", "ckpt-000000002.state.json"):
        path = os.path.join(directory, name)
        state = json.load(open(path))
        state["step"] = "x"
        json.dump(state, open(path, "w"))
    with pytest.warns(UserWarning, match="not readable"):
        assert checkpoints.Checkpointer(directory).latest()["step"] == 1


# --- Round five: foreign, cut-short and impossible checkpoints ---------------------
def _straight_equal(result, straight):
    """The resumed run ends exactly as the run trained straight through."""
    assert result["steps"] == 12
    assert [r["loss"] for r in result["history"]] == [r["loss"] for r in straight["history"]]
    ours = keras.models.load_model(result["model_path"]).get_weights()
    reference = keras.models.load_model(straight["model_path"]).get_weights()
    assert all(np.array_equal(a, b) for a, b in zip(ours, reference))


@pytest.fixture(scope="module")
def other_runs(tmp_path_factory):
    """Two 3-epoch runs (checkpoints at 8 and 12) of other flags: another
    learning rate, another depth."""
    root = tmp_path_factory.mktemp("others")
    train(_config(root / "lr", epochs=3, learning_rate=0.02), quiet)
    train(_config(root / "depth", epochs=3, depth=4), quiet)
    return root


@pytest.mark.parametrize("other, flag", [("lr", "learning_rate: 0.02 != 0.05"),
                                         ("depth", "depth: 4 != 3")])
def test_a_checkpoint_copied_in_from_a_run_with_other_flags_is_refused(
        tmp_path, two_epochs, other_runs, other, flag):
    """run.json is this run's, but the newest checkpoint (and the index naming
    it) are another run's: refused naming the checkpoint and the flag."""
    finished, _ = two_epochs
    run = _copy(finished, tmp_path)
    for name in ("ckpt-000000012.weights.h5", "ckpt-000000012.state.json", "state.json"):
        shutil.copy(other_runs / other / "checkpoints" / name, run / "checkpoints" / name)
    files = _digests(run)
    with pytest.raises(ConfigError) as error:
        train(_config(run, epochs=4), quiet)
    message = str(error.value)
    assert "\n" not in message and flag in message, message
    assert "ckpt-000000012.weights.h5 was trained with other flags" in message
    assert _digests(run) == files


def test_a_checkpoint_that_does_not_hold_the_models_variables_is_not_loaded(tmp_path):
    """Keras only warns when a file's optimizer variables do not match (and
    loads the rest): the checkpointer refuses such a file."""
    directory = str(tmp_path / "checkpoints")
    bigger = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2), keras.layers.Dense(2)])
    bigger.compile(optimizer=keras.optimizers.SGD(momentum=0.9), loss="mse")
    bigger.optimizer.build(bigger.trainable_variables)
    checkpoints.Checkpointer(directory).save(bigger, step=1, epoch=1, history=[])
    smaller = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
    smaller.compile(optimizer=keras.optimizers.SGD(momentum=0.9), loss="mse")
    with pytest.raises(checkpoints.CheckpointError,
                       match=r"no checkpoint in .* can be read: ckpt-000000001.weights.h5 "
                             r"\((ValueError)\)"):
        checkpoints.Checkpointer(directory).restore(smaller)


def test_a_checkpoints_folder_linked_to_another_runs_folder_is_refused_untouched(
        tmp_path, two_epochs):
    finished, _ = two_epochs
    other = _copy(finished, tmp_path, "other")
    run = tmp_path / "run"
    run.mkdir()
    os.symlink(other / "checkpoints", run / "checkpoints")
    files = _digests(other)
    with pytest.raises(ConfigError) as error:
        train(_config(run, epochs=3), quiet)
    message = str(error.value)
    assert "\n" not in message and "checkpoints is a symbolic link (to " in message
    assert _digests(other) == files and not (run / "run.json").exists()


@pytest.mark.parametrize("layout, expected", [
    ("dangling link", "checkpoints is a symbolic link (to "),
    ("a file", "checkpoints is not a folder (a file)"),
    ("state.json a folder", "state.json is not a regular file (a folder)"),
])
def test_an_impossible_checkpoint_folder_is_refused_before_training(
        tmp_path, two_epochs, layout, expected):
    finished, _ = two_epochs
    run = tmp_path / "run"
    if layout == "dangling link":
        run.mkdir()
        os.symlink(tmp_path / "nowhere", run / "checkpoints")
    elif layout == "a file":
        run.mkdir()
        (run / "checkpoints").write_text("x")
    else:
        _copy(finished, tmp_path)
        (run / "checkpoints" / "state.json").unlink()
        (run / "checkpoints" / "state.json").mkdir()
    lines = []
    with pytest.raises(ConfigError, match=re.escape(expected)):
        train(_config(run, epochs=3), lines.append)
    assert not any(line.startswith("epoch ") for line in lines)   # before any training


def _edit(path, **changes):
    state = json.loads(path.read_text())
    state.update(changes)
    path.write_text(json.dumps(state))


def _index_and_own(run, **changes):
    for name in ("state.json", "ckpt-000000008.state.json"):
        _edit(run / "checkpoints" / name, **changes)


def _fifo(run):
    path = run / "checkpoints" / "ckpt-000000008.weights.h5"
    path.unlink()
    os.mkfifo(path)


INDEX_DAMAGE = {
    # step, epoch or weights name that cannot be: ckpt-8 is passed over for ckpt-4.
    "step -5": (lambda run: _index_and_own(run, step=-5), 4),
    "step 64 edited to 80": (lambda run: _index_and_own(run, step=80), 4),
    "weights an absolute path": (lambda run: _index_and_own(
        run, weights=str(run / "elsewhere" / "ckpt-000000008.weights.h5")), 4),
    "weights a FIFO": (_fifo, 4),
    # state.json names a checkpoint that is not there: ckpt-8's own state is used.
    "index names a missing step 999,999,999": (lambda run: _edit(
        run / "checkpoints" / "state.json", step=999_999_999,
        weights="ckpt-999999999.weights.h5"), 8),
    "index at step 10**15": (lambda run: _edit(
        run / "checkpoints" / "state.json", step=10 ** 15,
        weights=f"ckpt-{10 ** 15:09d}.weights.h5"), 8),
}


@pytest.mark.parametrize("damage", sorted(INDEX_DAMAGE))
def test_a_state_that_cannot_be_is_passed_over_and_the_run_ends_as_uninterrupted(
        tmp_path, two_epochs, damage):
    finished, straight = two_epochs
    run = _copy(finished, tmp_path)
    harm, resumed_at = INDEX_DAMAGE[damage]
    harm(run)
    lines = []
    with pytest.warns(UserWarning):
        result = train(_config(run, epochs=3), lines.append)
    assert any(f"resuming from the checkpoint at step {resumed_at} " in line
               for line in lines), lines
    _straight_equal(result, straight)


@pytest.mark.parametrize("partial", ["whole", "cut short"])
def test_a_checkpoint_killed_while_its_state_was_written(tmp_path, two_epochs, partial):
    """SIGKILL between a checkpoint's weights and its state: a whole
    ``.partial`` state completes it; one cut short leaves the run to
    continue from the checkpoint before (here: none, the run's start)."""
    finished, straight = two_epochs
    run = _copy(finished, tmp_path)
    directory = run / "checkpoints"
    for name in ("ckpt-000000008.weights.h5", "ckpt-000000008.state.json", "state.json"):
        (directory / name).unlink()
    own = directory / "ckpt-000000004.state.json"
    text = own.read_text()
    own.unlink()
    (directory / "ckpt-000000004.state.json.partial").write_text(
        text if partial == "whole" else text[:20])
    lines = []
    with pytest.warns(UserWarning):
        result = train(_config(run, epochs=3), lines.append)
    resumed = [line for line in lines if line.startswith("resuming from")]
    assert resumed == (["resuming from the checkpoint at step 4 (end of epoch 1) in "
                        f"{directory}"] if partial == "whole" else [])
    _straight_equal(result, straight)
    if partial == "cut short":   # what it did not write is kept, under another name
        assert (directory / "ckpt-000000004.weights.h5.unread").exists()


@pytest.fixture
def small_mount(tmp_path):
    """A 256 KiB tmpfs (root only; skipped elsewhere), unmounted after."""
    import subprocess

    mount = tmp_path / "mount"
    mount.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=256k", "tmpfs", str(mount)],
                      capture_output=True).returncode:
        pytest.skip("cannot mount a tmpfs here (needs root)")
    yield mount
    subprocess.run(["umount", str(mount)], capture_output=True)


FILL_SCRIPT = """
import collections, shutil, sys
import keras
from keras_identity.training import checkpoints
model = keras.Sequential([keras.Input((100,)), keras.layers.Dense(1000), keras.layers.Dense(10)])
model.compile(optimizer="sgd", loss="mse")
Usage = collections.namedtuple("Usage", "total used free")
shutil.disk_usage = lambda path: Usage(2 ** 40, 0, 2 ** 40)   # it fills after the check
try:
    checkpoints.Checkpointer(sys.argv[1]).save(model, step=1, epoch=0, history=[])
except checkpoints.WriteError as error:
    print("WriteError:", error)
"""


def test_a_disk_that_fills_during_the_write_is_one_line_not_a_crash(small_mount):
    import subprocess
    import sys

    directory = small_mount / "checkpoints"
    done = subprocess.run([sys.executable, "-c", FILL_SCRIPT, str(directory)],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]   # was 139: h5py crashed at exit
    lines = [line for line in done.stdout.splitlines() if line]
    assert len(lines) == 1 and "No space left on device" in lines[0], done.stdout
    assert "free space and run the same command" in lines[0]
    assert os.listdir(directory) == []   # no partial file left


def test_a_read_only_checkpoint_folder_is_refused_before_training_not_told_to_free_space(
        tmp_path, two_epochs):
    import subprocess

    finished, _ = two_epochs
    run = _copy(finished, tmp_path)
    directory = run / "checkpoints"
    if subprocess.run(["mount", "--bind", "-o", "ro", str(directory), str(directory)],
                      capture_output=True).returncode:
        pytest.skip("cannot bind-mount read-only here (needs root)")
    try:
        lines = []
        with pytest.raises(ConfigError) as error:
            train(_config(run, epochs=3), lines.append)
    finally:
        subprocess.run(["umount", str(directory)], capture_output=True)
    message = str(error.value)
    assert "the checkpoint folder=" in message and "not a writable directory" in message
    assert "Read-only file system" in message and "free space" not in message
    assert not any(line.startswith("epoch ") for line in lines)


def test_a_write_refused_for_permission_is_not_told_to_free_space(tmp_path, monkeypatch):
    directory = str(tmp_path / "checkpoints")
    saver = checkpoints.Checkpointer(directory)
    model = _tiny_model()
    saver.save(model, step=1, epoch=1, history=[])
    real = os.replace

    def refused(source, target):
        if target.endswith(".weights.h5"):
            raise PermissionError(13, "Permission denied")
        return real(source, target)

    monkeypatch.setattr(os, "replace", refused)
    with pytest.raises(checkpoints.WriteError) as error:
        saver.save(model, step=2, epoch=2, history=[])
    message = str(error.value)
    assert "(Permission denied)" in message and "free space" not in message
    assert f"the checkpoint of step 1 is intact: make {directory} writable" in message
    monkeypatch.undo()
    assert sorted(os.listdir(directory)) == ["ckpt-000000001.state.json",
                                             "ckpt-000000001.weights.h5", "state.json"]


# --- the run's identity: a changed input never silently resumes a run --------

def _small(tmp_path, **kwargs):
    base = dict(model="highway_net", depth=3, train_examples=256, test_examples=64,
                epochs=1, batch_size=64, verbose=0, model_dir=str(tmp_path / "run"))
    base.update(kwargs)
    return TrainConfig(**base)


def test_refuses_to_resume_with_other_flags(tmp_path):
    base = dict(model="highway_net", train_examples=200, test_examples=50, epochs=1,
                verbose=0, model_dir=str(tmp_path))
    train(TrainConfig(depth=3, **base), quiet)
    with pytest.raises(ConfigError, match=r"other flags \(depth: 3 != 4\)"):
        train(TrainConfig(depth=4, **base), quiet)


def test_resume_compares_builder_arguments_one_by_one(tmp_path):
    config = TrainConfig(model="highway_net", depth=3, train_examples=256, test_examples=64,
                         model_kwargs=dict(transform_bias_init=-2.0),
                         model_dir=str(tmp_path / "run"))
    first = prepare(config)
    first.lock.release()
    (tmp_path / "run" / run_files.RUN_FILE).write_text(json.dumps({"identity": first.identity}))
    prepare(config).lock.release()
    other = dataclasses.replace(config, model_kwargs=dict(transform_bias_init=-3.0))
    with pytest.raises(ConfigError, match=r"transform_bias_init: -2.0 != -3.0"):
        prepare(other)


def test_resume_refuses_changed_inputs_before_writing_anything(tmp_path):
    train(_small(tmp_path, epochs=2), quiet)
    run = tmp_path / "run"
    written = {name: (run / name).read_bytes() for name in
               ("config.json", "preprocessing.json", "run.json")}
    other = tmp_path / "other.npz"
    rng = np.random.default_rng(1)
    np.savez(other, x_train=rng.integers(0, 256, (300, 28, 28), dtype=np.uint8),
             y_train=rng.integers(0, 10, 300), x_test=rng.integers(0, 256, (80, 28, 28),
                                                                  dtype=np.uint8),
             y_test=rng.integers(0, 10, 80))
    changed = _small(tmp_path, epochs=3, normalization="per_channel", data_dir=str(other),
                     learning_rate=5.0)
    with pytest.raises(ConfigError) as error:
        train(changed, quiet)
    message = str(error.value)
    for word in ("data_dir: 'sha256:", "learning_rate: 0.05 != 5.0",
                 "normalization: 'scale' != 'per_channel'"):
        assert word in message
    assert "\n" not in message and "epochs:" not in message
    for name, content in written.items():
        assert (run / name).read_bytes() == content, name
    for flags in (dict(momentum=0.5), dict(seed=1), dict(augmentation="cifar"),
                  dict(model_kwargs=dict(transform_bias_init=-3.0)),
                  dict(precision="mixed_bfloat16"), dict(train_examples=200)):
        with pytest.raises(ConfigError, match="other flags"):
            train(_small(tmp_path, epochs=3, **flags), quiet)

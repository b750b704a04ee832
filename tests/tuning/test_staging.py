"""The bucket staging (``keras_identity.tuning.staging``): a search whose
``--model_dir`` is a bucket (``gs://``, a local GCS emulator:
the ``gcs_emulator`` fixture): every file of the search in the bucket and
nothing on the machine (Keras Tuner works in a staging folder that is gone
when the program ends), and the same command on a fresh machine continues
the search from the bucket without running a finished trial again.  Also
the training curves of runs in a bucket.  On the backend the leg runs."""

import os
import subprocess
import sys

import pytest

from keras_identity import storage
from tests.training.test_bucket_runs import _env
from tests.programs import files_left
from tests.training.test_bucket_runs import _machine
from tests.tuning.searches import stop_in_the_second_trial

FLAGS = ["--model=highway_net", "--depth=4", "--train_examples=3000", "--epochs=1",
         "--gate_biases=0,-2", "--verbose=0"]


def _tune(gcs_emulator, machine, model_dir, *extra):
    cwd, tmp = machine
    return subprocess.run([sys.executable, "-m", "keras_identity_cli.tune", *FLAGS,
                           f"--model_dir={model_dir}", *extra], cwd=cwd,
                          env=_env(gcs_emulator, tmp), capture_output=True, text=True,
                          timeout=600)


def test_a_search_in_a_bucket_keeps_its_files_there_and_continues_on_another_machine(
        gcs_emulator, tmp_path):
    model_dir = gcs_emulator("tune")
    first = _machine(tmp_path, "first")
    done = _tune(gcs_emulator, first, model_dir, "--max_trials=1")
    assert done.returncode == 0, done.stderr[-3000:]
    files = storage.list_files(model_dir)
    assert {"search.json", "results.csv", "results.md", "val_error_vs_gate_bias.png",
            "search/oracle.json", "search/records_per_trial.json",
            "search/trial_0/trial.json"} <= set(files), files
    assert not [f for f in files if "progress" in f or "partial" in f], files
    assert files_left(first) == []   # no staging folder, nothing in the working directory
    trial = storage.join(model_dir, "search", "trial_0", "trial.json")
    stamp = storage.generation(trial)

    second = _machine(tmp_path, "second")
    done = _tune(gcs_emulator, second, model_dir, "--max_trials=2")
    assert done.returncode == 0, done.stderr[-3000:]
    assert "continuing after 1 finished trials" in done.stdout
    assert storage.generation(trial) == stamp   # the finished trial was not run again
    assert len(storage.read_text(storage.join(model_dir, "results.csv")).splitlines()) == 3
    assert len(storage.read_json(storage.join(model_dir, "search",
                                              "records_per_trial.json"))) == 2
    assert files_left(second) == []


def test_curves_of_runs_in_a_bucket_are_drawn_into_the_bucket(gcs_emulator):
    from keras_identity.training import plot_errors
    from keras_identity.training import plot_runs

    base = gcs_emulator("curves")
    history = [{"step": s, "loss": 2.0 / s, "train_error": 0.5 / s, "test_error": 0.6 / s}
               for s in (1, 2, 3)]
    runs = [storage.join(base, name) for name in ("a", "b")]
    for run in runs:
        storage.write_json(storage.join(run, "history.json"), history)
    plot_runs(runs, storage.join(base, "runs.png"))
    plot_errors(runs, storage.join(base, "errors.png"))
    for name in ("runs.png", "errors.png"):
        assert storage.read_bytes(storage.join(base, name))[:4] == b"\x89PNG"


def test_a_stopped_trial_keeps_its_progress_in_the_bucket_and_resumes_from_it(
        gcs_emulator, tmp_path, monkeypatch):
    """SIGTERM in the second trial: its checkpoint is in the bucket (not in
    the staging folder, which is gone), and the search run again resumes the
    trial from it."""
    import tempfile

    from keras_identity.training import Stopped
    from keras_identity.training import TrainConfig
    from keras_identity.tuning import SearchConfig
    from keras_identity.tuning import run_search

    model_dir = gcs_emulator("stopped")
    staging = tmp_path / "tmp"
    staging.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(staging))

    def search():
        train = TrainConfig(model="highway_net", depth=4, train_examples=1280, epochs=2,
                            verbose=0, seed=1, steps_per_execution=1, model_dir=model_dir)
        return SearchConfig(train=train, gate_biases=(0.0, -2.0))

    with monkeypatch.context() as patch:
        stop_in_the_second_trial(patch)
        with pytest.raises(Stopped) as stopped:
            run_search(search(), print_fn=lambda *_: None)
    progress = stopped.value.directory
    assert progress.startswith(model_dir + "/search/trial_") and progress.endswith("progress")
    assert storage.exists(storage.join(progress, "state.json"))
    assert not _staging_folders(staging)
    lines = []
    rows = run_search(search(), print_fn=lines.append)["rows"]
    assert any(f"resumes from its checkpoint at step {stopped.value.step}" in line
               for line in lines), lines
    assert len(rows) == 2 and all(r["epochs"] == 2 for r in rows)
    assert not [f for f in storage.list_files(model_dir) if "/progress/" in f]
    assert not _staging_folders(staging)


def _staging_folders(folder):
    """The search's staging folders left in ``folder`` (TensorFlow's
    autograph keeps its own files there while the process runs)."""
    return [n for n in os.listdir(folder) if n.startswith("keras_identity")]

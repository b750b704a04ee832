import csv
import json
import os

import keras
import pytest

from keras_identity.training import ConfigError
from keras_identity.training import TrainConfig
from keras_identity.tuning import Range
from keras_identity.tuning import SearchConfig
from keras_identity.tuning import run_search


def quiet(*_):
    pass


def search_config(tmp_path, **kwargs):
    train = TrainConfig(model="highway_net", depth=4, train_examples=3000, epochs=1,
                        verbose=0, model_dir=str(tmp_path / "tune"))
    return SearchConfig(train=train, **kwargs)


def test_small_grid_search_writes_its_table_and_retrains_the_best(tmp_path):
    result = run_search(search_config(tmp_path, gate_biases=(0.0, -2.0, -4.0),
                                      retrain_best=True), print_fn=quiet)
    directory = tmp_path / "tune"
    rows = list(csv.DictReader(open(directory / "results.csv")))
    assert [float(r["gate_bias_init"]) for r in rows] == [0.0, -2.0, -4.0]
    for row in rows:
        assert 0.0 <= float(row["val_error"]) < 0.9   # better than chance
        assert int(row["epochs"]) == 1 and float(row["seconds"]) > 0
        assert row["note"] == ""
    table = (directory / "results.md").read_text()
    assert ("| b_g | val. error (%) | val. loss (last epoch) | train loss (last epoch) | epochs "
            "| time (s) | note |") in table
    assert "test error" in table  # the retraining line
    assert (directory / "val_error_vs_gate_bias.png").stat().st_size > 5000
    best = min(result["rows"], key=lambda r: r["val_error"])
    assert result["best"] == {"gate_bias_init": best["gate_bias_init"]}
    retrain = result["retrain"]
    assert 0.0 < retrain["test_error"] < 0.5
    assert retrain["steps"] == 3000 // 128   # the whole (subset) training set, one epoch


def test_search_continues_without_redoing_finished_trials(tmp_path):
    first = run_search(search_config(tmp_path, gate_biases=(0.0, -1.0, -2.0), max_trials=2),
                       print_fn=quiet)
    assert len(first["rows"]) == 2
    trial_dir = tmp_path / "tune" / "search"
    stamps = {p: os.path.getmtime(trial_dir / p / "trial.json")
              for p in os.listdir(trial_dir) if (trial_dir / p).is_dir()}
    lines = []
    second = run_search(search_config(tmp_path, gate_biases=(0.0, -1.0, -2.0), max_trials=3),
                        print_fn=lines.append)
    assert second["trials_before"] == 2
    assert any("continuing after 2 finished trials" in line for line in lines)
    assert len(second["rows"]) == 3
    for name, stamp in stamps.items():
        assert os.path.getmtime(trial_dir / name / "trial.json") == stamp
    assert sorted(r["gate_bias_init"] for r in second["rows"]) == [-2.0, -1.0, 0.0]


@pytest.mark.parametrize("tuner", ["random", "bayesian", "hyperband"])
def test_other_tuners(tmp_path, tuner):
    search = search_config(tmp_path, tuner=tuner, gate_biases=(0.0, -2.0, -4.0), max_trials=2)
    search.train.epochs = 2
    rows = run_search(search, print_fn=quiet)["rows"]
    if tuner != "hyperband":
        assert all(r["epochs"] == 2 for r in rows)
    assert rows and {r["gate_bias_init"] for r in rows} <= {0.0, -2.0, -4.0}
    if tuner != "hyperband":
        assert len(rows) == 2


def test_validation_split_keeps_the_test_set_out(tmp_path, monkeypatch):
    """Either backend's evaluation batches (tf.data or NumPy) come from the
    validation split of a dataset without its test set."""
    from keras_identity.training import trainer

    seen = []
    original = trainer.input_streams

    def spy(strategy, data, **kwargs):
        seen.append((kwargs.get("split"), data.x_test is None))
        return original(strategy, data, **kwargs)

    monkeypatch.setattr(trainer, "input_streams", spy)
    run_search(search_config(tmp_path, gate_biases=(-1.0,)), print_fn=quiet)
    assert seen and all(split == "val" and no_test for split, no_test in seen)


@pytest.mark.parametrize("kwargs, train_kwargs, words", [
    (dict(tuner="anneal"), {}, ["tuner='anneal'"]),
    (dict(), dict(strategy="multi_worker"), ["multi_worker"]),
    (dict(validation_split=0.0), {}, ["validation_split=0.0"]),
    (dict(max_trials=0), {}, ["max_trials=0"]),
    (dict(), dict(model="plain_net"), ["no gate bias"]),
    (dict(gate_biases=(-1.0,)), dict(model="plain_net"), ["gate_biases applies to"]),
    (dict(learning_rates=Range(1e-3, 1.0, True)), {}, ["learning_rates", "tuner='random'"]),
    (dict(tuner="random", momentums=Range(0.5, 0.9)), {}, ["momentums", "max_trials"]),
    (dict(objective="test_error"), {}, ["objective='test_error'"]),
    (dict(learning_rates=()), {}, ["learning_rates is empty"]),
    (dict(lr_decays=(0.9,)), dict(recipe="highway_mnist_conv"),
     ["lr_decays applies to recipes with an exponential schedule"]),
    (dict(depths=Range(3, 5)), {}, ["depths and activations take lists"]),
])
def test_bad_searches(tmp_path, kwargs, train_kwargs, words):
    search = search_config(tmp_path, **kwargs)
    for key, value in train_kwargs.items():
        setattr(search.train, key, value)
    with pytest.raises(ConfigError) as error:
        search.validate()
    for word in words:
        assert word in str(error.value)


@pytest.mark.parametrize("kwargs, train_kwargs, words", [
    (dict(gate_biases=(0.0, float("nan"))), {}, ["gate_biases=nan"]),
    (dict(learning_rates=(0.1, -0.1)), {}, ["learning_rates=-0.1"]),
    (dict(weight_decays=(-1.0,)), {}, ["weight_decays=-1.0"]),
    (dict(depths=(10.5,)), {}, ["depths=10.5"]),
])
def test_search_values_are_validated(tmp_path, kwargs, train_kwargs, words):
    search = search_config(tmp_path, **kwargs)
    with pytest.raises(ConfigError) as error:
        search.validate()
    for word in words:
        assert word in str(error.value)


def test_a_changed_search_space_is_refused_not_ignored(tmp_path):
    run_search(search_config(tmp_path, gate_biases=(0.0, -1.0), max_trials=1), print_fn=quiet)
    for kwargs, train_kwargs, word in [
            (dict(gate_biases=(0.0, -5.0)), {}, "gate_biases: [0.0, -1.0] != [0.0, -5.0]"),
            (dict(gate_biases=(0.0, -1.0)), dict(epochs=2), "epochs: 1 != 2"),
            (dict(gate_biases=(0.0, -1.0)), dict(train_examples=2000),
             "train_examples: 3000 != 2000")]:
        search = search_config(tmp_path, max_trials=2, **kwargs)
        for key, value in train_kwargs.items():
            setattr(search.train, key, value)
        with pytest.raises(ConfigError) as error:
            run_search(search, print_fn=quiet)
        assert "holds another search" in str(error.value) and word in str(error.value)


def test_random_search_of_the_depth_study_space(tmp_path):
    """Srivastava et al.'s Fig. 1 protocol on a plain net: ranges, an
    activation choice, judged by the best training loss; the best values are
    retrained."""
    train = TrainConfig(model="plain_net", depth=3, train_examples=2000, epochs=1, verbose=0,
                        model_dir=str(tmp_path / "tune"))
    search = SearchConfig(train=train, tuner="random", max_trials=3,
                          learning_rates=Range(1e-3, 0.3, log=True),
                          momentums=Range(0.5, 0.95), lr_decays=Range(0.8, 1.0),
                          activations=("relu", "tanh"), objective="train_loss",
                          retrain_best=True)
    lines = []
    result = run_search(search, print_fn=lines.append)
    rows = result["rows"]
    assert len(rows) == 3
    for row in rows:
        assert 1e-3 <= row["learning_rate"] <= 0.3 and 0.5 <= row["momentum"] <= 0.95
        assert 0.8 <= row["lr_decay"] <= 1.0 and row["activation"] in ("relu", "tanh")
        assert 0.0 <= row["train_error"] <= 1.0 and row["best_train_loss"] > 0
    losses = [r["best_train_loss"] for r in rows]
    assert losses == sorted(losses)   # best first
    assert result["best"] == {k: rows[0][k] for k in ("learning_rate", "momentum",
                                                      "lr_decay", "activation")}
    assert any("judged by the best epoch's train loss" in line for line in lines)
    directory = tmp_path / "tune"
    assert (directory / "train_loss_vs_learning_rate.png").stat().st_size > 5000
    table = (directory / "results.md").read_text()
    assert "| learning_rate | momentum | lr decay | activation |" in table
    retrained = result["retrain"]
    # The retraining has its own directory per best trial (more trials may
    # find other values).
    assert retrained["model_dir"] == str(directory / "retrain_best" / f"trial_{rows[0]['trial']}")
    config = json.load(open(os.path.join(retrained["model_dir"], "config.json")))
    assert config["lr_decay"] == pytest.approx(rows[0]["lr_decay"])
    assert config["model_kwargs"]["activation"] == rows[0]["activation"]
    assert 0.0 < retrained["test_error"] < 0.9


def test_a_fixed_gate_bias_is_not_searched_by_default(tmp_path):
    search = search_config(tmp_path, learning_rates=(0.05,))
    search.train.model_kwargs = {"transform_bias_init": -3.0}
    assert search.validate().space == {"learning_rate": (0.05,)}
    search.gate_biases = (-1.0, -2.0)
    with pytest.raises(ConfigError, match="gate_bias_init is both fixed and searched"):
        search.validate()


@pytest.mark.parametrize("objective", ["val_error", "train_loss"])
def test_no_retraining_when_every_trial_diverged(tmp_path, objective):
    # Under train_loss Keras Tuner marks the trial FAILED (a NaN objective);
    # it is still listed, as diverged.  (At lr 1e38 the logits overflow: the
    # loss is NaN or infinite, depending on the backend and the CPU's kernels;
    # at 1e30 it stays finite, ~1e29, on some CPUs.)
    train = TrainConfig(model="plain_net", depth=3, train_examples=1000, epochs=1, verbose=0,
                        model_dir=str(tmp_path / "tune"))
    lines = []
    result = run_search(SearchConfig(train=train, learning_rates=(1e38,), retrain_best=True,
                                     objective=objective), print_fn=lines.append)
    [row] = result["rows"]
    assert row["note"] in ("diverged (NaN loss)", "diverged (infinite loss)")
    assert row["note"] == ("diverged (NaN loss)" if row["train_loss"] != row["train_loss"]
                           else "diverged (infinite loss)")
    assert result["retrain"] is None and "not retraining: every trial diverged." in lines


def test_a_stop_signal_saves_the_trial_in_progress_and_the_search_resumes_it(tmp_path,
                                                                             monkeypatch):
    """SIGTERM in the middle of the second trial: the search stops after the
    step in progress with the trial's checkpoint; run again, it finishes
    that trial from the checkpoint (not from its start) and the search, with
    the results of a search never stopped."""
    from keras_identity.training import Stopped

    def config(name):
        search = search_config(tmp_path / name, gate_biases=(0.0, -2.0))
        search.train.epochs, search.train.train_examples = 2, 1280
        search.train.deterministic, search.train.seed = True, 1
        search.train.steps_per_execution = 1
        return search

    straight = run_search(config("straight"), print_fn=quiet)["rows"]
    with monkeypatch.context() as patch:
        stop_in_the_second_trial(patch)
        with pytest.raises(Stopped) as stopped:
            run_search(config("stopped"), print_fn=quiet)
    # The JAX route decides beside the next steps: a few more may run first.
    step = stopped.value.step
    assert step == 13 or (keras.backend.backend() == "jax" and 13 <= step <= 18)
    assert stopped.value.directory.endswith("progress")
    lines = []
    resumed = run_search(config("stopped"), print_fn=lines.append)["rows"]
    assert any(f"resumes from its checkpoint at step {step}" in line for line in lines), lines
    assert len(resumed) == len(straight) == 2
    for ours, theirs in zip(sorted(resumed, key=lambda r: r["gate_bias_init"]),
                            sorted(straight, key=lambda r: r["gate_bias_init"])):
        assert ours["val_error"] == pytest.approx(theirs["val_error"], abs=1e-6)
        assert ours["epochs"] == theirs["epochs"] == 2
    assert not list((tmp_path / "stopped" / "tune" / "search").glob("trial_*/progress"))


def tiny_search(tmp_path, name, gate_biases, **kwargs):
    """A search small enough for several runs in one test: 1,280 training
    images (9 steps an epoch), one epoch, deterministic."""
    search = search_config(tmp_path / name, gate_biases=gate_biases, **kwargs)
    search.train.train_examples = 1280
    search.train.deterministic, search.train.seed = True, 1
    search.train.steps_per_execution = 1
    return search


def test_a_trials_result_does_not_depend_on_the_trials_before_it(tmp_path):
    """A trial's result is a function of its values and the seed: the second
    point of a grid equals a search of that point alone (as when a search
    resumed after a stop runs it first in its process)."""
    both = run_search(tiny_search(tmp_path, "both", (0.0, -2.0)), print_fn=quiet)["rows"]
    alone = run_search(tiny_search(tmp_path, "alone", (-2.0,)), print_fn=quiet)["rows"]
    [second] = [r for r in both if r["gate_bias_init"] == -2.0]
    assert second["val_loss"] == pytest.approx(alone[0]["val_loss"], abs=1e-6)
    assert second["train_loss"] == pytest.approx(alone[0]["train_loss"], abs=1e-6)
    assert second["val_error"] == pytest.approx(alone[0]["val_error"], abs=1e-6)


def stop_at(patch, method, when):
    """Patches ``InEpochCheckpoints.<method>`` to send this process SIGTERM
    (once) before the call where ``when(self, *args)`` is true."""
    import signal

    from keras_identity.training import preemption

    original = getattr(preemption.InEpochCheckpoints, method)
    sent = []

    def hook(self, *args, **kwargs):
        if not sent and when(self, *args):
            sent.append(True)
            os.kill(os.getpid(), signal.SIGTERM)
        return original(self, *args, **kwargs)

    patch.setattr(preemption.InEpochCheckpoints, method, hook)
    return sent


def stop_in_the_second_trial(patch):
    """SIGTERM at the 31st training batch of a search of 2-epoch trials of 9
    steps an epoch: the second trial, 4 steps into its epoch 2."""
    calls = []

    def when(self, *args):
        calls.append(True)
        return len(calls) == 18 + 13

    return stop_at(patch, "on_train_batch_end", when)


@pytest.mark.parametrize("damage", ["state_cut_short", "weights_garbled"])
def test_a_trial_whose_progress_cannot_be_read_runs_again_from_its_start(tmp_path, monkeypatch,
                                                                         damage):
    """A search killed while a trial's checkpoint was written (its weights
    file and a ``.state.json.partial``, no state; or a weights file that
    cannot be read): the next run runs that trial again, never FAILED."""
    from keras_identity.tuning import SearchStopped

    with monkeypatch.context() as patch:
        stop_at(patch, "on_train_batch_end", lambda self, batch, *_: batch == 3)
        with pytest.raises(SearchStopped):
            run_search(tiny_search(tmp_path, "s", (-2.0,)), print_fn=quiet)
    [progress] = (tmp_path / "s" / "tune" / "search").glob("trial_*/progress")
    [weights] = progress.glob("ckpt-*.weights.h5")
    state = weights.name.replace(".weights.h5", ".state.json")
    if damage == "state_cut_short":   # the kill came before any state was whole
        text = (progress / state).read_text()
        for name in (state, "state.json"):
            (progress / name).unlink()
        (progress / (state + ".partial")).write_text(text[:len(text) // 2])
    else:
        weights.write_bytes(b"not HDF5" * 64)
    lines = []
    [row] = run_search(tiny_search(tmp_path, "s", (-2.0,)), print_fn=lines.append)["rows"]
    assert row["note"] == "" and row["epochs"] == 1 and 0.0 <= row["val_error"] < 0.9
    assert not any("resumes from its checkpoint" in line for line in lines), lines
    if damage == "weights_garbled":
        assert any("its progress cannot be read" in line and "starts again from its start"
                   in line for line in lines), lines
    assert not list((tmp_path / "s" / "tune" / "search").glob("trial_*/progress"))
    assert len(list(csv.DictReader(open(tmp_path / "s" / "tune" / "results.csv")))) == 1


def test_a_failed_trial_is_noted_and_the_next_run_retries_it(tmp_path, monkeypatch, capsys):
    """A trial that fails is told in one line (no traceback), leaves a row
    noting why, and the search does not end as complete (TrialsFailed:
    keras-identity-tune exits 1); the next run retries it (and not the
    others)."""
    from keras_identity.tuning import TrialsFailed
    from keras_identity.tuning import search as search_lib

    original = search_lib.TrialProgress.fit
    calls = []

    def fail_first(self, *args, **kwargs):
        calls.append(1)
        if len(calls) == 1:
            raise RuntimeError("the disk went away")
        return original(self, *args, **kwargs)

    with monkeypatch.context() as patch:
        patch.setattr(search_lib.TrialProgress, "fit", fail_first)
        lines = []
        with pytest.raises(TrialsFailed) as failed:
            run_search(tiny_search(tmp_path, "s", (0.0, -2.0)), print_fn=lines.append)
    assert any("(gate bias 0) failed: RuntimeError: the disk went away" in line
               for line in lines), lines
    assert "Traceback" not in capsys.readouterr().err
    assert "1 of 2 trials failed" in str(failed.value)
    assert "RuntimeError: the disk went away" in str(failed.value)
    directory = tmp_path / "s" / "tune"
    rows = list(csv.DictReader(open(directory / "results.csv")))
    assert [r["note"] for r in rows] == ["failed (RuntimeError: the disk went away)", ""]
    assert "1 of 2 trials failed" in (directory / "results.md").read_text()
    done = directory / "search" / f"trial_{rows[1]['trial']}" / "trial.json"
    stamp = os.path.getmtime(done)
    lines = []
    result = run_search(tiny_search(tmp_path, "s", (0.0, -2.0)), print_fn=lines.append)
    assert any(f"trial {rows[0]['trial']} (gate bias 0) failed in an earlier run" in line
               for line in lines), lines
    assert [r["note"] for r in result["rows"]] == ["", ""]
    assert [r["trial"] for r in result["rows"]] == [r["trial"] for r in rows]
    assert os.path.getmtime(done) == stamp   # not run again
    assert "failed" not in (directory / "results.md").read_text()


def test_a_stop_at_the_searchs_last_evaluation_stops_before_the_retraining(tmp_path,
                                                                          monkeypatch):
    """A signal acknowledged at a trial's last evaluation lets that trial
    end: the next trial does not start, and after the search's last trial the
    program stops (status 75) before the retraining, the results written;
    the next run retrains without searching again."""
    from keras_identity.tuning import SearchStopped

    def config():
        return tiny_search(tmp_path, "s", (0.0, -2.0), retrain_best=True)

    directory = tmp_path / "s" / "tune"
    for phase, trials in [("between trials", 1), ("before the retraining", 2)]:
        with monkeypatch.context() as patch:
            stop_at(patch, "on_epoch_end", lambda self, epoch, *_: True)
            with pytest.raises(SearchStopped) as stopped:
                run_search(config(), print_fn=quiet)
        assert stopped.value.phase == phase
        records = json.loads((directory / "search" / "records_per_trial.json").read_text())
        assert len(records) == trials
    assert "run the same command to retrain the best values" in str(stopped.value)
    assert len(list(csv.DictReader(open(directory / "results.csv")))) == 2
    assert not (directory / "retrain_best").exists()
    lines = []
    result = run_search(config(), print_fn=lines.append)
    assert any("continuing after 2 finished trials" in line for line in lines)
    assert result["retrain"]["steps"] == 1280 // 128


def test_a_stop_during_the_retraining_says_the_same_command_resumes_it(tmp_path, monkeypatch):
    """The retraining is a training run of its own: stopped, its line says
    that the same command resumes it (not the search), and it does."""
    from keras_identity.training import trainer
    from keras_identity.tuning import SearchStopped

    retraining = []
    original = trainer.train

    def train(*args, **kwargs):
        retraining.append(True)
        return original(*args, **kwargs)

    def config():   # two epochs: on JAX the decision may come a few steps late
        return tiny_search(tmp_path, "s", (-2.0,), retrain_best=True, retrain_epochs=2)

    with monkeypatch.context() as patch:
        patch.setattr(trainer, "train", train)
        # Sent in the main thread (JAX runs the training's batch-end callbacks
        # beside the steps).
        stop_at(patch, "on_train_batch_begin", lambda self, batch, *_: retraining and batch == 2)
        with pytest.raises(SearchStopped) as stopped:
            run_search(config(), print_fn=quiet)
    message = str(stopped.value)
    assert stopped.value.phase == "retraining" and "retrain_best" in stopped.value.directory
    assert "running the same command resumes the retraining of gate bias -2" in message
    assert "the search continues with this trial" not in message
    assert 3 <= stopped.value.step <= 1280 // 128
    lines = []
    result = run_search(config(), print_fn=lines.append)
    assert any(f"resuming from the checkpoint at step {stopped.value.step}" in line
               for line in lines), lines
    assert result["retrain"]["steps"] == 2 * (1280 // 128)

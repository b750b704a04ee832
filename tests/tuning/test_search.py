import csv
import json
import os

import pytest

from keras_identity.training import TrainConfig
from keras_identity.tuning import Range
from keras_identity.tuning import SearchConfig
from keras_identity.tuning import run_search
from tests.tuning.searches import quiet
from tests.tuning.searches import search_config
from tests.tuning.searches import stop_at
from tests.tuning.searches import tiny_search


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


def test_validation_split_keeps_the_test_set_out(tmp_path, monkeypatch):
    """Either backend's evaluation batches (tf.data or NumPy) come from the
    validation split of a dataset without its test set."""
    from keras_identity.data import streams

    seen = []
    original = streams.input_streams

    def spy(data, **kwargs):
        seen.append((kwargs.get("split"), data.x_test is None))
        return original(data, **kwargs)

    monkeypatch.setattr(streams, "input_streams", spy)
    run_search(search_config(tmp_path, gate_biases=(-1.0,)), print_fn=quiet)
    assert seen and all(split == "val" and no_test for split, no_test in seen)


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
    assert 2 <= stopped.value.step <= 1280 // 128   # a signal before a call: stopped there
    lines = []
    result = run_search(config(), print_fn=lines.append)
    assert any(f"resuming from the checkpoint at step {stopped.value.step}" in line
               for line in lines), lines
    assert result["retrain"]["steps"] == 2 * (1280 // 128)

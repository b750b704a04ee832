import csv

import keras
import pytest

from keras_identity.tuning import run_search
from tests.tuning.searches import quiet
from tests.tuning.searches import search_config
from tests.tuning.searches import stop_at
from tests.tuning.searches import stop_in_the_second_trial
from tests.tuning.searches import tiny_search


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

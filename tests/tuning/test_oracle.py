import csv
import os

import pytest

from keras_identity.tuning import run_search
from tests.tuning.searches import quiet
from tests.tuning.searches import search_config
from tests.tuning.searches import tiny_search


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


def test_a_failed_trial_is_noted_and_the_next_run_retries_it(tmp_path, monkeypatch, capsys):
    """A trial that fails is told in one line (no traceback), leaves a row
    noting why, and the search does not end as complete (TrialsFailed:
    keras-identity-tune exits 1); the next run retries it (and not the
    others)."""
    from keras_identity.tuning import TrialsFailed
    from keras_identity.tuning import progress as progress_lib

    original = progress_lib.TrialProgress.fit
    calls = []

    def fail_first(self, *args, **kwargs):
        calls.append(1)
        if len(calls) == 1:
            raise RuntimeError("the disk went away")
        return original(self, *args, **kwargs)

    with monkeypatch.context() as patch:
        patch.setattr(progress_lib.TrialProgress, "fit", fail_first)
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

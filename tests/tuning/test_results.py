"""The rows, tables and plot of a search, from rows alone (no trial runs)."""

import csv
import math

from keras_identity.tuning.results import plot_name
from keras_identity.tuning.results import row_failed
from keras_identity.tuning.results import row_score
from keras_identity.tuning.results import row_values
from keras_identity.tuning.results import write_results


def row(trial, gate_bias, val_error, note=""):
    return {"trial": trial, "gate_bias_init": gate_bias, "val_error": val_error,
            "val_loss": 0.5, "train_loss": 0.25, "epochs": 1, "seconds": 3.0, "note": note}


def test_rows_are_judged_with_failed_and_diverged_trials_last():
    rows = [row("0", 0.0, 0.25), row("1", -2.0, math.nan, "diverged (NaN loss)"),
            row("2", -4.0, math.nan, "failed (RuntimeError: the disk went away)")]
    assert [row_score(r, "val_error") for r in rows] == [0.25, math.inf, math.inf]
    assert [row_failed(r) for r in rows] == [False, False, True]
    assert row_values(rows[0]) == {"gate_bias_init": 0.0}
    assert plot_name(rows) == "val_error_vs_gate_bias.png"
    assert plot_name([{"learning_rate": 0.1, "activation": "relu"}],
                     "train_loss") == "train_loss_vs_learning_rate.png"


def test_results_are_written_as_csv_a_table_and_a_plot(tmp_path):
    rows = [row("0", 0.0, 0.25), row("1", -2.0, 0.5, "diverged (NaN loss)"),
            row("2", -4.0, math.nan, "failed (RuntimeError: the disk went away)")]
    table = write_results(rows, str(tmp_path), "a title")
    written = list(csv.DictReader(open(tmp_path / "results.csv")))
    assert [r["trial"] for r in written] == ["0", "1", "2"]
    assert written[2]["note"] == "failed (RuntimeError: the disk went away)"
    assert table.splitlines()[0] == ("| b_g | val. error (%) | val. loss (last epoch) | "
                                     "train loss (last epoch) | epochs | time (s) | note |")
    assert "| 0 | 25.00 | 0.5000 | 0.2500 | 1 | 3 |  |" in table
    assert "1 of 3 trials failed" in table and "retries it." in table
    assert (tmp_path / "results.md").read_text() == f"a title\n\n{table}\n"
    assert (tmp_path / "val_error_vs_gate_bias.png").read_bytes()[:4] == b"\x89PNG"

"""What a search's trials found: a row per trial that ended
(:func:`trial_rows`: its values, results and note, a diverged or failed
trial noted), how rows are judged (:func:`row_score`, :func:`row_failed`,
:func:`row_values`), and the files written from them (:func:`write_results`:
results.csv, results.md and the plot, :func:`plot_name`)."""

import csv
import io
import math
import os

from keras_identity import storage
from keras_identity.tuning.hypermodel import DIMENSIONS
from keras_identity.tuning.oracle import failed_without_result
from keras_identity.tuning.oracle import failure
from keras_identity.tuning.staging import RECORDS


def trial_rows(tuner, objective="val_error"):
    """A row per trial that ended: its values, results and note
    ("diverged ...", or "failed (<error>)" for a trial with no result)."""
    path = os.path.join(tuner.project_dir, RECORDS)
    records = storage.read_json(path) if storage.exists(path) else {}
    rows = []
    nan = float("nan")
    for trial in tuner.oracle.trials.values():
        failed = failed_without_result(trial)
        # A trial whose objective is NaN (a diverged loss under the
        # train_loss objective) ends FAILED with its metrics recorded.
        if not failed and (trial.status not in ("COMPLETED", "FAILED") or
                           not trial.metrics.exists("val_accuracy")):
            continue
        values = trial.hyperparameters.values
        record = records.get(trial.trial_id, {})
        row = {"trial": trial.trial_id}
        row.update({name: values[name] for name in DIMENSIONS if name in values})
        loss = record.get("loss", nan)
        row["val_error"] = nan if failed else 1.0 - trial.metrics.get_best_value("val_accuracy")
        if objective != "val_error":
            row["train_error"] = (1.0 - trial.metrics.get_best_value("accuracy")
                                  if trial.metrics.exists("accuracy") else nan)
            row["best_train_loss"] = (trial.metrics.get_best_value("cross_entropy")
                                      if trial.metrics.exists("cross_entropy") else nan)
        row.update({
            "val_loss": record.get("val_loss", nan),
            "train_loss": loss,
            "epochs": record.get("epochs", 0),
            "seconds": record.get("seconds", nan),
            "note": f"failed ({failure(trial)})" if failed else _divergence(loss),
        })
        rows.append(row)
    if rows and "gate_bias_init" in rows[0] and objective == "val_error":
        rows.sort(key=lambda r: (-r["gate_bias_init"], r["trial"]))
    else:
        rows.sort(key=lambda r: (bool(r["note"]), row_score(r, objective), r["trial"]))
    return rows


def _divergence(loss):
    """The note of a trial whose last training loss is not finite (as the
    trainer's StopOnNaN judges a run), else ''."""
    if math.isnan(loss):
        return "diverged (NaN loss)"
    return "diverged (infinite loss)" if math.isinf(loss) else ""


def row_score(row, objective):
    """The row's objective, lower is better (NaN last)."""
    value = row[{"val_error": "val_error", "train_error": "train_error",
                 "train_loss": "best_train_loss"}[objective]]
    return value if value == value else float("inf")


def row_failed(row):
    """Whether the trial of ``row`` failed (its note says so)."""
    return row["note"].startswith("failed")


def row_values(row):
    """The searched values of a row."""
    return {k: row[k] for k in DIMENSIONS if k in row}


def write_results(rows, directory, title="", objective="val_error"):
    """results.csv, results.md and a plot (:func:`plot_name`, e.g.
    val_error_vs_gate_bias.png) in ``directory`` (a local folder or a
    bucket's)."""
    columns = list(rows[0])
    text = io.StringIO(newline="")
    writer = csv.DictWriter(text, fieldnames=columns)
    writer.writeheader()
    writer.writerows(rows)
    storage.write_text(storage.join(directory, "results.csv"), text.getvalue())
    header = {"gate_bias_init": "b_g", "val_error": "val. error (%)",
              "train_error": "best train error (%)", "best_train_loss": "best train loss",
              "val_loss": "val. loss (last epoch)", "train_loss": "train loss (last epoch)",
              "lr_decay": "lr decay", "seconds": "time (s)"}
    shown = [c for c in columns if c != "trial"]

    def cell(name, value):
        if name in ("val_error", "train_error"):
            return f"{100 * value:.2f}"
        if isinstance(value, float):
            if name in ("gate_bias_init", "weight_decay"):
                return f"{value:g}"
            if name in ("learning_rate", "momentum", "lr_decay"):
                return f"{value:.4g}"
            return f"{value:.4f}" if name.endswith("loss") else f"{value:.0f}"
        return str(value)

    lines = ["| " + " | ".join(header.get(c, c) for c in shown) + " |",
             "|" + "|".join(" --- " for _ in shown) + "|"]
    lines += ["| " + " | ".join(cell(c, r[c]) for c in shown) + " |" for r in rows]
    table = "\n".join(lines)
    failed = [r for r in rows if row_failed(r)]
    if failed:
        table += (f"\n\n{len(failed)} of {len(rows)} trials failed (no result; the note says "
                  f"why): the search is incomplete; running it again retries "
                  f"{'it' if len(failed) == 1 else 'them'}.")
    storage.write_text(storage.join(directory, "results.md"),
                       (f"{title}\n\n" if title else "") + table + "\n")
    _plot(rows, storage.join(directory, plot_name(rows, objective)), title, objective)
    return table


_AXIS = {"gate_bias_init": "initial gate bias b_g", "learning_rate": "learning rate",
         "val_error": "validation error (%)", "train_error": "best training error (%)",
         "train_loss": "best training loss (cross-entropy)"}


def plot_name(rows, objective="val_error"):
    """The file name of the search's plot: the objective against the gate
    bias (else the learning rate, else the first searched dimension)."""
    x = _plot_axis(rows)
    return f"{objective}_vs_{'gate_bias' if x == 'gate_bias_init' else x}.png"


def _plot_axis(rows):
    searched = [n for n in DIMENSIONS if n in rows[0] and n != "activation"]
    for name in ("gate_bias_init", "learning_rate"):
        if name in searched:
            return name
    return searched[0] if searched else "activation"


def _plot(rows, path, title, objective="val_error"):
    from keras_identity.training.plots import pyplot

    plt = pyplot()
    x_name = _plot_axis(rows)
    scale = 1.0 if objective == "train_loss" else 100.0

    def y(r):
        return scale * row_score(r, objective)

    fig, ax = plt.subplots(figsize=(6.5, 4))
    trained = [r for r in rows if not r["note"]]
    diverged = [r for r in rows if r["note"].startswith("diverged")]   # failed: not shown
    searched = [n for n in DIMENSIONS if n in rows[0]]
    if searched == ["gate_bias_init"] and objective == "val_error":
        best = {}   # the gate bias alone: the best trial per value, joined
        for r in trained:
            best[r[x_name]] = min(y(r), best.get(r[x_name], float("inf")))
        xs = sorted(best, reverse=True)
        ax.plot(xs, [best[x] for x in xs], "o-", color="tab:blue", label="trained")
    else:
        groups = sorted({r.get("activation", "") for r in trained})
        for group in groups:
            members = [r for r in trained if r.get("activation", "") == group]
            ax.plot([r[x_name] for r in members], [y(r) for r in members], "o",
                    label=f"trained ({group})" if group else "trained")
        if x_name == "learning_rate":
            ax.set_xscale("log")
    if diverged:
        # At their validation error for that objective, else at the top of
        # the trained trials' range (a diverged loss has no value to show).
        top = max((y(r) for r in trained), default=scale)
        ax.plot([r[x_name] for r in diverged],
                [scale * r["val_error"] if objective == "val_error" else top
                 for r in diverged], "x", color="tab:red", markersize=9,
                label="diverged (loss NaN or infinite)")
    ax.set_xlabel(_AXIS.get(x_name, x_name))
    ax.set_ylabel(_AXIS[objective])
    if x_name == "gate_bias_init":
        ax.invert_xaxis()
    ax.grid(alpha=0.3)
    ax.legend()
    if title:
        ax.set_title(title, fontsize=10)
    fig.tight_layout()
    with storage.staged(path) as local:
        fig.savefig(local, dpi=110)
    plt.close(fig)

"""The paper's protocol for the gate bias: search on a validation split of the
training set, then train the best value on the whole training set and report
its test error."""

import csv
import dataclasses
import itertools
import json
import os
import time

import keras
import keras_tuner

from keras_identity import _checks
from keras_identity.data import pipeline
from keras_identity.models import registry
from keras_identity.training import recipes as recipes_lib
from keras_identity.training import strategies
from keras_identity.training import trainer
from keras_identity.tuning.hypermodel import DEFAULT_GATE_BIASES
from keras_identity.tuning.hypermodel import GateBiasHyperModel
from keras_identity.tuning.hypermodel import check_tunable

TUNERS = ("grid", "random", "bayesian", "hyperband")
OBJECTIVE = keras_tuner.Objective("val_accuracy", direction="max")


RECORDS = "records_per_trial.json"


class _TimedTrials:
    """Records each trial's wall-clock time, epochs run and last-epoch losses
    in ``records_per_trial.json`` (Keras Tuner keeps only the best epoch's).

    The record is written after the oracle has ended and saved the trial, so
    a trial listed in the file is also complete on disk when a search is
    killed and resumed.
    """

    def run_trial(self, trial, *args, **kwargs):
        start = time.time()
        result = super().run_trial(trial, *args, **kwargs)
        histories = result if isinstance(result, list) else [result]
        logs = getattr(histories[-1], "history", {})
        if not hasattr(self, "_pending_records"):
            self._pending_records = {}
        self._pending_records[trial.trial_id] = {
            "seconds": time.time() - start,
            "epochs": len(logs.get("loss", [])),
            "loss": float(logs["loss"][-1]) if logs.get("loss") else float("nan"),
            "val_loss": float(logs["val_loss"][-1]) if logs.get("val_loss") else float("nan"),
        }
        return result

    def on_trial_end(self, trial):
        super().on_trial_end(trial)
        record = getattr(self, "_pending_records", {}).pop(trial.trial_id, None)
        if record is None:
            return
        path = os.path.join(self.project_dir, RECORDS)
        records = json.load(open(path)) if os.path.exists(path) else {}
        records[trial.trial_id] = record
        temporary = path + ".tmp"
        with open(temporary, "w") as f:
            json.dump(records, f)
        os.replace(temporary, path)


class GridOracle(keras_tuner.Oracle):
    """Every combination of the (all-``Choice``) space, in order.

    What has been tried is read from the recorded trials, so a search killed
    at any moment continues where it stopped.  (``keras_tuner.GridSearch``
    keeps its enumeration order in memory only, and in 1.4.8 fails with a
    ``KeyError`` when a search directory is reloaded.)
    """

    def populate_space(self, trial_id):
        space = self.get_space().space
        names = [hp.name for hp in space]
        tried = {tuple(trial.hyperparameters.values.get(n) for n in names)
                 for trial in self.trials.values() if trial.trial_id != trial_id}
        for values in itertools.product(*(hp.values for hp in space)):
            if values not in tried:
                return {"status": "RUNNING", "values": dict(zip(names, values))}
        return {"status": "STOPPED", "values": None}


_TUNER_CLASSES = {
    "grid": type("GridSearch", (_TimedTrials, keras_tuner.Tuner), {}),
    "random": type("RandomSearch", (_TimedTrials, keras_tuner.RandomSearch), {}),
    "bayesian": type("BayesianOptimization",
                     (_TimedTrials, keras_tuner.BayesianOptimization), {}),
    "hyperband": type("Hyperband", (_TimedTrials, keras_tuner.Hyperband), {}),
}


@dataclasses.dataclass
class SearchConfig:
    """A gate-bias search (the ``keras-identity-tune`` flags).

    ``train`` holds the model, dataset, recipe and trial length (its
    ``epochs``) and ``model_dir``, where the tuner keeps its state: running
    the same search again continues it.
    """

    train: trainer.TrainConfig
    tuner: str = "grid"
    max_trials: int = None
    validation_split: float = 0.1
    gate_biases: tuple = DEFAULT_GATE_BIASES
    learning_rates: tuple = None
    weight_decays: tuple = None
    depths: tuple = None
    retrain_best: bool = False
    retrain_epochs: int = None

    def validate(self):
        try:
            self.train.validate()
            check_tunable(self.train)
            if self.tuner not in TUNERS:
                raise ValueError(f"tuner={self.tuner!r} is not valid; expected one of: "
                                 f"{', '.join(repr(t) for t in TUNERS)}.")
            if self.train.strategy == "multi_worker":
                raise ValueError("strategy='multi_worker' is not supported for a search; "
                                 "use 'auto', 'mirrored' or 'tpu' (Keras Tuner distributes "
                                 "trials with its own KERASTUNER_* variables).")
            if self.max_trials is not None and self.max_trials < 1:
                raise ValueError(f"max_trials={self.max_trials!r} is not valid; expected an "
                                 f"integer >= 1.")
            if not 0.0 < self.validation_split < 1.0:
                raise ValueError(f"validation_split={self.validation_split!r} is not valid; "
                                 f"expected a number in (0, 1).")
            if not self.gate_biases:
                raise ValueError("gate_biases is empty; expected at least one value.")
            for value in self.gate_biases:
                _checks.check_range("gate_biases", value)
            for value in self.learning_rates or ():
                _checks.check_range("learning_rates", value, 0.0, low_inclusive=False)
            for value in self.weight_decays or ():
                _checks.check_range("weight_decays", value, 0.0)
            for value in self.depths or ():
                if isinstance(value, float) and value.is_integer():
                    value = int(value)
                _checks.check_positive_int("depths", value)
            if self.train.epochs is None:
                raise ValueError("a search needs epochs (per trial).")
        except trainer.ConfigError:
            raise
        except ValueError as error:
            raise trainer.ConfigError(str(error)) from None
        return self

    @property
    def space_size(self):
        size = len(self.gate_biases)
        for extra in (self.learning_rates, self.weight_decays, self.depths):
            size *= len(extra) if extra else 1
        return size


def _make_tuner(search, hypermodel, strategy, directory):
    common = dict(objective=OBJECTIVE, directory=directory, project_name="search",
                  overwrite=False, seed=search.train.seed,
                  # keras.distribution (JAX) is entered around the search instead.
                  distribution_strategy=None if isinstance(
                      strategy, strategies.KerasDistribution) else strategy)
    cls = _TUNER_CLASSES[search.tuner]
    if search.tuner == "grid":
        oracle = GridOracle(objective=OBJECTIVE, max_trials=search.max_trials or
                            search.space_size, seed=search.train.seed)
        common.pop("objective")
        common.pop("seed")
        return cls(oracle=oracle, hypermodel=hypermodel, **common)
    if search.tuner == "hyperband":
        return cls(hypermodel, max_epochs=search.train.epochs, factor=3, **common)
    max_trials = search.max_trials or search.space_size
    return cls(hypermodel, max_trials=max_trials, **common)


def _trial_rows(tuner):
    path = os.path.join(tuner.project_dir, RECORDS)
    records = json.load(open(path)) if os.path.exists(path) else {}
    rows = []
    for trial in tuner.oracle.trials.values():
        if trial.status != "COMPLETED" or not trial.metrics.exists("val_accuracy"):
            continue
        values = trial.hyperparameters.values
        record = records.get(trial.trial_id, {})
        nan = float("nan")
        row = {"trial": trial.trial_id, "gate_bias_init": values["gate_bias_init"]}
        for name in ("learning_rate", "weight_decay", "depth"):
            if name in values:
                row[name] = values[name]
        loss = record.get("loss", nan)
        row.update({
            "val_error": 1.0 - trial.metrics.get_best_value("val_accuracy"),
            "val_loss": record.get("val_loss", nan),
            "train_loss": loss,
            "epochs": record.get("epochs", 0),
            "seconds": record.get("seconds", nan),
            "note": "diverged (NaN loss)" if loss != loss else "",
        })
        rows.append(row)
    rows.sort(key=lambda r: (-r["gate_bias_init"], r["trial"]))
    return rows


def write_results(rows, directory, title=""):
    """results.csv, results.md and val_error_vs_gate_bias.png in ``directory``."""
    columns = list(rows[0])
    with open(os.path.join(directory, "results.csv"), "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=columns)
        writer.writeheader()
        writer.writerows(rows)
    header = {"gate_bias_init": "b_g", "val_error": "val. error (%)",
              "val_loss": "val. loss (last epoch)", "train_loss": "train loss (last epoch)",
              "seconds": "time (s)"}
    shown = [c for c in columns if c != "trial"]

    def cell(name, value):
        if name == "val_error":
            return f"{100 * value:.2f}"
        if isinstance(value, float):
            return f"{value:g}" if name in ("gate_bias_init", "learning_rate",
                                           "weight_decay") else f"{value:.4f}" \
                if name.endswith("loss") else f"{value:.0f}"
        return str(value)

    lines = ["| " + " | ".join(header.get(c, c) for c in shown) + " |",
             "|" + "|".join(" --- " for _ in shown) + "|"]
    lines += ["| " + " | ".join(cell(c, r[c]) for c in shown) + " |" for r in rows]
    table = "\n".join(lines)
    with open(os.path.join(directory, "results.md"), "w") as f:
        f.write((f"{title}\n\n" if title else "") + table + "\n")
    _plot(rows, os.path.join(directory, "val_error_vs_gate_bias.png"), title)
    return table


def _plot(rows, path, title):
    from keras_identity.training.plots import _pyplot

    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(6.5, 4))
    trained = [r for r in rows if not r["note"]]
    diverged = [r for r in rows if r["note"]]
    best = {}
    for r in trained:
        best[r["gate_bias_init"]] = min(100 * r["val_error"],
                                        best.get(r["gate_bias_init"], float("inf")))
    xs = sorted(best, reverse=True)
    ax.plot(xs, [best[x] for x in xs], "o-", color="tab:blue", label="trained")
    if diverged:
        ax.plot([r["gate_bias_init"] for r in diverged],
                [100 * r["val_error"] for r in diverged], "x", color="tab:red",
                markersize=9, label="diverged (NaN loss)")
    ax.set_xlabel("initial gate bias b_g")
    ax.set_ylabel("validation error (%)")
    ax.invert_xaxis()
    ax.grid(alpha=0.3)
    ax.legend()
    if title:
        ax.set_title(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


SEARCH_FILE = "search.json"


def search_identity(search, data, recipe):
    """What a search directory's trials depend on: its space, trial length,
    validation split, model, data and recipe (``max_trials`` may grow: more
    trials of the same search)."""
    config = search.train
    return {
        "tuner": search.tuner,
        "gate_biases": [float(v) for v in search.gate_biases],
        "learning_rates": [float(v) for v in search.learning_rates or ()],
        "weight_decays": [float(v) for v in search.weight_decays or ()],
        "depths": [int(v) for v in search.depths or ()],
        "epochs": config.epochs, "validation_split": search.validation_split,
        "model": config.model, "model_kwargs": config.builder_arguments(),
        "dataset": config.dataset, "data_dir": data.fingerprint,
        "train_examples": config.train_examples, "recipe": recipe.name,
        "batch_size": config.batch_size, "precision": config.precision,
        "seed": config.seed, "normalization": config.normalization,
        "augmentation": config.augmentation, "learning_rate": config.learning_rate,
        "momentum": config.momentum, "weight_decay": config.weight_decay,
        "warmup_steps": config.warmup_steps, "steps_per_epoch": config.steps_per_epoch,
        "deterministic": config.deterministic}


def _check_same_search(directory, identity):
    """Refuses a search directory that holds another search (one line naming
    what differs); records the identity of a new one."""
    path = os.path.join(directory, SEARCH_FILE)
    if os.path.exists(path):
        try:
            with open(path) as f:
                before = json.load(f)
        except (OSError, ValueError) as error:
            raise ValueError(f"{path} is not readable ({type(error).__name__}); use a new "
                             f"--model_dir.") from None
        diffs = trainer.differences(before, identity)
        if diffs:
            raise ValueError(f"model_dir={directory!r} holds another search "
                             f"({'; '.join(diffs)}); a search continues only with its own "
                             f"space and data; use a new --model_dir for this one.")
        return
    trainer._check_writable(directory)
    if os.listdir(directory):
        raise ValueError(f"model_dir={directory!r} is not empty and holds no {SEARCH_FILE} "
                         f"(a search started before searches were recorded, or other "
                         f"files); use a new --model_dir.")
    with open(path, "w") as f:
        json.dump(identity, f, indent=1)


def run_search(search, print_fn=print):
    """Runs (or continues) ``search``; returns rows, the best values and paths.

    Raises:
        ConfigError: a bad configuration or missing data (one line).
    """
    search.validate()
    config = search.train
    try:
        trainer._setup_precision_and_seed(config)
        strategy = strategies.get_strategy(config.strategy, config.tpu)
        full = trainer.load_data(config)
        data = full.with_validation_split(search.validation_split, seed=config.seed)
        recipe = recipes_lib.get_recipe(config.resolved_recipe)
        schedule = recipes_lib.resolve(
            recipe, num_train=data.num_train, batch_size=config.batch_size,
            depth=config.resolved_depth, learning_rate=config.learning_rate,
            epochs=config.epochs, steps_per_epoch=config.steps_per_epoch,
            warmup_steps=config.warmup_steps)
        trainer.check_global_batch(schedule, strategy)
        normalization = trainer.make_normalization(
            config.normalization or recipe.normalization, data)
        hypermodel = GateBiasHyperModel(
            config, data, recipe, schedule, gate_biases=search.gate_biases,
            learning_rates=search.learning_rates, weight_decays=search.weight_decays,
            depths=search.depths, normalization=normalization)
        _check_same_search(config.model_dir, search_identity(search, full, recipe))
    except trainer.ConfigError:
        raise
    except ValueError as error:
        raise trainer.ConfigError(str(error)) from None
    augmentation = config.augmentation or recipe.augmentation

    def make_train(input_context=None):
        return pipeline.train_dataset(
            data, batch_size=schedule.batch_size, normalization=normalization,
            augmentation=augmentation, seed=config.seed, input_context=input_context,
            raw_pixels=True)

    def make_val(input_context=None):
        return pipeline.eval_dataset(
            data, batch_size=schedule.batch_size, normalization=normalization, split="val",
            pad_to_batch=strategy.num_replicas_in_sync > 1
            or strategies.is_tpu(strategy), input_context=input_context, raw_pixels=True)

    tuner = _make_tuner(search, hypermodel, strategy, config.model_dir)
    done_before = len(_trial_rows(tuner))
    print_fn(f"{search.tuner} search of gate_bias_init over {search.gate_biases} "
             f"({search.space_size} configurations) for {config.model} "
             f"{config.resolved_depth or ''} on {data.name}: {data.num_train:,} training / "
             f"{len(data.y_val):,} validation images (the test set is not used), "
             f"{schedule.epochs} epochs of {schedule.steps_per_epoch} steps per trial; "
             f"{strategies.describe(strategy)}"
             + (f"; continuing after {done_before} finished trials" if done_before else ""))
    with strategies.fit_scope(strategy):
        tuner.search(pipeline.distribute(strategy, make_train), epochs=schedule.epochs,
                     steps_per_epoch=schedule.steps_per_epoch,
                     validation_data=pipeline.distribute(strategy, make_val),
                     callbacks=[keras.callbacks.TerminateOnNaN()], shuffle=False,
                     verbose=config.verbose)

    rows = _trial_rows(tuner)
    if not rows:
        raise RuntimeError("the search finished no trial.")
    title = (f"{config.model} {config.resolved_depth or ''} on {data.name}: validation error "
             f"against the initial gate bias")
    table = write_results(rows, config.model_dir, title)
    print_fn(table)
    finite = [r for r in rows if not r["note"]] or rows
    best_row = min(finite, key=lambda r: r["val_error"])
    best = {k: best_row[k] for k in ("gate_bias_init", "learning_rate", "weight_decay",
                                     "depth") if k in best_row}
    print_fn(f"best: {best} with validation error {100 * best_row['val_error']:.2f}%")
    result = {"rows": rows, "best": best, "best_val_error": best_row["val_error"],
              "model_dir": config.model_dir, "trials_before": done_before}
    if search.retrain_best:
        others = {k: v for k, v in best.items() if k != "gate_bias_init"}
        model_kwargs = dict(config.model_kwargs, **registry.kwargs_from_flags(
            config.model, gate_bias_init=best["gate_bias_init"]))
        retrain = dataclasses.replace(
            config, epochs=search.retrain_epochs or config.epochs,
            model_dir=os.path.join(config.model_dir, "retrain_best"),
            model_kwargs=model_kwargs, **others)
        print_fn(f"retraining {best} on the whole training set ...")
        outcome = trainer.train(retrain, print_fn=print_fn, strategy=strategy)
        result["retrain"] = outcome
        print_fn(f"best gate bias {best['gate_bias_init']:g}: test error "
                 f"{100 * outcome['test_error']:.2f}% (trained on all "
                 f"{full.num_train:,} training images)")
        with open(os.path.join(config.model_dir, "results.md"), "a") as f:
            f.write(f"\nRetrained with {best} on the whole training set for "
                    f"{retrain.epochs} epochs: test error "
                    f"{100 * outcome['test_error']:.2f}%.\n")
    return result

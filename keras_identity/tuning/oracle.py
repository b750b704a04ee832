"""Which trials a search runs and how they end: the tuners (:func:`make_tuner`:
Keras Tuner's, each recording its trials' times and losses and publishing the
tuner's folder as trials start and end), the grid's oracle
(:class:`GridOracle`, which reads what was tried from the recorded trials),
and the retry rules (:func:`failed_without_result`, :func:`failure`: a
trial that ended FAILED with no result; :func:`retry_failed` sends such
trials of an earlier run back to the oracle's retry queue)."""

import itertools
import json
import os
import time

import keras_tuner

from keras_identity import storage
from keras_identity.training import strategies
from keras_identity.tuning.config import OBJECTIVES
from keras_identity.tuning.config import describe_values
from keras_identity.tuning.hypermodel import DIMENSIONS
from keras_identity.tuning.progress import SearchStopped
from keras_identity.tuning.progress import UnreadableProgress
from keras_identity.tuning.staging import PROJECT
from keras_identity.tuning.staging import RECORDS


class _TimedTrials:
    """Records each trial's wall-clock time, epochs run and last-epoch losses
    in ``records_per_trial.json`` (Keras Tuner keeps only the best epoch's).

    The record is written after the oracle has ended and saved the trial, so
    a trial listed in the file is also complete on disk when a search is
    killed and resumed.  With the tuner's ``folder`` (a :class:`~keras_identity.tuning.staging.TunerFolder`),
    the tuner's files are published when a trial starts and ends.

    With the hypermodel's ``progress`` (a :class:`~keras_identity.tuning.progress.TrialProgress`), a trial
    does not start once a stop signal has arrived (:class:`~keras_identity.tuning.progress.SearchStopped`),
    a trial whose progress folder cannot be read is run again from its
    start, the folder removed (it is the trial's own scratch), and a trial
    that fails says so in one line (Keras Tuner keeps the traceback in the
    trial's ``trial.json``).
    """

    def run_trial(self, trial, *args, **kwargs):
        start = time.time()
        progress = getattr(self.hypermodel, "progress", None)
        if progress is None:
            result = super().run_trial(trial, *args, **kwargs)
        else:
            folder = getattr(self, "folder", None)
            progress.directory = self.get_trial_dir(trial.trial_id)
            if folder is not None:   # the trial's folder in model_dir (a bucket's)
                progress.directory = folder.published(progress.directory)
            received = progress.signals.received
            if received is not None:
                raise SearchStopped(
                    f"stopped by {received} between trials (trial {trial.trial_id} has not "
                    f"started); run the same command to continue the search",
                    "between trials", received)
            try:
                result = self._run_from_progress(progress, trial, *args, **kwargs)
            except Exception as error:
                values = {k: v for k, v in trial.hyperparameters.values.items()
                          if k in DIMENSIONS}
                progress.print_fn(
                    f"trial {trial.trial_id} ({describe_values(values)}) failed: "
                    f"{type(error).__name__}: {' '.join(str(error).split())[:300]} (its "
                    f"traceback: {storage.join(progress.directory, 'trial.json')}); the "
                    f"search goes on and the next run retries it")
                raise
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

    def _run_from_progress(self, trial_progress, trial, *args, **kwargs):
        try:
            return super().run_trial(trial, *args, **kwargs)
        except UnreadableProgress as unreadable:
            cause = str(unreadable.error).split("; ")[0]
            trial_progress.print_fn(
                f"trial {trial.trial_id}: its progress cannot be read ({cause}); removed "
                f"{unreadable.directory}, the trial starts again from its start")
            storage.rmtree(unreadable.directory)
            return super().run_trial(trial, *args, **kwargs)

    def on_trial_begin(self, trial):
        super().on_trial_begin(trial)
        self._publish()   # the trial the oracle started: a resumed search retries it

    def on_trial_end(self, trial):
        super().on_trial_end(trial)
        record = getattr(self, "_pending_records", {}).pop(trial.trial_id, None)
        if record is not None:
            path = os.path.join(self.project_dir, RECORDS)
            records = storage.read_json(path) if storage.exists(path) else {}
            records[trial.trial_id] = record
            # json.dumps keeps a diverged trial's NaN losses (write_json would not).
            storage.write_text(path, json.dumps(records))
        self._publish()

    def _publish(self):
        folder = getattr(self, "folder", None)
        if folder is not None:
            folder.publish()


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


def make_tuner(search, hypermodel, strategy, directory):
    """The Keras Tuner of ``search.tuner`` for ``hypermodel``, its files in
    ``directory``, its trials judged by ``search.objective``."""
    objective = OBJECTIVES[search.objective]
    common = dict(objective=objective, directory=directory, project_name=PROJECT,
                  overwrite=False, seed=search.train.seed,
                  # keras.distribution (JAX) is entered around the search instead.
                  distribution_strategy=None if isinstance(
                      strategy, strategies.KerasDistribution) else strategy)
    cls = _TUNER_CLASSES[search.tuner]
    if search.tuner == "grid":
        oracle = GridOracle(objective=objective, max_trials=search.max_trials or
                            search.space_size, seed=search.train.seed)
        common.pop("objective")
        common.pop("seed")
        return cls(oracle=oracle, hypermodel=hypermodel, **common)
    if search.tuner == "hyperband":
        return cls(hypermodel, max_epochs=search.train.epochs, factor=3, **common)
    max_trials = search.max_trials or search.space_size
    return cls(hypermodel, max_trials=max_trials, **common)


def failed_without_result(trial):
    """Whether ``trial`` ended FAILED with no result: an error, not a
    diverged loss (a NaN objective under ``train_loss`` also ends FAILED,
    with its metrics recorded)."""
    return trial.status == "FAILED" and not trial.metrics.exists("val_accuracy")


def failure(trial):
    """The last line of a failed trial's traceback (Keras Tuner keeps it)."""
    lines = [line.strip() for line in (trial.message or "").splitlines() if line.strip()]
    return " ".join(lines[-1].split())[:200] if lines else "no message recorded"


def retry_failed(tuner, print_fn):
    """Sends the trials an earlier run left FAILED without a result (an
    error, a run killed at a bad moment) back to Keras Tuner's retry queue:
    this run tries each once more (the trial a stopped run was running is
    retried first)."""
    oracle = tuner.oracle
    failed = sorted(t.trial_id for t in oracle.trials.values() if failed_without_result(t))
    for trial_id in failed:
        trial = oracle.trials[trial_id]
        values = {k: v for k, v in trial.hyperparameters.values.items() if k in DIMENSIONS}
        print_fn(f"trial {trial_id} ({describe_values(values)}) failed in an "
                 f"earlier run ({failure(trial)}); it runs again")
        trial.status = "INVALID"   # waiting for its retry
        while trial_id in oracle.end_order:
            oracle.end_order.remove(trial_id)
    oracle._retry_queue[:0] = [t for t in reversed(failed) if t not in oracle._retry_queue]
    return failed

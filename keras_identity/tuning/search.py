"""The papers' search protocols: the gate bias of He et al. (2016), Sec. 3.1
(a grid on a validation split of the training set, then the best value trained
on the whole training set and its test error reported), and the random search
of Srivastava et al. (2015), Sec. 3.1 (learning rate, momentum, exponential
decay, activation and transform-gate bias, judged by the training error)."""

import contextlib
import csv
import dataclasses
import io
import itertools
import json
import math
import os
import shutil
import tempfile
import time

import keras
import keras_tuner

try:  # Keras Tuner's switch that prints each failed trial's traceback
    from keras_tuner.src import config as _keras_tuner_config
except ImportError:  # pragma: no cover - another Keras Tuner layout
    _keras_tuner_config = None

from keras_identity import storage
from keras_identity.training import callbacks as callbacks_lib
from keras_identity.training import checkpoints
from keras_identity.training import preemption
from keras_identity.training import recipes as recipes_lib
from keras_identity.training import strategies
from keras_identity.training import trainer
from keras_identity.tuning.hypermodel import DEFAULT_GATE_BIASES
from keras_identity.tuning.hypermodel import DIMENSIONS
from keras_identity.tuning.hypermodel import FLAG_NAMES
from keras_identity.tuning.hypermodel import Range
from keras_identity.tuning.hypermodel import TrainingHyperModel
from keras_identity.tuning.hypermodel import apply_values
from keras_identity.tuning.hypermodel import dimension_values
from keras_identity.tuning.hypermodel import check_tunable
from keras_identity.tuning.hypermodel import gate_bias_fixed
from keras_identity.tuning.hypermodel import has_gate_bias

TUNERS = ("grid", "random", "bayesian", "hyperband")
# What a trial is judged by: the best epoch's value of a Keras metric.
# val_error: He et al.'s cross-validation; train_error / train_loss:
# Srivastava et al.'s "best training set error" (Fig. 1 plots the loss).
OBJECTIVES = {
    "val_error": keras_tuner.Objective("val_accuracy", direction="max"),
    "train_error": keras_tuner.Objective("accuracy", direction="max"),
    "train_loss": keras_tuner.Objective("cross_entropy", direction="min"),
}


RECORDS = "records_per_trial.json"
PROJECT = "search"   # Keras Tuner's folder in model_dir (its project_name)


class TunerFolder:
    """Where Keras Tuner keeps a search's state: ``<model_dir>/search``.

    Keras Tuner writes its files (the oracle's, each trial's ``trial.json``
    and best weights) with local file calls (``tf.io.gfile`` where TensorFlow
    is installed, which reaches neither an emulator nor fsspec's
    credentials).  A local ``model_dir`` is used as it is.  For one in a
    bucket the tuner works in a local staging folder (:attr:`directory`,
    a temporary folder, never the current directory), filled from the bucket
    when the search starts (a search continues on any machine) and copied
    back (:meth:`publish`: the files that changed, trials' files before the
    oracle's and the records, which name finished trials) when a trial starts
    and ends and when the search ends or stops.  A trial's progress
    checkpoints are written in the bucket itself (:meth:`published`), so a
    trial stopped or killed resumes from the bucket too.
    """

    # Uploaded after the trials' files, in this order: what names a trial
    # comes after the trial's own files.
    _LAST = tuple(f"{PROJECT}/{name}" for name in ("tuner0.json", "oracle.json", RECORDS))

    def __init__(self, model_dir):
        self.model_dir = model_dir
        self.remote = storage.is_remote(model_dir)
        self._published = {}   # relative path -> storage.upload_tree's stamp uploaded
        if not self.remote:
            self.directory = model_dir
            return
        self.directory = tempfile.mkdtemp(prefix="keras_identity_tune_")
        try:
            project = os.path.join(self.directory, PROJECT)
            # A trial's progress is read in the bucket (TrialProgress): not copied.
            downloaded = storage.download_tree(
                storage.join(model_dir, PROJECT), project,
                skip=lambda relative: "/progress/" in f"/{relative}")
            self._published = {f"{PROJECT}/{r}": stamp for r, stamp in downloaded.items()}
        except BaseException:
            self.close()
            raise

    def published(self, path):
        """Where ``path`` (in :attr:`directory`) is kept in ``model_dir``."""
        if not self.remote:
            return path
        relative = os.path.relpath(path, self.directory).replace(os.sep, "/")
        return storage.join(self.model_dir, relative)

    def publish(self):
        """Uploads the files of the staging folder that are new or changed
        since they were last uploaded."""
        if self.remote:
            storage.upload_tree(self.directory, self.model_dir, self._published,
                                last=self._LAST)

    @contextlib.contextmanager
    def publishing(self):
        """Publishes when the block ends, with an error too (an error of the
        upload then does not hide the block's)."""
        try:
            yield
        except BaseException:
            with contextlib.suppress(Exception):
                self.publish()
            raise
        self.publish()

    def discard(self):
        """Removes the tuner's files (a new search that could not start)."""
        shutil.rmtree(os.path.join(self.directory, PROJECT), ignore_errors=True)
        if self.remote:
            storage.rmtree(storage.join(self.model_dir, PROJECT))

    def close(self):
        """Removes the staging folder (nothing for a local ``model_dir``)."""
        if self.remote:
            shutil.rmtree(self.directory, ignore_errors=True)

    def __enter__(self):
        return self

    def __exit__(self, *_):
        self.close()


class SearchStopped(preemption.Stopped):
    """A search stopped by a signal (a :class:`preemption.Stopped`, so
    ``keras-identity-tune`` exits with ``STOP_STATUS``), in words that say
    what running the same command does next.

    ``phase``: ``"trial"`` (a trial stopped, saved in its progress folder:
    the search continues with it), ``"between trials"`` (no trial was
    training), ``"before the retraining"`` (the search is complete; the
    retraining of the best values has not started) or ``"retraining"`` (the
    retraining stopped at its checkpoint: the same command resumes it).
    """

    def __init__(self, message, phase, signal_name, step=0, epoch=0, directory=None,
                 saved=False):
        BaseException.__init__(self, message)   # Stopped's attributes, the search's words
        self.signal_name, self.step, self.epoch = signal_name, int(step), int(epoch)
        self.directory, self.saved, self.phase = directory, saved, phase


class TrialsFailed(RuntimeError):
    """Trials of a search failed (an error other than a diverged loss): the
    search is incomplete.  results.csv and results.md list them (their note
    says why); running the same search again retries them."""


class UnreadableProgress(Exception):
    """A trial's progress folder holds checkpoints none of which can be read
    (``directory``; ``error``: the :class:`checkpoints.CheckpointError`)."""

    def __init__(self, directory, error):
        super().__init__(str(error))
        self.directory, self.error = directory, error


class TrialProgress:
    """How a search's trials keep their progress and stop: each trial writes
    checkpoints into ``<trial folder>/progress`` (at every epoch's end and as
    ``--checkpoint_every`` says), a stop signal saves the step in progress
    and raises :class:`preemption.Stopped`, and a trial that the search
    retries (Keras Tuner retries the trial a stopped search was running)
    resumes from its checkpoint.  The folder is removed when the trial ends.
    A folder none of whose checkpoints can be read (a kill while the first
    one was written) raises :class:`UnreadableProgress`: the search removes
    it and runs the trial from its start.
    """

    def __init__(self, strategy, make_train, steps_per_epoch, signals, checkpoint_every,
                 print_fn=print):
        self.strategy = strategy
        self.make_train = make_train
        self.steps_per_epoch = steps_per_epoch
        self.signals = signals
        self.every_steps, self.every_seconds = preemption.parse_checkpoint_every(
            checkpoint_every)
        self.print_fn = print_fn
        self.directory = None   # the trial's folder, set before each trial

    def fit(self, model, *, epochs, validation_data, callbacks, verbose):
        """Trains a trial's ``model`` for ``epochs`` epochs from its own
        streams (:attr:`make_train`, from the step it resumes at; the stream
        Keras Tuner passes starts at 0), with ``callbacks`` (the tuner's);
        returns a ``History`` of all its epochs, before a resume too."""
        progress = storage.join(self.directory, "progress")
        checkpointer = checkpoints.Checkpointer(progress, keep=1, owns_directory=True)
        try:
            state = checkpointer.restore(model) if storage.isdir(progress) else None
        except checkpoints.CheckpointError as error:
            raise UnreadableProgress(progress, error) from None
        start = state["step"] if state else 0
        if state:
            self.print_fn(f"trial {storage.basename(self.directory)} resumes from its "
                          f"checkpoint at step {start:,}")
        log = preemption.EpochLog(checkpointer, self.steps_per_epoch,
                                  state["history"] if state else ())
        in_epoch = preemption.InEpochCheckpoints(
            self.strategy, self.signals, self.steps_per_epoch, self.every_steps,
            self.every_seconds)
        preemption.fit_resumable(
            model, make_train=self.make_train, validation_data=validation_data,
            callbacks=[*callbacks, log, in_epoch], strategy=self.strategy,
            steps_per_epoch=self.steps_per_epoch, start_step=start,
            end_step=epochs * self.steps_per_epoch, checkpointer=checkpointer,
            history=lambda: log.rows, verbose=verbose,
            metrics=state.get("metrics") if state else None, print_fn=self.print_fn)
        storage.rmtree(progress)
        return log.history()

    def fit_unsaved(self, fit, hp, model, *args, **kwargs):
        """``fit(hp, model, *args, **kwargs)`` (a Hyperband round that starts
        from an earlier round's weights, at ``initial_epoch``) that a stop
        signal ends with :class:`preemption.Stopped` and no checkpoint.  Its
        training stream is :attr:`make_train`'s from the round's first step
        (not the stream the tuner passes, which earlier trials have read)."""
        stop = _StopUnsaved(self.signals)
        kwargs["callbacks"] = [*kwargs.get("callbacks", []), stop]
        stream = self.make_train(kwargs["initial_epoch"] * self.steps_per_epoch)
        try:
            history = fit(hp, model, stream, *args[1:], **kwargs)
        finally:
            preemption.close_stream(stream)
        if stop.stopped is not None:
            epoch = -(-stop.stopped // self.steps_per_epoch)
            raise SearchStopped(
                f"stopped by {self.signals.received} at step {stop.stopped:,} "
                f"({preemption.place(stop.stopped, self.steps_per_epoch)}): "
                f"no checkpoint of it (this Hyperband round restarts from its start); run the "
                f"same command to resume; the search continues with this trial", "trial",
                self.signals.received, stop.stopped, epoch, None, saved=False)
        return history


class _StopUnsaved(keras.callbacks.Callback):
    """Stops a fit at the next step once a stop signal has arrived."""

    def __init__(self, signals):
        super().__init__()
        self.signals, self.stopped = signals, None

    def on_train_batch_end(self, batch, logs=None):
        if self.signals.received is not None and self.stopped is None:
            self.stopped = int(keras.ops.convert_to_numpy(self.model.optimizer.iterations))
            self.model.stop_training = True


class _TimedTrials:
    """Records each trial's wall-clock time, epochs run and last-epoch losses
    in ``records_per_trial.json`` (Keras Tuner keeps only the best epoch's).

    The record is written after the oracle has ended and saved the trial, so
    a trial listed in the file is also complete on disk when a search is
    killed and resumed.  With the tuner's ``folder`` (a :class:`TunerFolder`),
    the tuner's files are published when a trial starts and ends.

    With the hypermodel's ``progress`` (a :class:`TrialProgress`), a trial
    does not start once a stop signal has arrived (:class:`SearchStopped`),
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
                    f"trial {trial.trial_id} ({_describe(values)}) failed: "
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


@dataclasses.dataclass
class SearchConfig:
    """A hyper-parameter search (the ``keras-identity-tune`` flags).

    ``train`` holds the model, dataset, recipe and trial length (its
    ``epochs``) and ``model_dir``, where the tuner keeps its state: running
    the same search again continues it.

    The space: each of ``gate_biases``, ``learning_rates``, ``momentums``,
    ``lr_decays``, ``activations``, ``weight_decays`` and ``depths`` is a
    tuple of values or a :class:`Range` (random, Bayesian, Hyperband).
    ``gate_biases=None`` means the paper's 0, -1, ..., -10 for a model with a
    gate bias (unless ``model_kwargs`` fixes it) and no gate-bias dimension
    otherwise.  ``objective`` is
    ``"val_error"`` (the best epoch's validation error), ``"train_error"``
    or ``"train_loss"`` (the best epoch's training error or cross-entropy).
    """

    train: trainer.TrainConfig
    tuner: str = "grid"
    max_trials: int = None
    validation_split: float = 0.1
    gate_biases: tuple = None
    learning_rates: tuple = None
    weight_decays: tuple = None
    depths: tuple = None
    retrain_best: bool = False
    retrain_epochs: int = None
    momentums: tuple = None
    lr_decays: tuple = None
    activations: tuple = None
    objective: str = "val_error"

    @property
    def space(self):
        """Dimension -> tuple of values or :class:`Range` (dimensions not
        searched left out)."""
        space = {}
        for name in DIMENSIONS:
            values = getattr(self, FLAG_NAMES[name])
            if (name == "gate_bias_init" and values is None and has_gate_bias(self.train)
                    and not gate_bias_fixed(self.train)):
                values = DEFAULT_GATE_BIASES
            if values is None:
                continue
            if not isinstance(values, Range):
                values = tuple(values)
                if name == "depth":
                    values = tuple(int(v) if isinstance(v, float) and v.is_integer() else v
                                   for v in values)
            space[name] = values
        return space

    def validate(self):
        try:
            self.train.validate()
            for name in DIMENSIONS:
                values = getattr(self, FLAG_NAMES[name])
                if values is not None and not isinstance(values, Range) and not len(values):
                    raise ValueError(f"{FLAG_NAMES[name]} is empty; expected at least one "
                                     f"value.")
            space = self.space
            check_tunable(self.train, space)
            if self.tuner not in TUNERS:
                raise ValueError(f"tuner={self.tuner!r} is not valid; expected one of: "
                                 f"{', '.join(repr(t) for t in TUNERS)}.")
            if self.objective not in OBJECTIVES:
                raise ValueError(f"objective={self.objective!r} is not valid; expected one of: "
                                 f"{', '.join(repr(o) for o in OBJECTIVES)}.")
            if self.train.strategy == "multi_worker":
                raise ValueError("strategy='multi_worker' is not supported for a search; "
                                 "use 'auto', 'mirrored' or 'tpu' (Keras Tuner distributes "
                                 "trials with its own KERASTUNER_* variables).")
            if self.max_trials is not None and self.max_trials < 1:
                raise ValueError(f"max_trials={self.max_trials!r} is not valid; expected an "
                                 f"integer >= 1.")
            ranges = [FLAG_NAMES[n] for n, v in space.items() if isinstance(v, Range)]
            if ranges and self.tuner == "grid":
                raise ValueError(f"{', '.join(ranges)}: a range low:high needs "
                                 f"tuner='random', 'bayesian' or 'hyperband'; the grid takes "
                                 f"lists of values.")
            if ranges and self.tuner in ("random", "bayesian") and self.max_trials is None:
                raise ValueError(f"{', '.join(ranges)}: a range has no end of values; give "
                                 f"max_trials.")
            if not 0.0 < self.validation_split < 1.0:
                raise ValueError(f"validation_split={self.validation_split!r} is not valid; "
                                 f"expected a number in (0, 1).")
            if self.train.epochs is None:
                raise ValueError("a search needs epochs (per trial).")
        except trainer.ConfigError:
            raise
        except ValueError as error:
            raise trainer.ConfigError(str(error)) from None
        return self

    @property
    def space_size(self):
        """Configurations in the space (``None`` with a range)."""
        size = 1
        for values in self.space.values():
            if isinstance(values, Range):
                return None
            size *= len(values)
        return size

    def describe_space(self):
        return ", ".join(f"{name} {list(v) if not isinstance(v, Range) else v}"
                         for name, v in self.space.items())


def _make_tuner(search, hypermodel, strategy, directory):
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


def _failed_without_result(trial):
    """Whether ``trial`` ended FAILED with no result: an error, not a
    diverged loss (a NaN objective under ``train_loss`` also ends FAILED,
    with its metrics recorded)."""
    return trial.status == "FAILED" and not trial.metrics.exists("val_accuracy")


def _failure(trial):
    """The last line of a failed trial's traceback (Keras Tuner keeps it)."""
    lines = [line.strip() for line in (trial.message or "").splitlines() if line.strip()]
    return " ".join(lines[-1].split())[:200] if lines else "no message recorded"


def _failed(row):
    return row["note"].startswith("failed")


def _retry_failed(tuner, print_fn):
    """Sends the trials an earlier run left FAILED without a result (an
    error, a run killed at a bad moment) back to Keras Tuner's retry queue:
    this run tries each once more (the trial a stopped run was running is
    retried first)."""
    oracle = tuner.oracle
    failed = sorted(t.trial_id for t in oracle.trials.values() if _failed_without_result(t))
    for trial_id in failed:
        trial = oracle.trials[trial_id]
        values = {k: v for k, v in trial.hyperparameters.values.items() if k in DIMENSIONS}
        print_fn(f"trial {trial_id} ({_describe(values)}) failed in an "
                 f"earlier run ({_failure(trial)}); it runs again")
        trial.status = "INVALID"   # waiting for its retry
        while trial_id in oracle.end_order:
            oracle.end_order.remove(trial_id)
    oracle._retry_queue[:0] = [t for t in reversed(failed) if t not in oracle._retry_queue]
    return failed


def _trial_rows(tuner, objective="val_error"):
    """A row per trial that ended: its values, results and note
    ("diverged ...", or "failed (<error>)" for a trial with no result)."""
    path = os.path.join(tuner.project_dir, RECORDS)
    records = storage.read_json(path) if storage.exists(path) else {}
    rows = []
    nan = float("nan")
    for trial in tuner.oracle.trials.values():
        failed = _failed_without_result(trial)
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
            "note": f"failed ({_failure(trial)})" if failed else _divergence(loss),
        })
        rows.append(row)
    if rows and "gate_bias_init" in rows[0] and objective == "val_error":
        rows.sort(key=lambda r: (-r["gate_bias_init"], r["trial"]))
    else:
        rows.sort(key=lambda r: (bool(r["note"]), _score(r, objective), r["trial"]))
    return rows


def _divergence(loss):
    """The note of a trial whose last training loss is not finite (as the
    trainer's StopOnNaN judges a run), else ''."""
    if math.isnan(loss):
        return "diverged (NaN loss)"
    return "diverged (infinite loss)" if math.isinf(loss) else ""


def _score(row, objective):
    """The row's objective, lower is better (NaN last)."""
    value = row[{"val_error": "val_error", "train_error": "train_error",
                 "train_loss": "best_train_loss"}[objective]]
    return value if value == value else float("inf")


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
    failed = [r for r in rows if _failed(r)]
    if failed:
        table += (f"\n\n{len(failed)} of {len(rows)} trials failed (no result; the note says "
                  f"why): the search is incomplete; running it again retries "
                  f"{'it' if len(failed) == 1 else 'them'}.")
    storage.write_text(storage.join(directory, "results.md"),
                       (f"{title}\n\n" if title else "") + table + "\n")
    _plot(rows, storage.join(directory, plot_name(rows, objective)), title, objective)
    return table


def _append(path, text):
    """Adds ``text`` to the end of the file ``path`` (rewritten whole)."""
    storage.write_text(path, storage.read_text(path) + text)


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
        return scale * _score(r, objective)

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


def _values(row):
    """The searched values of a row."""
    return {k: row[k] for k in DIMENSIONS if k in row}


def _describe(values):
    return ", ".join(f"{'gate bias' if k == 'gate_bias_init' else k} "
                     f"{v:g}" if isinstance(v, float) else f"{k} {v}"
                     for k, v in values.items())


SEARCH_FILE = "search.json"


def search_identity(search, data, recipe):
    """What a search directory's trials depend on: its space, trial length,
    validation split, model, data and recipe (``max_trials`` may grow: more
    trials of the same search)."""
    config = search.train
    space = search.space

    def dimension(name):
        values = dimension_values(name, space.get(name, ()))
        return values.describe() if isinstance(values, Range) else list(values)

    return {
        "tuner": search.tuner,
        "gate_biases": dimension("gate_bias_init"),
        "learning_rates": dimension("learning_rate"),
        "weight_decays": dimension("weight_decay"),
        "depths": dimension("depth"),
        "momentums": dimension("momentum"),
        "lr_decays": dimension("lr_decay"),
        "activations": dimension("activation"),
        "objective": search.objective,
        "epochs": config.epochs, "validation_split": search.validation_split,
        "model": config.model, "model_kwargs": config.builder_arguments(),
        "dataset": config.dataset, "data_dir": data.fingerprint,
        "train_examples": config.train_examples, "recipe": recipe.name,
        "batch_size": config.batch_size, "precision": config.precision,
        "seed": config.seed, "normalization": config.normalization,
        "augmentation": config.augmentation, "learning_rate": config.learning_rate,
        "momentum": config.momentum, "weight_decay": config.weight_decay,
        "lr_decay": config.lr_decay, "warmup_steps": config.warmup_steps,
        "steps_per_epoch": config.steps_per_epoch, "deterministic": config.deterministic}


def _check_same_search(directory, identity):
    """Refuses a search directory that holds another search (one line naming
    what differs); records the identity of a new one."""
    path = storage.join(directory, SEARCH_FILE)
    if storage.exists(path):
        try:
            before = storage.read_json(path)
        except (OSError, ValueError) as error:
            raise ValueError(f"{path} is not readable ({type(error).__name__}); use a new "
                             f"--model_dir.") from None
        diffs = trainer.differences(before, identity)
        if diffs:
            raise ValueError(f"model_dir={directory!r} holds another search "
                             f"({'; '.join(diffs)}); a search continues only with its own "
                             f"space and data; use a new --model_dir for this one.")
        return
    storage.check_writable(directory)
    if storage.listdir(directory):
        raise ValueError(f"model_dir={directory!r} is not empty and holds no {SEARCH_FILE} "
                         f"(not a search directory); use a new --model_dir.")
    storage.write_text(path, json.dumps(identity, indent=1))


def run_search(search, print_fn=print):
    """Runs (or continues) ``search``; returns rows, the best values and paths.

    ``search.train.model_dir`` is a local folder or a bucket's
    (``gs://BUCKET/...``): every file of the search is kept there (Keras
    Tuner's through a local staging folder, :class:`TunerFolder`), and a
    search continues from it on any machine.

    Every trial is built from ``search.train.seed`` (its result does not
    depend on the trials before it in the process); trials an earlier run
    left FAILED are tried again, and a trial whose progress cannot be read
    starts again from its start.

    Raises:
        ConfigError: a bad configuration or missing data (one line).
        SearchStopped: a stop signal (its message says what the same
            command does next): the trial in progress is saved, or the
            search is complete and the retraining is still to do (a signal
            the search acknowledged is not ignored by the retraining), or
            the retraining is saved at its checkpoint.
        TrialsFailed: trials failed (results.csv and results.md written, the
            failed trials noted); the same command retries them.
        storage.StorageError: the bucket could not be read or written while
            the search ran (one line).
    """
    with contextlib.ExitStack() as cleanup:
        return _run_search(search, print_fn, cleanup)


def _run_search(search, print_fn, cleanup):
    search.validate()
    config = search.train
    try:
        trainer.setup_precision_and_seed(config)
        strategy = strategies.get_strategy(config.strategy, config.tpu)
        if getattr(strategy, "process_count", 1) > 1:
            raise ValueError(f"the search runs in one process; this JAX program runs in "
                             f"{strategy.process_count} processes (train the best values "
                             f"across processes with keras-identity-train).")
        full = trainer.load_data(config)
        data = full.with_validation_split(search.validation_split, seed=config.seed)
        recipe = config.get_recipe()
        schedule = recipes_lib.resolve(
            recipe, num_train=data.num_train, batch_size=config.batch_size,
            depth=config.resolved_depth, learning_rate=config.learning_rate,
            epochs=config.epochs, steps_per_epoch=config.steps_per_epoch,
            warmup_steps=config.warmup_steps)
        trainer.check_global_batch(schedule, strategy)
        normalization = trainer.make_normalization(
            config.normalization or recipe.normalization, data)
        hypermodel = TrainingHyperModel(config, data, recipe, schedule, space=search.space,
                                        normalization=normalization)
        storage.check_path(config.model_dir)
        fresh = not storage.exists(storage.join(config.model_dir, SEARCH_FILE))
        _check_same_search(config.model_dir, search_identity(search, full, recipe))
    except trainer.ConfigError:
        raise
    except (ValueError, storage.StorageError) as error:
        raise trainer.ConfigError(str(error)) from None
    train_ds, val_ds = trainer.input_streams(
        strategy, data, batch_size=schedule.batch_size, normalization=normalization,
        augmentation=config.augmentation or recipe.augmentation, seed=config.seed,
        split="val", worker_processes=config.input_workers)
    folder = cleanup.enter_context(TunerFolder(config.model_dir))
    try:  # Keras Tuner builds a first model here: the builder's refusals are one line
        tuner = _make_tuner(search, hypermodel, strategy, folder.directory)
    except ValueError as error:
        if fresh:  # what this run just wrote, so that the corrected command starts anew
            storage.remove(storage.join(config.model_dir, SEARCH_FILE))
            folder.discard()
        raise trainer.ConfigError(str(error)) from None
    tuner.folder = folder
    _retry_failed(tuner, print_fn)
    done_before = len([r for r in _trial_rows(tuner, search.objective) if not _failed(r)])
    size = search.space_size
    print_fn(f"{search.tuner} search of {search.describe_space()} "
             f"({f'{size} configurations' if size else 'continuous'}; judged by the best "
             f"epoch's {search.objective.replace('_', ' ')}) for {config.model} "
             f"{config.resolved_depth or ''} on {data.name}: {data.num_train:,} training / "
             f"{len(data.y_val):,} validation images (the test set is not used), "
             f"{schedule.epochs} epochs of {schedule.steps_per_epoch} steps per trial; "
             f"{strategies.describe(strategy)}"
             + (f"; continuing after {done_before} finished trials" if done_before else ""))
    augmentation = config.augmentation or recipe.augmentation

    def make_train(step):
        return trainer.input_streams(
            strategy, data, batch_size=schedule.batch_size, normalization=normalization,
            augmentation=augmentation, seed=config.seed, start_step=step, split="val",
            evaluation=False, worker_processes=config.input_workers)[0]

    signals = preemption.StopSignals(config.stop_signal)
    hypermodel.progress = TrialProgress(strategy, make_train, schedule.steps_per_epoch,
                                        signals, config.checkpoint_every, print_fn)
    # The signals stay caught until the retraining starts (which catches
    # its own): one that the search acknowledged, at its last trial's last
    # evaluation say, stops the program before the retraining.
    with signals:
        gave_up = None
        # A failed trial is told in one line (run_trial), its traceback kept
        # in its trial.json, not printed.
        debug = getattr(_keras_tuner_config, "DEBUG", None)
        if debug is not None:
            _keras_tuner_config.DEBUG = False
        try:
            with folder.publishing(), strategies.fit_scope(strategy):
                tuner.search(train_ds, epochs=schedule.epochs,
                             steps_per_epoch=schedule.steps_per_epoch, validation_data=val_ds,
                             callbacks=[keras.callbacks.TerminateOnNaN()], shuffle=False,
                             verbose=config.verbose)
        except SearchStopped:
            raise
        except preemption.Stopped as stopped:
            raise SearchStopped(f"{stopped}; the search continues with this trial", "trial",
                                stopped.signal_name, stopped.step, stopped.epoch,
                                stopped.directory, stopped.saved) from None
        except RuntimeError as error:
            # Keras Tuner's oracle ends a search after consecutive failed trials.
            if "consecutive failures" not in str(error):
                raise
            gave_up = str(error).splitlines()[0].rstrip(".")
        finally:
            if debug is not None:
                _keras_tuner_config.DEBUG = debug
            hypermodel.progress = None
            for stream in (train_ds, val_ds):
                preemption.close_stream(stream)

        rows = _trial_rows(tuner, search.objective)
        if not rows:
            raise RuntimeError("the search finished no trial.")
        searched = ", ".join(search.space)
        title = (f"{config.model} {config.resolved_depth or ''} on {data.name}: "
                 f"{search.objective.replace('_', ' ')} against {searched}")
        table = write_results(rows, config.model_dir, title, search.objective)
        print_fn(table)
        failed = [r for r in rows if _failed(r)]
        if failed or gave_up:
            listed = "; ".join(f"trial {r['trial']} ({_describe(_values(r))}): {r['note']}"
                               for r in failed)
            raise TrialsFailed(
                f"{len(failed)} of {len(rows)} trials failed ({listed})"
                + (f"; Keras Tuner ended the search ({gave_up})" if gave_up else "")
                + f"; {storage.join(config.model_dir, 'results.md')} lists them; run the "
                  f"same command to retry them")
        if search.retrain_best and signals.received is not None:
            # Only an unfinished retraining is left to do.
            raise SearchStopped(
                f"stopped by {signals.received} after the search's last trial: the search "
                f"is complete ({len(rows)} trials, results in "
                f"{storage.join(config.model_dir, 'results.md')}); run the same command to "
                f"retrain the best values (--retrain_best) without searching again",
                "before the retraining", signals.received)
    finite = [r for r in rows if not r["note"]] or rows
    best_row = min(finite, key=lambda r: _score(r, search.objective))
    best = _values(best_row)
    judged = {"val_error": ("validation error", best_row["val_error"]),
              "train_error": ("best training error", best_row.get("train_error")),
              "train_loss": ("best training loss", best_row.get("best_train_loss"))}
    label, value = judged[search.objective]
    print_fn(f"best: {best} with {label} " + (f"{value:.4f}" if search.objective ==
                                               "train_loss" else f"{100 * value:.2f}%"))
    result = {"rows": rows, "best": best, "best_val_error": best_row["val_error"],
              "best_row": best_row, "model_dir": config.model_dir,
              "trials_before": done_before}
    if search.retrain_best and best_row["note"]:
        print_fn("not retraining: every trial diverged.")
        result["retrain"] = None
    elif search.retrain_best:
        # One directory per best trial: more trials of the same search may
        # find other values, whose run must not resume this one's.
        retrain = dataclasses.replace(
            apply_values(config, best), epochs=search.retrain_epochs or config.epochs,
            model_dir=storage.join(config.model_dir, "retrain_best",
                                   f"trial_{best_row['trial']}"))
        print_fn(f"retraining {best} on the whole training set in {retrain.model_dir} ...")
        try:
            outcome = trainer.train(retrain, print_fn=print_fn, strategy=strategy)
        except preemption.Stopped as stopped:
            # The retraining is a training run of its own (its checkpoints in
            # its model_dir): the same command skips the finished search and
            # resumes it.
            raise SearchStopped(
                f"{stopped.what}; running the same command resumes the retraining of "
                f"{_describe(best)} (the search is complete)", "retraining",
                stopped.signal_name, stopped.step, stopped.epoch, stopped.directory,
                stopped.saved) from None
        except callbacks_lib.TrainingDiverged as error:
            print_fn(f"the retraining of {_describe(best)} diverged: {error}")
            result["retrain"] = {"diverged": True, "model_dir": retrain.model_dir}
            _append(storage.join(config.model_dir, "results.md"),
                    f"\nRetrained with {best} on the whole training set: diverged "
                    f"({error}).\n")
            return result
        outcome["model_dir"] = retrain.model_dir
        result["retrain"] = outcome
        print_fn(f"best {_describe(best)}: test error {100 * outcome['test_error']:.2f}% "
                 f"(trained on all {full.num_train:,} training images)")
        _append(storage.join(config.model_dir, "results.md"),
                f"\nRetrained with {best} on the whole training set for "
                f"{retrain.epochs} epochs: test error "
                f"{100 * outcome['test_error']:.2f}%.\n")
    return result

"""A run that is stopped loses seconds, not an epoch: stop signals and
checkpoints inside an epoch.

* **Stop signals.**  While a run trains, SIGTERM, SIGINT and the signal of
  ``--stop_signal`` (SLURM's ``--signal=USR1@120``, say) ask it to stop: the
  step in progress ends, a checkpoint of that step is written, and
  :class:`Stopped` is raised (``keras-identity-train`` prints one line and
  exits with :data:`STOP_STATUS`).  A second signal ends the process at once
  (status 128 + the signal's number), as an unhandled signal would.
* **Checkpoints inside an epoch** (``--checkpoint_every``: steps, or minutes
  of training).  A checkpoint inside an epoch also holds the running sums of
  the epoch's training metrics, so the resumed epoch reports what the
  uninterrupted one would have.
* **Agreement across processes.**  Every process of a multi-process run
  stops, or writes an interval checkpoint, after the same step: the
  decision is taken once per compiled call (``steps_per_execution`` steps)
  with the run's own collective (:func:`strategies.any_process`), so a
  signal that reaches one host only stops them all.

Both work the same way: the callback :class:`InEpochCheckpoints` raises
:class:`SaveRequest` out of ``model.fit``; the trainer writes the checkpoint
of the optimizer's step and either raises :class:`Stopped` or continues with
a new ``fit`` from that step, as a resumed run would.
"""

import re
import signal
import sys
import threading
import time
import warnings

import keras
import numpy as np

from keras_identity.training import strategies
from keras_identity.training.callbacks import _StepCounter

# sysexits.h EX_TEMPFAIL: stopped on request after saving; the same command
# continues the run (a scheduler's requeue condition).
STOP_STATUS = 75
DEFAULT_SIGNALS = ("SIGTERM", "SIGINT")
# --checkpoint_every's default: at most this much training is lost to a kill
# that gives no warning (a signal loses none).
DEFAULT_CHECKPOINT_EVERY = "10m"
_UNITS = {"s": 1, "m": 60, "h": 3600}


def parse_checkpoint_every(value):
    """``(steps, seconds)`` of ``--checkpoint_every``: ``"500"`` (steps),
    ``"90s"``, ``"10m"``, ``"1h"`` (training time), or ``"epoch"`` (epoch
    ends only: ``(None, None)``).

    Raises:
        ValueError: one line naming the flag and what is allowed.
    """
    text = str(value).strip().lower()
    if text == "epoch":
        return None, None
    found = re.fullmatch(r"(\d+(?:\.\d+)?)\s*([smh]?)", text)
    if found and found.group(2):
        seconds = float(found.group(1)) * _UNITS[found.group(2)]
        if seconds > 0:
            return None, seconds
    elif found and "." not in found.group(1) and int(found.group(1)) > 0:
        return int(found.group(1)), None
    raise ValueError(f"checkpoint_every={value!r} is not valid; expected a number of steps "
                     f"(500), a training time (90s, 10m, 1h) or 'epoch'.")


def signal_number(name):
    """The number of the signal ``name`` (``"USR1"``, ``"SIGUSR1"``).

    Raises:
        ValueError: one line naming ``--stop_signal`` and what is allowed.
    """
    text = str(name).strip().upper()
    text = text if text.startswith("SIG") else "SIG" + text
    allowed = [s for s in ("SIGUSR1", "SIGUSR2", "SIGHUP", "SIGQUIT", "SIGXCPU")
               if hasattr(signal, s)]
    if text in DEFAULT_SIGNALS:
        raise ValueError(f"stop_signal={name!r} is not valid: {text} always stops a run; "
                         f"expected another signal: {', '.join(allowed)}.")
    if text not in allowed:
        raise ValueError(f"stop_signal={name!r} is not valid; expected one of "
                         f"{', '.join(allowed)} (SIGTERM and SIGINT always stop a run).")
    return int(getattr(signal, text))


class Stopped(BaseException):
    """The run stopped on a signal after writing the checkpoint of ``step``.
    A ``BaseException``, as ``KeyboardInterrupt`` is: it ends the program (a
    tuner's trial loop, which catches ``Exception``, lets it pass)."""

    def __init__(self, signal_name, step, epoch, directory):
        self.signal_name, self.step, self.epoch, self.directory = (
            signal_name, int(step), int(epoch), directory)
        super().__init__(
            f"stopped by {signal_name} at step {self.step:,} (epoch {self.epoch}): the "
            f"checkpoint of that step is in {directory}; run the same command to resume")


class SaveRequest(BaseException):
    """Raised out of ``model.fit`` by :class:`InEpochCheckpoints`: write a
    checkpoint now, then stop (``signal_name`` set) or continue.  A
    ``BaseException``, as ``KeyboardInterrupt`` is, so that code which
    catches ``Exception`` around a fit (a tuner's trial loop) lets it pass."""

    def __init__(self, signal_name=None):
        super().__init__("a checkpoint was requested inside an epoch")
        self.signal_name = signal_name


class StopSignals:
    """Catches the stop signals while a run trains (a context manager).

    The first signal is remembered (:attr:`received`, its name) and answered
    by the training loop at its next step; a second one ends the process at
    once with status 128 + its number.  Outside the main thread (where
    Python allows no handlers) it does nothing.
    """

    def __init__(self, extra=None, print_fn=None):
        self.numbers = [int(getattr(signal, name)) for name in DEFAULT_SIGNALS]
        if extra is not None:
            self.numbers.append(signal_number(extra))
        self.print_fn = print_fn or (lambda line: print(line, file=sys.stderr, flush=True))
        self.received = None
        self._previous = {}

    def _handle(self, number, frame):
        name = signal.Signals(number).name
        if self.received is not None:
            self.print_fn(f"a second stop signal ({name}): exiting at once, without saving "
                          f"the step in progress (the last checkpoint is intact)")
            sys.stdout.flush()
            import os

            os._exit(128 + number)
        self.received = name
        self.print_fn(f"{name} received: saving a checkpoint after the step in progress "
                      f"(send it again to exit at once)")

    def __enter__(self):
        if threading.current_thread() is threading.main_thread():
            for number in self.numbers:
                self._previous[number] = signal.signal(number, self._handle)
        return self

    def __exit__(self, *exc):
        for number, previous in self._previous.items():
            signal.signal(number, previous)
        self._previous = {}
        return False


def metric_state(model):
    """The values of ``model``'s metric variables (the epoch's running sums),
    as JSON lists, in ``model.metrics`` order."""
    return [[np.asarray(keras.ops.convert_to_numpy(v)).tolist() for v in metric.variables]
            for metric in model.metrics]


def add_metric_state(model, values):
    """Adds :func:`metric_state`'s ``values`` to ``model``'s metric
    variables (sums and counts: the epoch's running means then cover the
    steps before the checkpoint too).  Returns False, changing nothing, when
    the values do not fit these metrics."""
    metrics = model.metrics
    if len(values) != len(metrics) or any(
            len(saved) != len(metric.variables) for saved, metric in zip(values, metrics)):
        return False
    pairs = [(variable, np.asarray(value, dtype=variable.dtype))
             for saved, metric in zip(values, metrics)
             for variable, value in zip(metric.variables, saved)]
    if any(value.shape != tuple(variable.shape) for variable, value in pairs):
        return False
    for variable, value in pairs:
        variable.assign(keras.ops.convert_to_numpy(variable) + value)
    return True


class RestoreMetrics(keras.callbacks.Callback):
    """Puts a checkpoint's metric sums back into the epoch it was written
    in, when a ``fit`` resumes inside that epoch: added after the first call
    (the metrics are built by then; they hold that call's sums)."""

    def __init__(self, values):
        super().__init__()
        self.values = values

    def on_train_batch_end(self, batch, logs=None):
        if self.values is None:
            return
        values, self.values = self.values, None
        if not add_metric_state(self.model, values):
            warnings.warn("the checkpoint's metric sums do not fit this model's metrics; "
                          "this epoch's training loss and error count only the steps since "
                          "the checkpoint.", stacklevel=2)


class InEpochCheckpoints(_StepCounter):
    """Raises :class:`SaveRequest` before the call that follows a step where
    a checkpoint is due inside an epoch: a stop signal has arrived,
    ``every_steps`` steps or ``every_seconds`` of training have passed since
    the last checkpoint.  Epoch ends are left to the run's own checkpoint: a
    signal that arrives in an epoch's last call or its evaluation stops the
    run right after it (:meth:`on_epoch_end`).

    The decision is taken after each call (``on_train_batch_end``) and acted
    on before the next (``on_train_batch_begin``, always in the main thread),
    so the checkpoint is of the step the optimizer has reached.  Across
    processes the decision is the same in every one
    (:func:`strategies.any_over_processes`, once per call).  In a single JAX
    process the decision runs beside the next step (Keras's asynchronous
    callbacks) and is acted on a call or two later.
    """

    def __init__(self, strategy, signals, steps_per_epoch, every_steps=None,
                 every_seconds=None):
        super().__init__()
        self.strategy = strategy
        self.signals = signals
        self.steps_per_epoch = int(steps_per_epoch)
        self.every_steps = every_steps
        self.every_seconds = every_seconds
        self._several = strategies.several_processes(strategy)
        self._last_time = time.monotonic()
        self._pending = None

    @property
    def async_safe(self):
        return keras.backend.backend() == "jax" and not self._several

    def restart_clock(self):
        """Counts the training time from now (a checkpoint was just written)."""
        self._last_time = time.monotonic()
        self._pending = None

    def _decide(self, late=False):
        """``(signal name or None, an interval checkpoint due)``, the same
        in every process."""
        received = self.signals.received if self.signals is not None else None
        if not self._several:
            return received, late
        names = [signal.Signals(n).name for n in self.signals.numbers] if self.signals else []
        flags = strategies.any_over_processes(
            self.strategy, [received == name for name in names] + [late])
        return next((name for name, flag in zip(names, flags) if flag), None), flags[-1]

    def on_train_batch_begin(self, batch, logs=None):
        if self._pending is not None:
            request, self._pending = self._pending, None
            raise request

    def on_train_batch_end(self, batch, logs=None):
        step = self.step(batch)
        if step % self.steps_per_epoch == 0 or self._pending is not None:
            return  # the epoch ends here (its own checkpoint follows), or decided
        late = (self.every_seconds is not None
                and time.monotonic() - self._last_time >= self.every_seconds)
        received, late = self._decide(late)
        if received is not None:
            self._pending = SaveRequest(received)
        elif late or (self.every_steps and step - self._epoch_start >= self.every_steps):
            self._pending = SaveRequest()

    def on_epoch_end(self, epoch, logs=None):
        # The run's epoch-end checkpoint was just written (the recorder runs
        # first): an interval checkpoint still pending is not needed.
        self.restart_clock()
        received, _ = self._decide()
        if received is not None:
            raise SaveRequest(received)


class EpochLog(keras.callbacks.Callback):
    """Keeps each epoch's logs (``rows``) and writes a checkpoint at each
    epoch's end with them: what a fit that is not a ``keras-identity-train``
    run (a tuner's trial) resumes from."""

    def __init__(self, checkpointer, rows=()):
        super().__init__()
        self.checkpointer = checkpointer
        self.rows = list(rows)

    def on_epoch_end(self, epoch, logs=None):
        self.rows.append({"epoch": epoch + 1, **{k: float(v) for k, v in (logs or {}).items()}})
        step = int(keras.ops.convert_to_numpy(self.model.optimizer.iterations))
        self.checkpointer.save(self.model, step=step, epoch=epoch + 1, history=self.rows)

    def history(self):
        """A Keras ``History`` of every epoch logged, before a resume too."""
        merged = keras.callbacks.History()
        merged.set_model(self.model)
        merged.epoch = [row["epoch"] - 1 for row in self.rows]
        keys = [k for k in self.rows[-1] if k != "epoch"] if self.rows else []
        merged.history = {k: [row.get(k) for row in self.rows] for k in keys}
        return merged


def _close(stream):
    if hasattr(stream, "close"):  # the JAX route's threads
        stream.close()


def _fit_segments(model, make_train, validation_data, callbacks, strategy, steps_per_epoch,
                  step, end_step, metrics, verbose):
    """``model.fit`` from ``step`` to ``end_step``; the Keras histories.  A fit
    that starts inside an epoch first finishes that epoch (a ``fit`` of its
    remaining steps, its metric sums put back), so its epochs end where an
    uninterrupted run's do."""
    segments = []
    if step % steps_per_epoch:
        first_end = min(end_step, (step // steps_per_epoch + 1) * steps_per_epoch)
        segments.append((step, first_end, first_end - step, [RestoreMetrics(metrics)]))
        step = first_end
    if step < end_step:
        segments.append((step, end_step, steps_per_epoch, []))
    histories = []
    for begin, end, steps, extra in segments:
        stream = make_train(begin)
        try:
            with strategies.fit_scope(strategy):
                histories.append(model.fit(
                    stream, epochs=-(-end // steps_per_epoch),
                    initial_epoch=begin // steps_per_epoch, steps_per_epoch=steps,
                    validation_data=validation_data, shuffle=False,
                    callbacks=extra + list(callbacks), verbose=verbose))
        finally:
            _close(stream)
    return histories


def fit_resumable(model, *, make_train, validation_data, callbacks, strategy, steps_per_epoch,
                  start_step, end_step, checkpointer, history=list, verbose=0, metrics=None,
                  print_fn=print, stop_directory=None, epoch_checkpoints=True):
    """Trains ``model`` from ``start_step`` to ``end_step`` with ``model.fit``,
    writing the checkpoints that :class:`InEpochCheckpoints` (one of
    ``callbacks``) requests and stopping on a signal.

    ``make_train(step)``: the training stream from global step ``step``.
    ``checkpointer`` writes the checkpoints (``history()``: the run's rows so
    far, kept in each); ``metrics``: the metric sums of the checkpoint this
    fit resumes from inside an epoch.  ``epoch_checkpoints``: another callback
    writes each epoch's end (the trainer's recorder); otherwise a signal at an
    epoch's end is saved here too.  Returns the Keras ``History`` objects.

    Raises:
        Stopped: a stop signal, after the checkpoint of the step reached
            (``stop_directory``: where it says the checkpoint is).
    """
    in_epoch = next(c for c in callbacks if isinstance(c, InEpochCheckpoints))
    histories, step = [], start_step
    while step < end_step:
        try:
            histories += _fit_segments(model, make_train, validation_data, callbacks,
                                       strategy, steps_per_epoch, step, end_step, metrics,
                                       verbose)
            break
        except SaveRequest as request:
            step = int(keras.ops.convert_to_numpy(model.optimizer.iterations))
            inside = bool(step % steps_per_epoch)
            metrics = metric_state(model) if inside else None
            if inside or not epoch_checkpoints:
                checkpointer.save(model, step=step, epoch=step // steps_per_epoch,
                                  history=history(), extra={"metrics": metrics} if inside
                                  else None)
                if inside:
                    print_fn(f"checkpoint at step {step:,} (inside epoch "
                             f"{step // steps_per_epoch + 1})")
            if request.signal_name is not None:
                strategies.barrier(strategy, "keras_identity_stopped")
                raise Stopped(request.signal_name, step, -(-step // steps_per_epoch),
                              stop_directory or checkpointer.directory) from None
            in_epoch.restart_clock()
    return histories

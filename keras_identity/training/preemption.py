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
  with the run's own collective (:func:`strategies.any_over_processes`), so a
  signal that reaches one host only stops them all.

Both work the same way: the callback :class:`InEpochCheckpoints` raises
:class:`SaveRequest` out of ``model.fit``; :func:`fit_resumable` (the loop
the trainer and the tuner share) writes the checkpoint of the step reached,
a position in the data stream, and either raises :class:`Stopped` or
continues with a new ``fit`` from that step, as a resumed run would.
"""

import math
import os
import re
import signal
import sys
import threading
import time
import warnings

import keras
import numpy as np

from keras_identity.training import strategies
from keras_identity.training.callbacks import TrainingDiverged

# sysexits.h EX_TEMPFAIL: stopped on request after saving; the same command
# continues the run (a scheduler's requeue condition).
STOP_STATUS = os.EX_TEMPFAIL  # 75
DEFAULT_SIGNALS = ("SIGTERM", "SIGINT")
# What --stop_signal may name (those this platform has).
OTHER_SIGNALS = tuple(s for s in ("SIGUSR1", "SIGUSR2", "SIGHUP", "SIGQUIT", "SIGXCPU")
                      if hasattr(signal, s))
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
    if text in DEFAULT_SIGNALS:
        raise ValueError(f"stop_signal={name!r} is not valid: {text} always stops a run; "
                         f"expected another signal: {', '.join(OTHER_SIGNALS)}.")
    if text not in OTHER_SIGNALS:
        raise ValueError(f"stop_signal={name!r} is not valid; expected one of "
                         f"{', '.join(OTHER_SIGNALS)} (SIGTERM and SIGINT always stop a run).")
    return int(getattr(signal, text))


def place(step, steps_per_epoch):
    """Where ``step`` is in the run, in words: ``"end of epoch E"`` or
    ``"inside epoch E"`` (epochs count from 1), the same when a checkpoint is
    written, when a signal stops the run there and when a run resumes."""
    epoch, within = divmod(int(step), int(steps_per_epoch))
    return f"inside epoch {epoch + 1}" if within else f"end of epoch {epoch}"


class Stopped(BaseException):
    """The run stopped on a signal after writing the checkpoint of ``step``.
    A ``BaseException``, as ``KeyboardInterrupt`` is: it ends the program (a
    tuner's trial loop, which catches ``Exception``, lets it pass)."""

    def __init__(self, signal_name, step, steps_per_epoch, directory, saved=True):
        self.signal_name, self.step, self.directory = signal_name, int(step), directory
        self.epoch = -(-self.step // int(steps_per_epoch))  # the epoch the step is in or ends
        self.saved = saved
        where = (f"the checkpoint of that step is in {directory}" if saved else
                 "no checkpoint of it (this trial restarts from its start)")
        # What happened, without what to do next (a caller may say it otherwise).
        self.what = (f"stopped by {signal_name} at step {self.step:,} "
                     f"({place(self.step, steps_per_epoch)}): {where}")
        super().__init__(f"{self.what}; run the same command to resume")


class SaveRequest(BaseException):
    """Raised out of ``model.fit`` by :class:`InEpochCheckpoints`: write a
    checkpoint now, then stop (``signal_name`` set) or continue.  A
    ``BaseException``, as ``KeyboardInterrupt`` is, so that code which
    catches ``Exception`` around a fit (a tuner's trial loop) lets it pass."""

    def __init__(self, step, signal_name=None):
        super().__init__(f"a checkpoint of step {step} was requested")
        self.step, self.signal_name = int(step), signal_name


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
            try:
                self.print_fn(f"a second stop signal ({name}): exiting at once, without "
                              f"saving the step in progress (the last checkpoint is intact)")
            finally:  # even if the line cannot be written (a write it interrupted)
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
    in, when a ``fit`` resumes inside that epoch: at the epoch's start, once
    ``fit`` has built and reset the metrics, before its first call, so the
    sums grow in an uninterrupted epoch's order (added after a call of
    several steps, the float32 loss would differ in its last digits).  Where
    ``fit`` builds the metrics only in its first call (TensorFlow, a model
    just restored), they are added after it."""

    def __init__(self, values):
        super().__init__()
        self.values = values

    def on_epoch_begin(self, epoch, logs=None):
        if self.values is not None and add_metric_state(self.model, self.values):
            self.values = None

    def on_train_batch_end(self, batch, logs=None):
        if self.values is None:
            return
        values, self.values = self.values, None
        if not add_metric_state(self.model, values):
            warnings.warn("the checkpoint's metric sums do not fit this model's metrics; "
                          "this epoch's training loss and error count only the steps since "
                          "the checkpoint.", stacklevel=2)


class InEpochCheckpoints(keras.callbacks.Callback):
    """Raises :class:`SaveRequest` before the call that follows a step where
    a checkpoint is due inside an epoch: a stop signal has arrived,
    ``every_steps`` steps or ``every_seconds`` of training have passed since
    the last checkpoint.  Epoch ends are left to the run's own checkpoint: a
    signal that arrives in an epoch's last call or its evaluation stops the
    run right after it (:meth:`on_epoch_end`; this callback comes last).  A
    signal once the run's last step is done is left alone: the run ends.

    The step a request names is the position in the data stream (the
    batches consumed: :meth:`begin_fit` gives where a fit starts), not the
    optimizer's count, which a skipped float16 step does not advance.

    In a single process the decision is taken before each call
    (``on_train_batch_begin``, in the main thread, reading only the step,
    the clock and the signal flag), so a checkpoint due after a call is
    written there on every backend.  (Taken after each call, in
    ``on_train_batch_end``, it ran on JAX in Keras's asynchronous callback
    threads, once the calls dispatched ahead had computed: the main thread
    was then several calls on, and the due checkpoints of an epoch's first
    calls were never written.)  Across processes it is taken after each
    call, the same in every one (:func:`strategies.any_over_processes`, once
    per call, over a fixed list of flags; the callbacks then run in order),
    and acted on before the next; a decision made before the last
    checkpoint is dropped.
    """

    _NAMES = DEFAULT_SIGNALS + OTHER_SIGNALS

    def __init__(self, strategy, signals, steps_per_epoch, every_steps=None,
                 every_seconds=None):
        super().__init__()
        self.strategy = strategy
        self.signals = signals
        self.steps_per_epoch = int(steps_per_epoch)
        self.every_steps = every_steps
        self.every_seconds = every_seconds
        self._several = strategies.several_processes(strategy)
        self._generation = 0
        self._pending = None
        self.begin_fit(0, math.inf)

    @property
    def async_safe(self):
        return keras.backend.backend() == "jax" and not self._several

    def begin_fit(self, step, end_step):
        """The next ``fit`` starts at position ``step`` and the run ends at
        ``end_step``; the clocks restart (a checkpoint was just written)."""
        self._fit_begin, self._end = int(step), end_step
        self._epoch_begin = self._last_saved = int(step)
        self.restart_clock()

    def restart_clock(self):
        self._last_time = time.monotonic()
        self._generation += 1
        self._pending = None

    def on_epoch_begin(self, epoch, logs=None):
        self._epoch_begin = max(epoch * self.steps_per_epoch, self._fit_begin)

    def _decide(self, late=False):
        """``(signal name or None, an interval checkpoint due)``, the same
        in every process."""
        received = self.signals.received if self.signals is not None else None
        if not self._several:
            return received, late
        flags = strategies.any_over_processes(
            self.strategy, [received == name for name in self._NAMES] + [late])
        return next((n for n, flag in zip(self._NAMES, flags) if flag), None), flags[-1]

    def _late(self, step):
        """Whether an interval checkpoint is due at ``step``."""
        return (self.every_seconds is not None
                and time.monotonic() - self._last_time >= self.every_seconds) or bool(
                    self.every_steps and step - self._last_saved >= self.every_steps)

    def _inside(self, step):
        """Whether ``step`` may take a checkpoint of this callback: inside an
        epoch, before the run's end (those have their own checkpoints)."""
        return step % self.steps_per_epoch != 0 and step < self._end

    def on_train_batch_begin(self, batch, logs=None):
        step = self._epoch_begin + int(batch)
        if not self._several:
            # Decided here, in the main thread, after the call before.
            if step > self._last_saved and self._inside(step):
                received, late = self._decide(self._late(step))
                if received is not None or late:
                    raise SaveRequest(step, received)
            return
        pending, self._pending = self._pending, None
        if pending is not None and pending[0] == self._generation:
            raise SaveRequest(step, pending[1])

    def on_train_batch_end(self, batch, logs=None):
        if not self._several:
            return  # decided before the next call (on_train_batch_begin)
        generation, step = self._generation, self._epoch_begin + int(batch) + 1
        if not self._inside(step) or self._pending:
            return  # an epoch or the run ends here (their own checkpoints), or decided
        received, late = self._decide(self._late(step))
        if received is not None or late:
            self._pending = (generation, received)

    def on_epoch_end(self, epoch, logs=None):
        # The run's epoch-end checkpoint was just written (the recorder runs
        # before): an interval checkpoint still pending is not needed.
        step = min((epoch + 1) * self.steps_per_epoch, self._end)
        self._last_saved = step
        self.restart_clock()
        received, _ = self._decide()
        if received is not None and step < self._end:
            raise SaveRequest(step, received)


class EpochLog(keras.callbacks.Callback):
    """Keeps each epoch's logs (``rows``) and writes a checkpoint at each
    epoch's end with them, at its position in the data stream: what a fit
    that is not a ``keras-identity-train`` run (a tuner's trial, whose
    epochs are whole) resumes from."""

    def __init__(self, checkpointer, steps_per_epoch, rows=()):
        super().__init__()
        self.checkpointer = checkpointer
        self.steps_per_epoch = int(steps_per_epoch)
        self.rows = list(rows)

    def on_epoch_end(self, epoch, logs=None):
        self.rows.append({"epoch": epoch + 1, **{k: float(v) for k, v in (logs or {}).items()}})
        self.checkpointer.save(self.model, step=(epoch + 1) * self.steps_per_epoch,
                               epoch=epoch + 1, history=self.rows)

    def history(self):
        """A Keras ``History`` of every epoch logged, before a resume too."""
        merged = keras.callbacks.History()
        merged.set_model(self.model)
        merged.epoch = [row["epoch"] - 1 for row in self.rows]
        keys = [k for k in self.rows[-1] if k != "epoch"] if self.rows else []
        merged.history = {k: [row.get(k) for row in self.rows] for k in keys}
        return merged


def close_stream(stream):
    """Stops an input stream's threads (the JAX route's ``PyDataset``
    objects; tf.data needs nothing)."""
    if hasattr(stream, "close"):
        stream.close()


def _fit_segments(model, make_train, validation_data, callbacks, in_epoch, strategy,
                  steps_per_epoch, step, end_step, metrics, verbose):
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
        if model.stop_training:  # a callback stopped the segment before (a NaN loss)
            break
        in_epoch.begin_fit(begin, end_step)
        stream = make_train(begin)
        try:
            with strategies.fit_scope(strategy):
                histories.append(model.fit(
                    stream, epochs=-(-end // steps_per_epoch),
                    initial_epoch=begin // steps_per_epoch, steps_per_epoch=steps,
                    validation_data=validation_data, shuffle=False,
                    callbacks=extra + list(callbacks), verbose=verbose))
        finally:
            close_stream(stream)
    return histories


def _loss_state_finite(values):
    return all(math.isfinite(float(v)) for metric in values for value in metric
               for v in np.ravel(value))


def fit_resumable(model, *, make_train, validation_data, callbacks, strategy, steps_per_epoch,
                  start_step, end_step, checkpointer, history=list, state=dict, verbose=0,
                  metrics=None, print_fn=print, stop_directory=None, epoch_checkpoints=True):
    """Trains ``model`` from ``start_step`` to ``end_step`` with ``model.fit``,
    writing the checkpoints that :class:`InEpochCheckpoints` (the last of
    ``callbacks``) requests and stopping on a signal.

    ``make_train(step)``: the training stream from position ``step``.
    ``checkpointer`` writes the checkpoints (``history()``: the run's rows so
    far, and ``state()``: more of the caller's state, kept in each);
    ``metrics``: the metric sums of the checkpoint this fit resumes from
    inside an epoch.  ``epoch_checkpoints``: another callback writes each
    epoch's end (the trainer's recorder); otherwise a signal at an epoch's
    end is saved here too.  Returns the Keras ``History`` objects.

    Raises:
        Stopped: a stop signal, after the checkpoint of the step reached
            (``stop_directory``: where it says the checkpoint is).
        TrainingDiverged: the epoch's loss is not finite where a checkpoint
            was due (none is written).
        ValueError: no :class:`InEpochCheckpoints` among ``callbacks``.
    """
    in_epoch = callbacks[-1] if callbacks else None
    if not isinstance(in_epoch, InEpochCheckpoints):
        raise ValueError("fit_resumable needs an InEpochCheckpoints callback, last in "
                         "callbacks.")
    histories, step = [], start_step
    while step < end_step:
        try:
            histories += _fit_segments(model, make_train, validation_data, callbacks,
                                       in_epoch, strategy, steps_per_epoch, step, end_step,
                                       metrics, verbose)
            checkpointer.finish()
            break
        except SaveRequest as request:
            step = request.step
            inside = bool(step % steps_per_epoch)
            metrics = metric_state(model) if inside else None
            # model.metrics[0] is Keras's loss tracker: its sums are the loss's.
            if inside and not _loss_state_finite(metrics[:1]):
                raise TrainingDiverged(step, step // steps_per_epoch + 1, float("nan")) \
                    from None
            if inside or not epoch_checkpoints:
                extra = dict(state())
                if inside:
                    extra["metrics"] = metrics
                checkpointer.save(model, step=step, epoch=step // steps_per_epoch,
                                  history=history(), extra=extra)
                if inside:
                    print_fn(f"checkpoint at step {step:,} "
                             f"({place(step, steps_per_epoch)})")
            if request.signal_name is not None:
                checkpointer.finish()  # written, not just begun
                strategies.barrier(strategy, "keras_identity_stopped")
                raise Stopped(request.signal_name, step, steps_per_epoch,
                              stop_directory or checkpointer.directory) from None
    return histories

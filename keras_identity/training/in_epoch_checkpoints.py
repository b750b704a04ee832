"""Checkpoints inside an epoch (``--checkpoint_every``, and the step a
stop signal arrives at): :class:`InEpochCheckpoints` says when one is due by
raising :class:`SaveRequest` out of ``model.fit``
(:func:`~keras_identity.training.fit_loop.fit_resumable` writes it); such a
checkpoint keeps the epoch's metric sums (:func:`metric_state`), which
:class:`RestoreMetrics` puts back when the epoch resumes, so the resumed
epoch reports what the uninterrupted one would have.

Every process of a multi-process run writes an interval checkpoint, or
stops, after the same step: the decision is taken once per compiled call
(``steps_per_execution`` steps) with the run's own collective
(:func:`strategies.any_over_processes`), so a signal that reaches one host
only stops them all.
"""

import math
import time
import warnings

import keras
import numpy as np

from keras_identity.training import strategies
from keras_identity.training.preemption import DEFAULT_SIGNALS
from keras_identity.training.preemption import OTHER_SIGNALS


class SaveRequest(BaseException):
    """Raised out of ``model.fit`` by :class:`InEpochCheckpoints`: write a
    checkpoint now, then stop (``signal_name`` set) or continue.  A
    ``BaseException``, as ``KeyboardInterrupt`` is, so that code which
    catches ``Exception`` around a fit (a tuner's trial loop) lets it pass."""

    def __init__(self, step, signal_name=None):
        super().__init__(f"a checkpoint of step {step} was requested")
        self.step, self.signal_name = int(step), signal_name


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

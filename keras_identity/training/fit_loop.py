"""The training loop every run goes through, and the callbacks that steer it.

:func:`fit_resumable` runs ``model.fit`` in segments: the callback
:class:`InEpochCheckpoints` (last of the callbacks) raises :class:`SaveRequest`
out of ``model.fit`` where a checkpoint inside an epoch is due
(``--checkpoint_every``, a stop signal); the loop writes it, with the epoch's
metric sums (:func:`metric_state`, put back by :class:`RestoreMetrics`), then
stops (:class:`~keras_identity.training.preemption.Stopped`) or fits on from
that step.  :class:`StopOnNaN` and :class:`StopAtStep` end a fit at a step.
"""

import math
import time
import warnings

import keras
import numpy as np

from keras_identity.training import strategies
from keras_identity.training.preemption import DEFAULT_SIGNALS
from keras_identity.training.preemption import OTHER_SIGNALS
from keras_identity.training.preemption import Stopped
from keras_identity.training.preemption import place


class TrainingDiverged(RuntimeError):
    """The loss became NaN or infinite."""

    def __init__(self, step, epoch, loss):
        self.step, self.epoch, self.loss = step, epoch, loss
        super().__init__(f"the training loss became {loss} at step {step} (epoch {epoch}); "
                         f"lower --learning_rate, or check the data and --precision")


class _StepCounter(keras.callbacks.Callback):
    """Knows the optimizer step a batch ends at without reading the model.

    On JAX, ``self.model`` copies the training state back into the model's
    variables (``jax_state_sync``) and a batch hook keeps Keras from running
    the batch callbacks beside the next step; read once per epoch and counted
    from the batch index, the step costs neither.
    """

    def __init__(self):
        super().__init__()
        self._epoch, self._epoch_start, self._trained = 0, 0, None

    def set_model(self, model):
        super().set_model(model)
        self._trained = model  # for stop_training, without the state copy of self.model

    def on_epoch_begin(self, epoch, logs=None):
        self._epoch = epoch + 1
        self._epoch_start = int(keras.ops.convert_to_numpy(self.model.optimizer.iterations))

    def step(self, batch):
        """The optimizer step after batch ``batch`` (0-based) of this epoch."""
        return self._epoch_start + int(batch) + 1


class StopOnNaN(_StepCounter):
    """Stops training with :class:`TrainingDiverged`, naming the step (the
    last of a call that runs several, ``steps_per_execution``).

    In one JAX process it runs beside the next step (Keras's asynchronous
    batch callbacks): it stops the loop, and Keras raises the error at a
    later batch or at the epoch's end.  Across processes it runs between
    steps, so that every process stops at the same batch.
    """

    @property
    def async_safe(self):
        if keras.backend.backend() != "jax":
            return False
        import jax

        return jax.process_count() == 1

    def on_train_batch_end(self, batch, logs=None):
        loss = (logs or {}).get("loss")
        if loss is not None and not math.isfinite(float(loss)):
            self._trained.stop_training = True
            raise TrainingDiverged(self.step(batch), self._epoch, float(loss))


class StopAtStep(_StepCounter):
    """Ends training after exactly ``total_steps`` optimizer steps (needed
    only where they end inside an epoch)."""

    def __init__(self, total_steps):
        super().__init__()
        self.total_steps = int(total_steps)

    def on_train_batch_end(self, batch, logs=None):
        if self.step(batch) >= self.total_steps:
            self._trained.stop_training = True


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
    """Raises :class:`SaveRequest` before the call that follows a step where a checkpoint is
    due inside an epoch: a stop signal has arrived, ``every_steps`` steps or
    ``every_seconds`` of training have passed since the last checkpoint.  Epoch ends are
    left to the run's own checkpoint: a signal that arrives in an epoch's last call or its
    evaluation stops the run right after it (:meth:`on_epoch_end`; this callback comes
    last).  A signal once the run's last step is done is left alone: the run ends.

    The step a request names is the position in the data stream (the batches consumed:
    :meth:`begin_fit` gives where a fit starts), not the optimizer's count, which a skipped
    float16 step does not advance.

    In a single process the decision is taken before each call (``on_train_batch_begin``, in
    the main thread, reading only the step, the clock and the signal flag), so a checkpoint
    due after a call is written there on every backend (after each call, on JAX, it would
    run in Keras's asynchronous callback threads, calls behind).  Across processes it is
    taken after each call, the same in every one (:func:`strategies.any_over_processes`,
    once per call, over a fixed list of flags; the callbacks then run in order), and acted
    on before the next; a decision made before the last checkpoint is dropped.
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
    """Trains ``model`` from ``start_step`` to ``end_step`` with ``model.fit``, writing the
    checkpoints that :class:`InEpochCheckpoints` (the last of ``callbacks``) requests and
    stopping on a signal.

    ``make_train(step)``: the training stream from position ``step``.  ``checkpointer``
    writes the checkpoints (``history()``: the run's rows so far, and ``state()``: more of
    the caller's state, kept in each); ``metrics``: the metric sums of the checkpoint this
    fit resumes from inside an epoch.  ``epoch_checkpoints``: another callback writes each
    epoch's end (the trainer's recorder); otherwise a signal at an epoch's end is saved here
    too.  Returns the Keras ``History`` objects.

    Raises:
        Stopped: a stop signal, after the checkpoint of the step reached
            (``stop_directory``: where it says the checkpoint is).
        TrainingDiverged: the epoch's loss is not finite where a checkpoint was due (none is
            written).
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

"""The training loop every run goes through: :func:`fit_resumable`, a
``model.fit`` in segments that writes the checkpoints
:class:`~keras_identity.training.in_epoch_checkpoints.InEpochCheckpoints`
requests inside an epoch and stops on a signal
(:class:`~keras_identity.training.preemption.Stopped`).  A request (a
:class:`~keras_identity.training.in_epoch_checkpoints.SaveRequest` raised out
of ``model.fit``) writes the checkpoint of the step reached, a position in
the data stream, and either stops or continues with a new ``fit`` from that
step, as a resumed run would; a fit that starts inside an epoch first
finishes that epoch.  The trainer and the tuner's trials share it.
"""

import math

import numpy as np

from keras_identity.training import strategies
from keras_identity.training.in_epoch_checkpoints import InEpochCheckpoints
from keras_identity.training.in_epoch_checkpoints import RestoreMetrics
from keras_identity.training.in_epoch_checkpoints import SaveRequest
from keras_identity.training.in_epoch_checkpoints import metric_state
from keras_identity.training.preemption import Stopped
from keras_identity.training.preemption import place
from keras_identity.training.stop_callbacks import TrainingDiverged


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

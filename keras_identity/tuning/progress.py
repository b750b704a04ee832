"""How a search's trials keep their progress and stop: :class:`TrialProgress`
(each trial's checkpoints in its progress folder, resumed when the search
retries the trial; a Hyperband round stopped without a checkpoint),
:class:`UnreadableProgress` (a progress folder none of whose checkpoints can
be read) and :class:`SearchStopped` (a search stopped by a signal, in words
that say what the same command does next)."""

import keras

from keras_identity import storage
from keras_identity.training import checkpoints
from keras_identity.training import fit_loop
from keras_identity.training import preemption
from keras_identity.training import recorders


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
        log = recorders.EpochLog(checkpointer, self.steps_per_epoch,
                                  state["history"] if state else ())
        in_epoch = fit_loop.InEpochCheckpoints(
            self.strategy, self.signals, self.steps_per_epoch, self.every_steps,
            self.every_seconds)
        fit_loop.fit_resumable(
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
            fit_loop.close_stream(stream)
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

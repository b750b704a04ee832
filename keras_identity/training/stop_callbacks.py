"""Callbacks that end ``model.fit`` at a step: :class:`StopOnNaN` (a loss
that is not finite, :class:`TrainingDiverged`) and :class:`StopAtStep` (a
run that ends inside an epoch)."""

import math

import keras


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

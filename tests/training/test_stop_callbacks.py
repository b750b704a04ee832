"""The callbacks that stop a fit (keras_identity.training.stop_callbacks)
leave Keras free to run the batch callbacks beside the next step."""

import keras

from keras_identity.training import stop_callbacks
from keras_identity.training import tensorboard_logs
from tests.backend import jax_only


@jax_only
def test_the_runs_batch_callbacks_let_keras_run_them_beside_the_next_step(tmp_path):
    # On JAX Keras runs batch callbacks in a thread, beside the next step, only
    # when each is async-safe or has no batch hook; one that reads self.model
    # in a batch hook copies the training state back into the model each step.
    # StopAtStep, needed only inside an epoch, is the one that stops it.
    run = [stop_callbacks.StopOnNaN(), tensorboard_logs.EpochSummaries(str(tmp_path))]
    assert keras.callbacks.CallbackList(run)._async_train
    assert not keras.callbacks.CallbackList(run + [stop_callbacks.StopAtStep(5)])._async_train

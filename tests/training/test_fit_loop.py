"""The training loop (keras_identity.training.fit_loop): the callbacks that
stop a fit leave Keras free to run the batch callbacks beside the next step."""

import keras

from keras_identity.training import fit_loop
from keras_identity.training import recorders
from tests.backend import jax_only


@jax_only
def test_the_runs_batch_callbacks_let_keras_run_them_beside_the_next_step(tmp_path):
    # On JAX Keras runs batch callbacks in a thread, beside the next step, only
    # when each is async-safe or has no batch hook; one that reads self.model
    # in a batch hook copies the training state back into the model each step.
    # StopAtStep, needed only inside an epoch, is the one that stops it.
    run = [fit_loop.StopOnNaN(), recorders.EpochSummaries(str(tmp_path))]
    assert keras.callbacks.CallbackList(run)._async_train
    assert not keras.callbacks.CallbackList(run + [fit_loop.StopAtStep(5)])._async_train

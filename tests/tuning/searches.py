"""Helpers of the search tests: small searches, and a stop signal sent at a
chosen batch."""

import os

from keras_identity.training import TrainConfig
from keras_identity.tuning import SearchConfig


def quiet(*_):
    pass


def search_config(tmp_path, **kwargs):
    train = TrainConfig(model="highway_net", depth=4, train_examples=3000, epochs=1,
                        verbose=0, model_dir=str(tmp_path / "tune"))
    return SearchConfig(train=train, **kwargs)


def tiny_search(tmp_path, name, gate_biases, **kwargs):
    """A search small enough for several runs in one test: 1,280 training
    images (9 steps an epoch), one epoch, deterministic."""
    search = search_config(tmp_path / name, gate_biases=gate_biases, **kwargs)
    search.train.train_examples = 1280
    search.train.deterministic, search.train.seed = True, 1
    search.train.steps_per_execution = 1
    return search


def stop_at(patch, method, when):
    """Patches ``InEpochCheckpoints.<method>`` to send this process SIGTERM
    (once) before the call where ``when(self, *args)`` is true."""
    import signal

    from keras_identity.training import fit_loop

    original = getattr(fit_loop.InEpochCheckpoints, method)
    sent = []

    def hook(self, *args, **kwargs):
        if not sent and when(self, *args):
            sent.append(True)
            os.kill(os.getpid(), signal.SIGTERM)
        return original(self, *args, **kwargs)

    patch.setattr(fit_loop.InEpochCheckpoints, method, hook)
    return sent


def stop_in_the_second_trial(patch):
    """SIGTERM at the 31st training batch of a search of 2-epoch trials of 9
    steps an epoch: the second trial, 4 steps into its epoch 2."""
    calls = []

    def when(self, *args):
        calls.append(True)
        return len(calls) == 18 + 13

    return stop_at(patch, "on_train_batch_end", when)

"""The data a run trains on and its input normalisation.

:func:`load_data` loads ``--dataset`` (from ``--data_dir``) for the
backend's input route, refuses an empty split, checks ``--input_workers``
against it and takes the ``--train_examples``/``--test_examples`` subsets;
:func:`make_normalization` makes the ``--normalization`` layer's statistics
from its training images.  The trainer and the tuner share both.
"""

import keras

from keras_identity.data import arrays
from keras_identity.data import datasets as datasets_lib
from keras_identity.data import normalization as normalization_lib


def load_data(config):
    """The run's data; a split without images is refused (a run would report
    a test error of NaN), and so is ``--input_workers`` for data in memory."""
    # The JAX route reads tensorflow_datasets through its random-access data
    # source (no TensorFlow); the TensorFlow route through tf.data.
    data = datasets_lib.load_dataset(config.dataset, config.data_dir,
                                     random_access=keras.backend.backend() == "jax")
    for split, count in (("training", data.num_train), ("test", data.num_test)):
        if not count:
            raise ValueError(f"data_dir={config.data_dir or data.source!r}: the {split} set of "
                             f"{config.dataset} has no images; expected at least one.")
    if config.input_workers is not None:
        arrays.resolve_worker_processes(config.input_workers, data, name="input_workers")
    if config.train_examples or config.test_examples:
        data = data.subset(config.train_examples, config.test_examples, seed=config.seed)
    return data


def make_normalization(mode, data):
    """The input normalisation ``mode`` for ``data``, with its statistics from
    the training images held in memory (ImageNet's ``per_channel``: the
    published ones); data streamed from files takes only ``scale`` (and
    ImageNet's ``per_channel``)."""
    if mode == "per_channel" and data.name == "imagenet":
        return normalization_lib.Normalization.imagenet()
    if data.in_memory:
        return normalization_lib.Normalization.from_images(mode, data.x_train)
    if mode != "scale":
        raise ValueError(f"normalization={mode!r} needs its statistics from the training "
                         f"images, which {data.name} streams from files; use 'per_channel' "
                         f"(ImageNet: its published statistics) or 'scale'.")
    return normalization_lib.Normalization(mode)

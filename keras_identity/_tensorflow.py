"""Whether TensorFlow is installed, and the one line that says what to
install where it is needed (the tf.data route, SavedModel export, the
TensorFlow backend); the JAX route runs without it."""

import importlib.util

INSTALL = ("pip install 'keras_identity[cpu]' (tensorflow-cpu; on a GPU machine "
           "'keras_identity[gpu]')")


class MissingTensorFlow(ImportError):
    """TensorFlow is needed for what was asked and is not installed; the
    message names what needs it and the install (one line)."""


def available():
    """Whether TensorFlow can be imported (without importing it)."""
    return importlib.util.find_spec("tensorflow") is not None


def require(what):
    """Raises :class:`MissingTensorFlow` naming ``what`` unless TensorFlow is
    installed."""
    if not available():
        raise MissingTensorFlow(f"{what} needs TensorFlow, which is not installed: {INSTALL}.")

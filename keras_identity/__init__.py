"""keras_identity: the residual and highway networks of He et al. (2016),
*Identity Mappings in Deep Residual Networks*, and Srivastava et al. (2015),
*Training Very Deep Networks*, as Keras 3 layers and models."""

# Keras first, so that its backend (JAX, or PyTorch) loads before TensorFlow.
import keras

# Backends on which every layer, model, looped stage and the trainer run; on
# others (PyTorch) the unrolled layers and models work and the looped stages
# and training programs say which backends they need.
SUPPORTED_BACKENDS = ("tensorflow", "jax")

try:
    import tensorflow  # noqa: F401  (tf.data input and SavedModel export, on every backend)
except ImportError as error:  # pragma: no cover - depends on the install
    raise ImportError(
        f"keras_identity needs TensorFlow for its input pipelines and exports (the Keras "
        f"backend is {keras.backend.backend()!r}): pip install 'keras_identity[cpu]' "
        f"(tensorflow-cpu), 'keras_identity[gpu]' (tensorflow[and-cuda]) or "
        f"'keras_identity[jax]' (JAX with tensorflow-cpu).") from error

from keras_identity import data
from keras_identity import initializers
from keras_identity import layers
from keras_identity import models
from keras_identity import training
from keras_identity import analysis

__version__ = "0.1.0"

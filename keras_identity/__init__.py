"""keras_identity: the residual and highway networks of He et al. (2016),
*Identity Mappings in Deep Residual Networks*, and Srivastava et al. (2015),
*Training Very Deep Networks*, as Keras 3 layers and models."""

try:
    import tensorflow  # noqa: F401  (the Keras backend this package targets)
except ImportError as error:  # pragma: no cover - depends on the install
    raise ImportError(
        "keras_identity needs TensorFlow: pip install 'keras_identity[cpu]' "
        "(tensorflow-cpu), 'keras_identity[gpu]' (tensorflow[and-cuda]) or use the "
        "TensorFlow your platform provides (Colab TPU).") from error

from keras_identity import data
from keras_identity import layers
from keras_identity import models
from keras_identity import training
from keras_identity import analysis

__version__ = "0.1.0"

"""keras_identity: the residual and highway networks of He et al. (2016),
*Identity Mappings in Deep Residual Networks*, and Srivastava et al. (2015),
*Training Very Deep Networks*, as Keras 3 layers and models."""

import importlib.util as _importlib_util
import json as _json
import os as _os
import sys as _sys


def _keras_json_backend():
    path = _os.path.join(_os.environ.get("KERAS_HOME") or _os.path.expanduser("~/.keras"),
                         "keras.json")
    try:
        with open(path) as f:
            return _json.load(f).get("backend")
    except (OSError, ValueError, AttributeError):
        return None


# An install without TensorFlow (pip install 'keras_identity[jax]') whose
# backend nobody chose runs on JAX: Keras's own default, TensorFlow (which
# Keras also writes into a new keras.json), would fail to import.
if ("keras" not in _sys.modules and not _os.environ.get("KERAS_BACKEND")
        and _keras_json_backend() in (None, "tensorflow")
        and _importlib_util.find_spec("tensorflow") is None
        and _importlib_util.find_spec("jax") is not None):
    _os.environ["KERAS_BACKEND"] = "jax"

# TensorFlow's CPU kernels are chosen before TensorFlow is imported (it reads
# TF_ENABLE_ONEDNN_OPTS once): oneDNN for training, unless the user set the
# variable or a program chose for its own path first (keras_identity._cpu_kernels).
from keras_identity import _cpu_kernels  # noqa: E402

_cpu_kernels.choose("training")

# Keras first, so that its backend (JAX, or PyTorch) loads before TensorFlow.
import keras  # noqa: E402

# TensorFlow has read the choice (on its backend): the processes this one
# starts choose for themselves, or keep the user's setting.
_cpu_kernels.release()

# Backends on which every layer, model, looped stage and the trainer run; on
# others (PyTorch) the unrolled layers and models work and the looped stages
# and training programs say which backends they need.
SUPPORTED_BACKENDS = ("tensorflow", "jax")

from keras_identity import data  # noqa: E402
from keras_identity import initializers  # noqa: E402
from keras_identity import layers  # noqa: E402
from keras_identity import models  # noqa: E402
from keras_identity import recipes  # noqa: E402
from keras_identity import training  # noqa: E402
from keras_identity import analysis  # noqa: E402
from keras_identity.version import __version__  # noqa: E402,F401

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SHARED = os.path.join(os.path.dirname(REPO), "shared")


@pytest.fixture(autouse=True)
def _fresh_keras_state():
    """Each test starts with float32, a fixed seed and fresh layer names."""
    keras.config.set_dtype_policy("float32")
    keras.utils.set_random_seed(1234)
    keras.backend.clear_session()
    yield
    keras.config.set_dtype_policy("float32")
    from keras_identity.training.trainer import set_op_determinism

    set_op_determinism(False)


@pytest.fixture
def rng():
    return np.random.default_rng(0)


@pytest.fixture
def shared_dir():
    if not os.path.isdir(SHARED):
        pytest.skip("../shared is not beside the repository")
    return SHARED

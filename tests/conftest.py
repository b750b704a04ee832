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


# --- CI's legs -----------------------------------------------------------------
# `KERAS_BACKEND=jax python -m pytest -q --jax-leg` runs the tests marked
# `jax_leg` (their code differs on JAX: the looped stage, training and
# distribution, export, the TensorFlow == JAX checks) within CI's time budget,
# less those marked `not_on_jax_leg`; without --jax-leg every test runs on JAX
# (about 25 minutes on 2 CPU cores).  `python -m pytest -q --core-leg` runs the
# tests marked `core_leg`: CI repeats them with tensorflow-cpu 2.19
# (tensorflow-tpu's last release line): the layers, the models, the looped
# stage with its written gradient, XLA training steps in bfloat16, training,
# and the export.  The markers are declared in setup.cfg.


def pytest_addoption(parser):
    parser.addoption("--jax-leg", action="store_true",
                     help="on KERAS_BACKEND=jax, run only CI's JAX leg (see tests/conftest.py)")
    parser.addoption("--core-leg", action="store_true",
                     help="run only the core tests (CI's TensorFlow 2.19 leg, see "
                          "tests/conftest.py)")


def pytest_collection_modifyitems(config, items):
    from keras_identity import _tensorflow

    if not _tensorflow.available():
        skip = pytest.mark.skip(reason="needs TensorFlow, which is not installed")
        for item in items:
            if item.get_closest_marker("needs_tensorflow"):
                item.add_marker(skip)
    if config.getoption("--core-leg"):
        keep = [item for item in items if item.get_closest_marker("core_leg")]
    elif config.getoption("--jax-leg"):
        if keras.backend.backend() != "jax":
            raise pytest.UsageError("--jax-leg needs KERAS_BACKEND=jax")
        keep = [item for item in items if item.get_closest_marker("jax_leg")
                and not item.get_closest_marker("not_on_jax_leg")]
    else:
        return
    config.hook.pytest_deselected(items=[item for item in items if item not in keep])
    items[:] = keep

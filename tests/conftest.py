import os
import tempfile

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
# On JAX, the XLA programs the tests compile (the same initialisers, layers and
# train steps again and again, in both test processes and in the programs the
# tests start) are kept in a compilation cache shared by all of them.
os.environ.setdefault("JAX_COMPILATION_CACHE_DIR",
                      os.path.join(tempfile.gettempdir(), "keras_identity_tests_jax_cache"))
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0")
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES", "0")

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
# Every test runs on the backend KERAS_BACKEND picks; one that does not apply to
# it carries a marker (tests/backend.py: `tensorflow_only`, `jax_only`; setup.cfg:
# `needs_tensorflow`, skipped where TensorFlow is not installed).  CI runs the
# suite on TensorFlow, on JAX without TensorFlow installed, and the JAX tests
# that need TensorFlow beside it (`-m needs_tensorflow`).  `python -m pytest -q
# --core-leg` runs the tests marked `core_leg`: CI repeats them with
# tensorflow-cpu 2.19 (tensorflow-tpu's last release line): the layers, the
# models, the looped stage with its written gradient, XLA training steps in
# bfloat16, training, and the export.  The markers are declared in setup.cfg.


def pytest_addoption(parser):
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
    if not config.getoption("--core-leg"):
        return
    keep = [item for item in items if item.get_closest_marker("core_leg")]
    config.hook.pytest_deselected(items=[item for item in items if item not in keep])
    items[:] = keep

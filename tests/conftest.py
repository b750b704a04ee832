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


# --- CI's JAX leg ------------------------------------------------------------
# `KERAS_BACKEND=jax python -m pytest -q --jax-leg` runs the tests whose code
# differs on JAX (the looped stage, training and distribution, export, the
# TensorFlow == JAX checks) within CI's time budget; without --jax-leg every
# test runs on JAX (about 25 minutes on 2 CPU cores).
JAX_LEG = (
    "tests/backends/",
    "tests/layers/residual/test_stack.py",
    "tests/models/test_stage.py",
    "tests/training/test_jax_distribution.py",
    "tests/training/test_trainer.py::test_short_real_mnist_run_is_well_above_chance",
    "tests/training/test_trainer.py::test_mixed_bfloat16_xla_step_as_on_a_tpu",
    "tests/experiments/test_train_cli.py::test_killed_run_resumes_from_its_checkpoint",
    "tests/tuning/test_search.py::test_small_grid_search_writes_its_table_and_retrains_the_best",
    "tests/serving/test_export.py::test_fresh_process_matches_model_predict",
    "tests/serving/test_export.py::test_saved_model_cli_lists_the_signatures",
    "tests/serving/test_export.py::test_warmup_requests_parse_and_replay",
    "tests/serving/test_export.py::test_every_family_exports",
    "tests/serving/test_export.py::test_keras_model_export_matches_predict_in_a_fresh_process",
    "tests/training/test_tpu_steps.py::test_every_family_trains_with_xla_in_bfloat16",
    "tests/layers/test_preprocessing.py",
    "tests/models/test_inputs_and_outputs.py::test_a_model_with_its_preprocessing_equals",
    "tests/export/test_export_cli.py::test_local_server_answers_rest_and_grpc_clients",
)
# The 90-case looped == unrolled check: on JAX it is implied by the
# TensorFlow == JAX check of the same cases (tests/backends) and the
# TensorFlow leg's own run of it.
JAX_LEG_EXCLUDED = ("test_every_shortcut_ordering_and_block_equals_unrolled",)


# --- CI's TensorFlow 2.19 leg -------------------------------------------------
# tensorflow-tpu's last release line is 2.19, so CI also runs the core tests
# with tensorflow-cpu 2.19 (`python -m pytest -q --core-leg` in that
# environment): the layers, the models, the looped stage with its written
# gradient, XLA training steps in bfloat16, training, and the export.
CORE_LEG = (
    "tests/layers/test_highway.py",
    "tests/layers/test_preprocessing.py",
    "tests/layers/test_fused_batch_normalization.py",
    "tests/layers/residual/test_tf_loop.py",
    "tests/layers/residual/test_shortcuts.py",
    "tests/models/test_resnet.py::test_parameter_counts",
    "tests/models/test_highway_net.py",
    "tests/models/test_inputs_and_outputs.py",
    "tests/training/test_tpu_steps.py::test_every_family_trains_with_xla_in_bfloat16",
    "tests/training/test_trainer.py::test_short_real_mnist_run_is_well_above_chance",
    "tests/training/test_strategies.py",
    "tests/serving/test_export.py",
)


def pytest_addoption(parser):
    parser.addoption("--jax-leg", action="store_true",
                     help="on KERAS_BACKEND=jax, run only CI's JAX leg (see tests/conftest.py)")
    parser.addoption("--core-leg", action="store_true",
                     help="run only the core tests (CI's TensorFlow 2.19 leg, see "
                          "tests/conftest.py)")


def pytest_collection_modifyitems(config, items):
    if config.getoption("--core-leg"):
        keep = [item for item in items if item.nodeid.startswith(CORE_LEG)]
        config.hook.pytest_deselected(items=[item for item in items if item not in keep])
        items[:] = keep
        return
    if not config.getoption("--jax-leg"):
        return
    if keras.backend.backend() != "jax":
        raise pytest.UsageError("--jax-leg needs KERAS_BACKEND=jax")
    keep = [item for item in items if item.nodeid.startswith(JAX_LEG)
            and not any(name in item.nodeid for name in JAX_LEG_EXCLUDED)]
    config.hook.pytest_deselected(items=[item for item in items if item not in keep])
    items[:] = keep

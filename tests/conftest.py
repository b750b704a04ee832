import gc
import json
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
# XLA's CPU backend compiles at LLVM's -O3 by default, where each of JAX's
# random initialisers (threefry, one program per weight shape) takes 2-7 s to
# compile, against 0.4-0.5 s at -O2, whose draws run as fast (a 7.4M-value draw:
# 0.24-0.29 s at either level; 2 Sapphire Rapids cores): a tiny JAX training
# program ran 10-11 s instead of 14-16 s.  TensorFlow's XLA training steps
# (jit_compile) took 20% less CPU time at -O2 too.  So the programs the tests
# start (of a few steps to hundreds) inherit -O2 through XLA_FLAGS, on both
# backends, and so does the TensorFlow test process's own XLA.  On JAX, this
# process's own programs (tiny nets, compiled once, run a few steps: compiling
# is most of their time) are compiled at the lowest level without LLVM's
# expensive passes (what jax_disable_most_optimizations sets): the
# looped-stage and unit tests a third faster on 2 cores, the second flag 15%
# more (test_stack.py, 190 s to 162 s on 2 AVX2 cores).  A user's own XLA_FLAGS
# are kept as they are.  The CPU backend reads XLA_FLAGS once, when it starts.
if "XLA_FLAGS" not in os.environ:
    if os.environ.get("KERAS_BACKEND") == "jax":
        os.environ["XLA_FLAGS"] = ("--xla_backend_optimization_level=0 "
                                   "--xla_llvm_disable_expensive_passes=true")
        import jax

        jax.devices()
    os.environ["XLA_FLAGS"] = "--xla_backend_optimization_level=2"

import keras  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SHARED = os.path.join(os.path.dirname(REPO), "shared")


@pytest.fixture(autouse=True, scope="module")
def _frozen_heap():
    """What a test file's tests keep alive (its module's fixtures) is freed
    when the file ends: the heap frozen test by test (below) is thawed and
    collected once."""
    yield
    gc.unfreeze()
    gc.collect()


@pytest.fixture(autouse=True)
def _fresh_keras_state(_frozen_heap):
    """Each test starts with float32, a fixed seed and fresh layer names, and
    the garbage of the tests before it collected.  A full collection scans
    every object of the process (TensorFlow's or JAX's modules: 0.2-0.5 s a
    test, 10 minutes a leg); what survives it is frozen (gc.freeze), so the
    next test's collection scans only what was made since."""
    keras.config.set_dtype_policy("float32")
    keras.utils.set_random_seed(1234)
    keras.backend.clear_session(free_memory=False)
    gc.collect()
    gc.freeze()
    yield
    keras.config.set_dtype_policy("float32")
    from keras_identity.training.numerics import set_op_determinism

    set_op_determinism(False)


@pytest.fixture(autouse=True)
def _no_pytorch_in_the_test_process():
    """PyTorch runs in processes of its own in this suite (the PyTorch
    references of experiments/ and benchmarks/ are programs, and their tests
    start them): imported beside TensorFlow, ``torch.optim`` loads
    torch._dynamo and Triton, which crashed a pytest-xdist worker with a
    segmentation fault.  A test that imports it fails here, by name."""
    import sys

    before = "torch" in sys.modules
    yield
    if not before and "torch" in sys.modules:
        pytest.fail("this test imported PyTorch into the test process; run the PyTorch side "
                    "in a process of its own (see tests/experiments/torch_resnet20_probe.py)",
                    pytrace=False)


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


# The slowest test files first (their time on this backend in
# tests/file_seconds.json, written by `.ci/durations.py LOG --record=BACKEND`):
# pytest-xdist hands out whole files (--dist loadfile) in this order
# (setup.cfg's --no-loadscope-reorder: not by their number of tests), so the
# files left when one process runs out of work are short ones, not a file of
# minutes with the other core idle.  Files not listed come last.
def _slowest_files_first(items):
    path = os.path.join(REPO, "tests", "file_seconds.json")
    try:
        with open(path) as f:
            seconds = json.load(f).get(keras.backend.backend(), {})
    except (OSError, ValueError):
        return
    items.sort(key=lambda item: -seconds.get(item.nodeid.split("::")[0], 0.0))


def pytest_collection_modifyitems(config, items):
    from keras_identity import _tensorflow

    _slowest_files_first(items)

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


# --- A local GCS emulator ------------------------------------------------------
# `gcs_emulator` (session): tests/gcs_emulator.py (gcp-storage-emulator, in
# memory, with GCS's generation preconditions) in a subprocess on a free port,
# with STORAGE_EMULATOR_HOST pointing keras_identity.storage (gcsfs) at it for
# the session.  Calling it gives a fresh gs://BUCKET/PREFIX for one test.
# Skipped where gcp-storage-emulator or gcsfs is not installed.

# The emulator's variable and those the package derives from it.
_EMULATOR_VARIABLES = ("STORAGE_EMULATOR_HOST", "GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT",
                       "TENSORSTORE_GCS_HTTP_URL", "GOOGLE_AUTH_TOKEN_FOR_TESTING")


class GcsEmulator:
    """A running emulator: ``url``, ``bucket``; ``emulator()`` (or
    ``emulator("name")``) gives a new ``gs://BUCKET/PREFIX`` no other test uses."""

    def __init__(self, url, bucket):
        self.url = url
        self.bucket = bucket
        self._count = 0

    def __call__(self, name="t"):
        import uuid

        self._count += 1
        return f"gs://{self.bucket}/{name}-{self._count}-{uuid.uuid4().hex[:8]}"


def _forget_store_clients():
    """Drops the gcsfs clients made so far: they keep the endpoint (and
    credentials) they were made with."""
    from keras_identity import store_clients

    store_clients._FILESYSTEMS.clear()
    try:
        import gcsfs
    except ImportError:
        return
    gcsfs.GCSFileSystem.clear_instance_cache()


def _start_emulator(log_path, bucket, attempts=3):
    import socket
    import subprocess
    import sys
    import time
    import urllib.request

    script = os.path.join(REPO, "tests", "gcs_emulator.py")
    for _ in range(attempts):
        with socket.socket() as probe:  # a free port (another process may take it first: retried)
            probe.bind(("localhost", 0))
            port = probe.getsockname()[1]
        with open(log_path, "ab") as log:
            process = subprocess.Popen(
                [sys.executable, script, f"--port={port}", f"--bucket={bucket}"], stdout=log,
                stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                preexec_fn=_with_parent if sys.platform.startswith("linux") else None)
        url = f"http://localhost:{port}"
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline and process.poll() is None:
            try:
                with urllib.request.urlopen(url + "/", timeout=1) as answer:
                    if answer.status == 200:
                        return process, url
            except OSError:
                time.sleep(0.05)
        _stop_emulator(process)
    with open(log_path, errors="replace") as log:
        tail = log.read()[-2000:]
    raise RuntimeError(f"the GCS emulator (tests/gcs_emulator.py) did not answer within 15 s; "
                       f"its output ({log_path}):\n{tail}")


def _with_parent():
    """The emulator ends with the test process, even one killed before its
    fixtures' teardown (Linux: PR_SET_PDEATHSIG)."""
    import ctypes
    import signal

    try:
        ctypes.CDLL(None, use_errno=True).prctl(1, int(signal.SIGTERM))
    except (OSError, AttributeError):
        pass


def _stop_emulator(process):
    import subprocess

    if process.poll() is None:
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def _skip_without_the_emulators_packages():
    import importlib.util

    for module, package in (("gcp_storage_emulator", "gcp-storage-emulator"),
                            ("gcsfs", "gcsfs")):
        if importlib.util.find_spec(module) is None:
            pytest.skip(f"the GCS emulator tests need {package}, which is not installed "
                        f"(pip install -e '.[test]' gcsfs)")


@pytest.fixture(scope="session")
def gcs_emulator(tmp_path_factory):
    _skip_without_the_emulators_packages()
    bucket = "keras-identity-tests"
    log_path = tmp_path_factory.mktemp("gcs_emulator") / "emulator.log"
    process, url = _start_emulator(log_path, bucket)
    saved = {name: os.environ.get(name) for name in _EMULATOR_VARIABLES}
    for name in _EMULATOR_VARIABLES:
        os.environ.pop(name, None)
    os.environ["STORAGE_EMULATOR_HOST"] = url
    _forget_store_clients()
    try:
        yield GcsEmulator(url, bucket)
    finally:
        _forget_store_clients()
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
        _stop_emulator(process)


# `stalling_gcs_emulator` (one test's): an emulator of its own (not the
# session's, which the other tests share) that the test can stop answering:
# `stall()` stops its process (SIGSTOP: connections are accepted by the
# kernel and never answered, as a stalled store's), `resume()` lets it go on.
# Its `url` is for the programs the test runs (the test's own process keeps
# the session's settings).

class StallingGcsEmulator(GcsEmulator):
    def __init__(self, url, bucket, process):
        super().__init__(url, bucket)
        self.process = process

    def stall(self):
        import signal

        self.process.send_signal(signal.SIGSTOP)

    def resume(self):
        import signal

        self.process.send_signal(signal.SIGCONT)


@pytest.fixture
def stalling_gcs_emulator(tmp_path):
    _skip_without_the_emulators_packages()
    process, url = _start_emulator(tmp_path / "stalling_emulator.log", "keras-identity-stalls")
    emulator = StallingGcsEmulator(url, "keras-identity-stalls", process)
    try:
        yield emulator
    finally:
        emulator.resume()
        _stop_emulator(process)

import pytest
tf = pytest.importorskip("tensorflow")  # TensorFlow-only module

from keras_identity.training import get_strategy
from keras_identity.training import strategies
from tests.backend import tensorflow_only

pytestmark = [tensorflow_only, pytest.mark.core_leg, pytest.mark.quick]  # tf.distribute strategies (JAX: tests/training/test_jax_distribution.py)


def test_auto_on_a_cpu_machine_is_the_default_strategy():
    strategy = get_strategy("auto")
    assert strategy.num_replicas_in_sync == 1
    assert strategies.is_chief(strategy)


@pytest.mark.parametrize("name, kind", [
    ("default", "_DefaultDistributionStrategy"),
    ("one_device", "OneDeviceStrategy"),
    ("mirrored", "MirroredStrategy"),
])
def test_named_strategies(name, kind):
    assert type(get_strategy(name)).__name__ == kind


def test_errors(monkeypatch):
    with pytest.raises(ValueError, match="strategy='gpu'"):
        get_strategy("gpu")
    monkeypatch.delenv("TF_CONFIG", raising=False)
    with pytest.raises(ValueError, match="TF_CONFIG"):
        get_strategy("multi_worker")

    def no_tpu(address):
        raise ValueError(f"Please provide a TPU Name to connect to ({address!r})")

    monkeypatch.setattr(strategies, "_tpu_strategy", no_tpu)
    with pytest.raises(ValueError, match="strategy='tpu' found no TPU"):
        get_strategy("tpu")
    with pytest.raises(ValueError, match="tpu='10.0.0.2:8470': Please provide"):
        get_strategy("auto", tpu_address="10.0.0.2:8470")


def test_tpu_candidates(monkeypatch):
    monkeypatch.setattr(strategies.glob, "glob", lambda pattern: [])
    monkeypatch.delenv("COLAB_TPU_ADDR", raising=False)
    monkeypatch.delenv("TPU_NAME", raising=False)
    assert strategies._tpu_candidates("") == []
    assert strategies._tpu_candidates("10.0.0.2:8470") == ["10.0.0.2:8470"]
    monkeypatch.setattr(strategies.glob, "glob", lambda pattern: ["/dev/accel0"])
    assert strategies._tpu_candidates("") == ["local"]
    assert isinstance(tf.distribute.get_strategy(), tf.distribute.Strategy)


def _no_tpu_kernels(monkeypatch):
    """A TPU VM whose TensorFlow has no TPU kernels (tensorflow-cpu, or
    tensorflow-tpu without its libtpu): what TensorFlow raises there."""
    monkeypatch.setattr(strategies.glob, "glob", lambda pattern: ["/dev/accel0"])

    def initialize(resolver):
        raise tf.errors.NotFoundError(
            None, None, "No OpKernel was registered to support Op 'ConfigureDistributedTPU' "
                        "used by {{node ConfigureDistributedTPU}}")

    class Resolver:
        def __init__(self, tpu=None):
            self.tpu = tpu

    monkeypatch.setattr(tf.distribute.cluster_resolver, "TPUClusterResolver", Resolver)
    monkeypatch.setattr(tf.config, "experimental_connect_to_cluster", lambda resolver: None)
    monkeypatch.setattr(tf.tpu.experimental, "initialize_tpu_system", initialize)


@pytest.mark.parametrize("name", ["auto", "tpu"])
def test_a_tpu_without_tensorflow_tpu_kernels_names_the_missing_install(monkeypatch, name):
    _no_tpu_kernels(monkeypatch)
    with pytest.raises(strategies.MissingTPUSupport) as error:
        get_strategy(name)
    message = str(error.value)
    assert "\n" not in message
    for words in ("tpu='local'", "has no TPU kernels", "tensorflow-tpu", "libtpu",
                  "docs/tpu.md", "KERAS_BACKEND=jax"):
        assert words in message


def test_local_tpu_comes_before_the_named_one(monkeypatch):
    monkeypatch.setattr(strategies.glob, "glob", lambda pattern: ["/dev/vfio/0"])
    monkeypatch.setenv("TPU_NAME", "my-tpu")
    assert strategies._tpu_candidates("") == ["local", ""]
    tried = []

    def fake(address):
        tried.append(address)
        raise ValueError("not reachable")

    monkeypatch.setattr(strategies, "_tpu_strategy", fake)
    # A TPU this machine has but cannot use is an error, not a CPU run.
    with pytest.raises(ValueError, match=r"found a TPU but could not use it \(tpu='local': "
                                         r"not reachable; tpu='': not reachable\)"):
        get_strategy("auto")
    assert tried == ["local", ""]
    monkeypatch.setattr(strategies.glob, "glob", lambda pattern: [])
    monkeypatch.delenv("TPU_NAME")
    assert get_strategy("auto").num_replicas_in_sync == 1  # no TPU: GPUs, then the CPU


def test_a_tpu_address_applies_to_tpu_strategies_only():
    with pytest.raises(ValueError, match="tpu='10.0.0.2:8470' applies only with"):
        get_strategy("mirrored", tpu_address="10.0.0.2:8470")


def test_input_placement_of_a_tf_strategy_distributes_tf_data_pipelines():
    strategy = get_strategy("default")
    assert strategies.input_placement(strategy) == dict(pad_to_batch=False,
                                                        tf_strategy=strategy)


def test_a_strategy_on_cpu_devices_trains_on_the_cpu():
    """What the bfloat16 notice asks (no GPU here): every strategy of CPU devices."""
    assert strategies.trains_on_cpu(tf.distribute.get_strategy())  # the default strategy
    assert strategies.trains_on_cpu(tf.distribute.OneDeviceStrategy("/cpu:0"))
    assert strategies.trains_on_cpu(tf.distribute.MirroredStrategy(["/cpu:0"]))
    assert not strategies.trains_on_cpu(type("Fake", (), {"extended": type(
        "E", (), {"worker_devices": ("/job:localhost/replica:0/task:0/device:GPU:0",)})})())

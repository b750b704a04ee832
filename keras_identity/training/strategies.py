"""Choosing the distribution: a ``tf.distribute`` strategy on TensorFlow, a
``keras.distribution`` on JAX.

The trainer speaks the part of the ``tf.distribute`` interface it needs
(``scope()``, ``num_replicas_in_sync``); on the JAX backend
:class:`KerasDistribution` offers it over ``keras.distribution.DataParallel``:
the variables are replicated on every device (TPU cores, GPUs, or virtual CPU
devices, of one process or of every process of a ``jax.distributed`` run) and
each global batch is split along its first axis, as
``MirroredStrategy``/``TPUStrategy`` split it over replicas.
:func:`input_placement` says where a run's input streams go on a strategy.
"""

import contextlib
import glob
import json
import os

import keras

STRATEGIES = ("auto", "default", "one_device", "mirrored", "multi_worker", "tpu")


# What a TensorFlow without TPU kernels (tensorflow-cpu, or tensorflow-tpu
# without its libtpu) says when asked to initialise a TPU.
_NO_TPU_KERNELS = ("ConfigureDistributedTPU", "No OpKernel was registered")


class MissingTPUSupport(ValueError):
    """A TPU is present but this TensorFlow cannot drive it."""


def _tpu_strategy(address):
    import tensorflow as tf

    try:
        resolver = tf.distribute.cluster_resolver.TPUClusterResolver(tpu=address)
        tf.config.experimental_connect_to_cluster(resolver)
        tf.tpu.experimental.initialize_tpu_system(resolver)
    except (ValueError, RuntimeError, tf.errors.OpError) as error:
        text = " ".join(str(error).split())
        if any(marker in text for marker in _NO_TPU_KERNELS):
            raise MissingTPUSupport(
                f"a TPU is present (tpu={address!r}) but TensorFlow {tf.__version__} has no "
                f"TPU kernels ({text[:100]}): install tensorflow-tpu with the libtpu of its "
                f"version from https://storage.googleapis.com/libtpu-releases/index.html "
                f"(docs/tpu.md), or use the JAX route (KERAS_BACKEND=jax with jax[tpu])."
            ) from None
        raise
    return tf.distribute.TPUStrategy(resolver)


def _tpu_present():
    """Whether this machine has local TPU chips (a TPU VM)."""
    return bool(glob.glob("/dev/accel*") or glob.glob("/dev/vfio/[0-9]*"))


def accelerators_present(name="auto", tpu_address=""):
    """Whether TensorFlow's strategy ``name`` would train on GPUs or a TPU
    here, asked without starting TensorFlow's runtime (physical devices, a
    TPU VM's chips, a TPU named by the flags or the environment)."""
    import tensorflow as tf

    if name == "tpu" or _tpu_candidates(tpu_address):
        return True
    return name != "default" and bool(tf.config.list_physical_devices("GPU"))


def _tpu_candidates(tpu_address):
    """TPU addresses worth trying: the given one, a TPU VM's local chips
    (``/dev/accel*``, ``/dev/vfio``), or the TPU named by the environment
    (older Colab TPU runtimes set ``COLAB_TPU_ADDR``)."""
    if tpu_address:
        return [tpu_address]
    candidates = []
    if _tpu_present():
        candidates.append("local")
    if os.environ.get("COLAB_TPU_ADDR") or os.environ.get("TPU_NAME"):
        candidates.append("")
    return candidates


def _first_tpu(addresses):
    """``(TPUStrategy, [])`` for the first of ``addresses`` that initialises,
    else ``(None, [(address, error), ...])``; a TPU without TensorFlow TPU
    kernels raises :class:`MissingTPUSupport` at once."""
    import tensorflow as tf

    errors = []
    for address in addresses:
        try:
            return _tpu_strategy(address), []
        except MissingTPUSupport:
            raise
        except (ValueError, RuntimeError, tf.errors.OpError) as error:
            errors.append((address, " ".join(str(error).split())[:120]))
    return None, errors


class KerasDistribution:
    """``keras.distribution.DataParallel`` over ``devices`` (JAX) behind the
    part of the ``tf.distribute.Strategy`` interface the trainer uses.

    ``devices`` may span several processes (``jax.distributed``): every
    process then feeds its own contiguous slice of each global batch
    (``auto_shard_dataset=False``; see :mod:`keras_identity.data.arrays`)
    and Keras assembles the global batch from the processes' slices.  One
    device means no distribution.  ``platform`` is the devices' kind
    (``"cpu"``, ``"gpu"``, ``"tpu"``).
    """

    def __init__(self, devices):
        import jax

        self.devices = list(devices)
        self.platform = self.devices[0].platform if self.devices else "cpu"
        self.process_count = jax.process_count()
        self.process_index = jax.process_index()
        self.distribution = keras.distribution.DataParallel(
            devices=self.devices, auto_shard_dataset=False) if len(self.devices) > 1 else None

    @property
    def num_replicas_in_sync(self):
        return max(1, len(self.devices))

    def scope(self):
        """Variables created and ``fit`` run in it are laid out by the distribution."""
        return self.distribution.scope() if self.distribution else contextlib.nullcontext()


def _jax_distribution(name, tpu_address):
    import jax

    if tpu_address:
        raise ValueError(f"tpu={tpu_address!r} does not apply on the JAX backend (JAX finds "
                         f"the local TPU chips itself); remove it.")
    if name == "multi_worker":
        raise ValueError("strategy='multi_worker' is TensorFlow's (MultiWorkerMirroredStrategy); "
                         "on JAX one run spans processes with --coordinator_address, "
                         "--num_processes and --process_id (or a Cloud TPU slice's or "
                         "SLURM's own detection) and --strategy=auto.")
    processes = jax.process_count()
    devices = jax.devices() if processes > 1 else jax.local_devices()
    accelerators = [d for d in devices if d.platform in ("tpu", "gpu")]
    if not accelerators and _tpu_present() and name != "default":
        raise ValueError(f"this machine has TPU chips but JAX {jax.__version__} sees "
                         f"{describe_devices(devices)}: install jax[tpu] of the same version "
                         f"(pip install -U 'jax[tpu]=={jax.__version__}'; docs/tpu.md), or "
                         f"pass --strategy=default to train on the CPU.")
    if processes > 1 and name in ("default", "one_device"):
        raise ValueError(f"strategy={name!r} trains on one device, but this JAX program runs "
                         f"in {processes} processes; use --strategy=auto (every process's "
                         f"devices) or start one process.")
    if name == "tpu":
        tpus = [d for d in devices if d.platform == "tpu"]
        if not tpus:
            raise ValueError(f"strategy='tpu' found no TPU: JAX sees "
                             f"{describe_devices(devices)}; install jax[tpu] on a TPU "
                             f"runtime, or use --strategy=auto.")
        return KerasDistribution(tpus)
    if name in ("default", "one_device"):
        return KerasDistribution((accelerators or devices)[:1])
    # auto and mirrored: every accelerator of every process, else every CPU
    # device (several with XLA_FLAGS=--xla_force_host_platform_device_count=N).
    return KerasDistribution(accelerators or devices)


def describe_devices(devices):
    kinds = {}
    for device in devices:
        kinds[device.platform] = kinds.get(device.platform, 0) + 1
    return ", ".join(f"{count} {kind.upper()}" for kind, count in kinds.items()) or "no device"


def get_strategy(name="auto", tpu_address=""):
    """Returns the distribution for the backend: a ``tf.distribute.Strategy`` on TensorFlow,
    a :class:`KerasDistribution` on JAX.

    TensorFlow:

    * ``auto``: a TPU if ``TPUClusterResolver`` finds one (``tpu="local"`` first on a TPU
      VM, then the named TPU), else ``MirroredStrategy`` over the visible GPUs, else the
      default strategy.  A TPU this TensorFlow has no kernels for raises
      :class:`MissingTPUSupport` naming the install;
    * ``default``: no distribution; ``one_device``: the first GPU (or CPU);
    * ``mirrored``: all local GPUs (the CPU if there are none);
    * ``multi_worker``: ``MultiWorkerMirroredStrategy`` from ``TF_CONFIG``;
    * ``tpu``: ``TPUStrategy`` (``tpu_address`` or the Colab runtime's TPU).

    JAX (``keras.distribution.DataParallel`` over ``jax.devices()``: the local ones, or
    every process's after ``jax.distributed.initialize``):

    * ``auto``/``mirrored``: every TPU core or GPU, else every CPU device;
      ``default``/``one_device``: the first of them (one process only);
    * ``tpu``: the TPU cores, or an error naming what JAX sees;
    * ``multi_worker``: refused (it is TensorFlow's).
    """
    if name not in STRATEGIES:
        raise ValueError(f"strategy={name!r} is not valid; expected one of: "
                         f"{', '.join(repr(s) for s in STRATEGIES)}.")
    backend = keras.backend.backend()
    if backend == "jax":
        return _jax_distribution(name, tpu_address)
    if tpu_address and name not in ("auto", "tpu"):
        raise ValueError(f"tpu={tpu_address!r} applies only with strategy='tpu' or 'auto'.")
    if backend != "tensorflow":
        raise ValueError(f"training runs on the TensorFlow and JAX backends; the Keras "
                         f"backend is {backend!r} (set KERAS_BACKEND=tensorflow or jax).")
    import tensorflow as tf

    if name == "auto":
        # A TPU VM's local chips first, then the named TPU (Colab, TPU_NAME);
        # a TPU this TensorFlow cannot drive is an error, not a CPU run.
        strategy, errors = _first_tpu(_tpu_candidates(tpu_address))
        if strategy is not None:
            return strategy
        if errors and (tpu_address or _tpu_present()):
            # A TPU this machine has (or the one named) that cannot be used is
            # an error, not a run on the CPU.
            raise ValueError(f"strategy='auto' found a TPU but could not use it "
                             f"({'; '.join(f'tpu={a!r}: {e}' for a, e in errors)}); see "
                             f"docs/tpu.md, or pass "
                             f"--strategy=default to train on the CPU.")
        gpus = tf.config.list_logical_devices("GPU")
        if len(gpus) > 1:
            return tf.distribute.MirroredStrategy()
        if len(gpus) == 1:
            return tf.distribute.OneDeviceStrategy("/gpu:0")
        return tf.distribute.get_strategy()
    if name == "default":
        return tf.distribute.get_strategy()
    if name == "one_device":
        gpus = tf.config.list_logical_devices("GPU")
        return tf.distribute.OneDeviceStrategy("/gpu:0" if gpus else "/cpu:0")
    if name == "mirrored":
        return tf.distribute.MirroredStrategy()
    if name == "multi_worker":
        if "TF_CONFIG" not in os.environ:
            raise ValueError("strategy='multi_worker' needs the TF_CONFIG environment "
                             "variable (cluster and task of this worker).")
        return tf.distribute.MultiWorkerMirroredStrategy()
    strategy, errors = _first_tpu(_tpu_candidates(tpu_address) or [""])
    if strategy is not None:
        return strategy
    raise ValueError(f"strategy='tpu' found no TPU ({'; '.join(e for _, e in errors)}); use "
                     f"--strategy=auto or pass --tpu=<address>.")


def is_chief(strategy):
    """True on the worker that writes logs, plots and the final model."""
    if isinstance(strategy, KerasDistribution):
        return strategy.process_index == 0
    import tensorflow as tf

    resolver = getattr(strategy, "cluster_resolver", None)
    if resolver is None or not isinstance(strategy, tf.distribute.MultiWorkerMirroredStrategy):
        return True
    task_type, task_id = resolver.task_type, resolver.task_id
    if task_type in (None, "chief"):
        return True
    config = json.loads(os.environ.get("TF_CONFIG", "{}"))
    has_chief = "chief" in config.get("cluster", {})
    return task_type == "worker" and task_id == 0 and not has_chief


def is_tpu(strategy):
    if isinstance(strategy, KerasDistribution):
        return strategy.platform == "tpu"
    import tensorflow as tf

    return isinstance(strategy, tf.distribute.TPUStrategy)


def fit_scope(strategy):
    """The context ``fit``/``evaluate`` run in: a Keras distribution is read
    when the step is compiled; a tf.distribute model keeps its strategy."""
    if isinstance(strategy, KerasDistribution):
        return strategy.scope()
    return contextlib.nullcontext()


def trains_on_cpu(strategy):
    """Whether ``strategy``'s replicas are CPU devices (no GPU or TPU takes the steps)."""
    if isinstance(strategy, KerasDistribution):
        return all(device.platform == "cpu" for device in strategy.devices)
    try:
        devices = strategy.extended.worker_devices
    except RuntimeError:  # TensorFlow's default strategy: the first GPU, if there is one
        import tensorflow as tf

        return not tf.config.list_logical_devices("GPU")
    return all("CPU" in device.upper().rsplit("/", 1)[-1] for device in devices)


def describe(strategy):
    if isinstance(strategy, KerasDistribution):
        kind = "DataParallel" if strategy.distribution else "one device"
        processes = (f"{strategy.process_count} processes, "
                     if strategy.process_count > 1 else "")
        return f"JAX {kind} ({processes}{describe_devices(strategy.devices)})"
    replicas = strategy.num_replicas_in_sync
    return f"{type(strategy).__name__} ({replicas} replica{'s' if replicas != 1 else ''})"


def input_placement(strategy):
    """Where a run's input streams go on ``strategy``: the placement
    arguments of :func:`keras_identity.data.streams.input_streams`.  A
    ``tf.distribute`` strategy distributes tf.data pipelines
    (``tf_strategy``); on JAX each process reads its rows of every global
    batch (``process_index`` of ``process_count``).  The evaluation batches
    are padded to whole batches (``pad_to_batch``) on a TPU and on several
    replicas."""
    placement = dict(pad_to_batch=is_tpu(strategy) or strategy.num_replicas_in_sync > 1)
    if isinstance(strategy, KerasDistribution):
        placement.update(process_index=strategy.process_index,
                         process_count=strategy.process_count)
    else:
        placement.update(tf_strategy=strategy)
    return placement


def check_same_in_processes(strategy, value, what):
    """Raises ``ValueError`` (one line naming ``what``) unless every process of
    a multi-process JAX run holds the same integer ``value`` (e.g. the step
    of the checkpoint each one would restore)."""
    if not _several_jax_processes(strategy):
        return
    import numpy as np
    from jax.experimental import multihost_utils

    values = np.asarray(multihost_utils.process_allgather(np.int64(value))).reshape(-1)
    if len(set(values.tolist())) > 1:
        raise ValueError(f"the processes disagree on {what}: {values.tolist()} (process 0 "
                         f"first); every process must see the same files (one shared "
                         f"--model_dir, the same --data_dir).")


def barrier(strategy, name):
    """Waits until every process of a multi-process JAX run reaches ``name``."""
    if _several_jax_processes(strategy):
        from jax.experimental import multihost_utils

        multihost_utils.sync_global_devices(name)


def several_processes(strategy):
    """Whether the run spans several processes that must take decisions
    together: a multi-process JAX run, or TensorFlow's several workers."""
    if isinstance(strategy, KerasDistribution):
        return strategy.process_count > 1
    import tensorflow as tf

    if not isinstance(strategy, tf.distribute.MultiWorkerMirroredStrategy):
        return False
    spec = strategy.cluster_resolver.cluster_spec().as_dict()
    return sum(len(spec.get(job, [])) for job in ("chief", "worker")) > 1


def any_over_processes(strategy, flags):
    """``[bool, ...]``: for each of ``flags`` (this process's booleans),
    whether any process of the run has it set (the run's own collective:
    an all-gather on JAX, an all-reduce of the replicas on TensorFlow)."""
    import numpy as np

    local = np.asarray([int(bool(flag)) for flag in flags], np.int32)
    if not several_processes(strategy):
        return [bool(v) for v in local]
    if isinstance(strategy, KerasDistribution):
        from jax.experimental import multihost_utils

        gathered = np.asarray(multihost_utils.process_allgather(local)).reshape(-1, len(local))
        return [bool(v) for v in gathered.any(axis=0)]
    import tensorflow as tf

    total = strategy.reduce(tf.distribute.ReduceOp.SUM,
                            strategy.run(lambda: tf.constant(local)), axis=None)
    return [bool(v) for v in np.asarray(total) > 0]


def _several_jax_processes(strategy):
    return isinstance(strategy, KerasDistribution) and strategy.process_count > 1

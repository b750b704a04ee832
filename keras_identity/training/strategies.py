"""Choosing the ``tf.distribute`` strategy."""

import glob
import json
import os

import tensorflow as tf

STRATEGIES = ("auto", "default", "one_device", "mirrored", "multi_worker", "tpu")


def _tpu_strategy(address):
    resolver = tf.distribute.cluster_resolver.TPUClusterResolver(tpu=address)
    tf.config.experimental_connect_to_cluster(resolver)
    tf.tpu.experimental.initialize_tpu_system(resolver)
    return tf.distribute.TPUStrategy(resolver)


def _tpu_candidates(tpu_address):
    """TPU addresses worth trying: the given one, a TPU VM's local chips
    (``/dev/accel*``, ``/dev/vfio``), or the TPU named by the environment
    (older Colab TPU runtimes set ``COLAB_TPU_ADDR``)."""
    if tpu_address:
        return [tpu_address]
    candidates = []
    if glob.glob("/dev/accel*") or glob.glob("/dev/vfio/[0-9]*"):
        candidates.append("local")
    if os.environ.get("COLAB_TPU_ADDR") or os.environ.get("TPU_NAME"):
        candidates.append("")
    return candidates


def get_strategy(name="auto", tpu_address=""):
    """Returns a ``tf.distribute.Strategy``.

    * ``auto``: a TPU if ``TPUClusterResolver`` finds one (Colab), else
      ``MirroredStrategy`` over the visible GPUs, else the default strategy;
    * ``default``: no distribution; ``one_device``: the first GPU (or CPU);
    * ``mirrored``: all local GPUs (the CPU if there are none);
    * ``multi_worker``: ``MultiWorkerMirroredStrategy`` from ``TF_CONFIG``;
    * ``tpu``: ``TPUStrategy`` (``tpu_address`` or the Colab runtime's TPU).
    """
    if name not in STRATEGIES:
        raise ValueError(f"strategy={name!r} is not valid; expected one of: "
                         f"{', '.join(repr(s) for s in STRATEGIES)}.")
    if name == "auto":
        for address in _tpu_candidates(tpu_address):
            try:
                return _tpu_strategy(address)
            except (ValueError, RuntimeError, tf.errors.OpError):
                continue
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
    errors = []
    for address in _tpu_candidates(tpu_address) or [""]:
        try:
            return _tpu_strategy(address)
        except (ValueError, RuntimeError, tf.errors.OpError) as error:
            errors.append(" ".join(str(error).split())[:120])
    raise ValueError(f"strategy='tpu' found no TPU ({'; '.join(errors)}); use "
                     f"--strategy=auto or pass --tpu=<address>.")


def is_chief(strategy):
    """True on the worker that writes logs, plots and the final model."""
    resolver = getattr(strategy, "cluster_resolver", None)
    if resolver is None or not isinstance(strategy, tf.distribute.MultiWorkerMirroredStrategy):
        return True
    task_type, task_id = resolver.task_type, resolver.task_id
    if task_type in (None, "chief"):
        return True
    config = json.loads(os.environ.get("TF_CONFIG", "{}"))
    has_chief = "chief" in config.get("cluster", {})
    return task_type == "worker" and task_id == 0 and not has_chief


def describe(strategy):
    replicas = strategy.num_replicas_in_sync
    return f"{type(strategy).__name__} ({replicas} replica{'s' if replicas != 1 else ''})"

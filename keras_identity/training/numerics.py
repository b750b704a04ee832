"""The numerics a run sets for the whole process: the Keras dtype policy
(``--precision``), the random seeds (``--seed``) and TensorFlow's op
determinism (``--deterministic``)."""

import keras


def setup_precision_and_seed(precision, seed, deterministic):
    """The run's Keras dtype policy (``precision``), the seeds of every
    backend and of Python and NumPy (``seed``), and op determinism on
    TensorFlow (``deterministic``)."""
    keras.config.set_dtype_policy(precision)
    keras.utils.set_random_seed(seed)
    set_op_determinism(deterministic)


def set_op_determinism(enabled):
    """Turns TensorFlow op determinism on or off (it is process-wide, and the
    public API can only turn it on).  The JAX route uses no TensorFlow op
    (XLA's CPU and TPU programs are deterministic; on GPUs see
    ``XLA_FLAGS=--xla_gpu_deterministic_ops=true``)."""
    if keras.backend.backend() != "tensorflow":
        return
    import tensorflow as tf

    if enabled:
        tf.config.experimental.enable_op_determinism()
        return
    from tensorflow.python.framework import config as tf_config

    if tf_config.is_op_determinism_enabled():
        tf_config.disable_op_determinism()

"""Uniform random numbers from an explicit seed state, on the Keras backend.

``keras.random`` takes an integer or a ``SeedGenerator``; the residual units
need a seed *tensor* so that a looped stage can give unit j of the loop the
seed its unrolled layer would draw (see ``shortcuts.seeded_uniform``).
"""

import keras


def uniform(shape, seed, dtype):
    """Uniform numbers in [0, 1) of ``shape``, a pure function of ``seed``."""
    backend = keras.backend.backend()
    if backend == "tensorflow":
        import tensorflow as tf

        # As keras.random does on TensorFlow: int32 seeds (XLA needs them).
        seed = tf.cast(tf.math.floormod(tf.cast(seed, "int64"), tf.int32.max - 1), "int32")
        return tf.random.stateless_uniform(shape, seed=seed, dtype=dtype)
    if backend == "jax":
        import jax

        # A uint32 pair is a (legacy) JAX key, as keras.random uses on JAX.
        key = jax.numpy.asarray(seed).astype("uint32")
        return jax.random.uniform(key, shape, dtype=dtype)
    raise NotImplementedError(f"keras_identity's random masks (dropout shortcut, stochastic "
                              f"depth) support the TensorFlow and JAX backends; the backend is "
                              f"{backend!r}.")

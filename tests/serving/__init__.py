"""Tests of keras_identity.serving."""

import keras


def emulator_for_backend(version_dir):
    """``ServingEmulator(version_dir)`` as TF Serving would be started for an
    export of this Keras backend: ``--xla_cpu_compilation_enabled=true`` for
    JAX's (its model is an ``XlaCallModule``), TF Serving's default (off) for
    TensorFlow's, whose graph must then need no XLA."""
    from keras_identity.serving.emulator import ServingEmulator

    return ServingEmulator(version_dir,
                           xla_cpu_compilation_enabled=keras.backend.backend() == "jax")

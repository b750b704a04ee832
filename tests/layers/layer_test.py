"""One test of what every public layer owes Keras (as Keras's own
``run_layer_test`` and keras-hub's backbone tests): :func:`run_layer_test`."""

import os
import tempfile

import keras
import numpy as np


def _numpy(x):
    return keras.ops.convert_to_numpy(x)


def run_layer_test(layer_cls, init_kwargs, input_shape, *, expected_output_shape,
                   expected_num_trainable_weights, expected_num_non_trainable_weights=0,
                   input_range=(-1.0, 1.0), mixed_precision_dtype="bfloat16", seed=0):
    """Checks one layer configuration:

    1. its config round trips (``from_config(get_config())`` has the same
       config);
    2. the symbolic output shape (a ``keras.Input``), the eager one and
       ``compute_output_shape`` equal ``expected_output_shape``;
    3. it has the expected numbers of trainable and non-trainable weights;
    4. one SGD step of a model made of it changes every trainable weight
       (the gradient reaches each) and keeps the loss finite;
    5. under the ``mixed_bfloat16`` policy its output has
       ``mixed_precision_dtype`` and is finite;
    6. a model of it saved as ``.keras`` and loaded gives the same outputs.
    """
    rng = np.random.default_rng(seed)
    x = rng.uniform(*input_range, size=input_shape).astype("float32")

    layer = layer_cls(**init_kwargs)
    config = layer.get_config()
    assert layer_cls.from_config(config).get_config() == config

    inputs = keras.Input(shape=input_shape[1:], batch_size=input_shape[0])
    symbolic = layer(inputs)
    eager = layer(x)
    assert tuple(symbolic.shape) == tuple(expected_output_shape)
    assert tuple(eager.shape) == tuple(expected_output_shape)
    assert tuple(layer.compute_output_shape(input_shape)) == tuple(expected_output_shape)
    assert len(layer.trainable_weights) == expected_num_trainable_weights
    assert len(layer.non_trainable_weights) == expected_num_non_trainable_weights

    model = keras.Model(inputs, symbolic)
    if expected_num_trainable_weights:
        model.compile(keras.optimizers.SGD(0.1), loss="mse")
        target = rng.normal(size=expected_output_shape).astype("float32")
        before = [_numpy(w).copy() for w in layer.trainable_weights]
        history = model.fit(x, target, batch_size=input_shape[0], epochs=1, verbose=0)
        assert np.isfinite(history.history["loss"][0])
        for w, old in zip(layer.trainable_weights, before):
            assert not np.array_equal(_numpy(w), old), f"{w.path} did not change"

    outputs = _numpy(model(x, training=False))
    with tempfile.TemporaryDirectory() as directory:
        path = os.path.join(directory, "layer.keras")
        model.save(path)
        loaded = keras.saving.load_model(path)
    np.testing.assert_allclose(_numpy(loaded(x, training=False)), outputs, rtol=1e-6,
                               atol=1e-6)

    policy = keras.config.dtype_policy()
    keras.config.set_dtype_policy("mixed_bfloat16")
    try:
        mixed = layer_cls(**init_kwargs)(x)
    finally:
        keras.config.set_dtype_policy(policy)
    assert keras.backend.standardize_dtype(mixed.dtype) == mixed_precision_dtype
    assert np.all(np.isfinite(_numpy(keras.ops.cast(mixed, "float32"))))

"""Gradients for the analysis tools on the TensorFlow and JAX backends.

TensorFlow differentiates with respect to any tensor a tape saw;
JAX only with respect to a function's arguments.  The gradient of the loss
at a layer's input equals its gradient with respect to a zero added there,
so on JAX the model is re-run (sharing its layers) with a zero-valued
variable added at each probed point and differentiated with respect to
those variables.  State updates (BN moving statistics) of the
differentiated calls are discarded.
"""

import keras
import numpy as np
from keras import ops


def _check_backend():
    if keras.backend.backend() not in ("tensorflow", "jax"):
        raise ValueError(f"the analysis tools run on the TensorFlow and JAX backends; the "
                         f"Keras backend is {keras.backend.backend()!r}.")


def input_gradient(fn, x):
    """``d sum(fn(x)) / dx`` as a NumPy array."""
    _check_backend()
    if keras.backend.backend() == "tensorflow":
        import tensorflow as tf

        x = tf.convert_to_tensor(x)
        with tf.GradientTape() as tape:
            tape.watch(x)
            y = tf.reduce_sum(fn(x))
        return tape.gradient(y, x).numpy()
    import jax

    def total(x):
        with keras.StatelessScope():
            return ops.sum(fn(x))
    return np.asarray(jax.grad(total)(ops.convert_to_tensor(x)))


class _Zero(keras.layers.Layer):
    """Adds a zero-valued variable (the point the loss is differentiated at)."""

    def __init__(self, shape, **kwargs):
        super().__init__(**kwargs)
        self.zero = self.add_weight(shape=shape, initializer="zeros", name="zero",
                                    autocast=False)

    def call(self, x):
        return x + ops.cast(self.zero, x.dtype)

    def compute_output_shape(self, input_shape):
        return input_shape


def activation_gradients(model, layers, inputs, error_fn, training):
    """``[dE/d(input of l) for l in layers] + [dE/d(output of layers[-1])]``,
    with ``E = error_fn(model(inputs))``, as NumPy arrays."""
    _check_backend()
    if keras.backend.backend() == "tensorflow":
        import tensorflow as tf

        probe = keras.Model(model.input, [l.input for l in layers] + [layers[-1].output,
                                                                      model.output])
        with tf.GradientTape() as tape:
            outputs = probe(inputs, training=training)
            error = error_fn(outputs[-1])
        return [g.numpy() for g in tape.gradient(error, outputs[:-1])]
    import jax

    if isinstance(model, keras.Sequential):
        raise ValueError(f"on JAX, activation gradients need a functional model; "
                         f"{model.name!r} is a {type(model).__name__}.")
    batch = int(inputs.shape[0])
    # One zero at each probed input, keyed by the layer's position in
    # ``layers``, and one at the last layer's output (position len(layers)).
    zeros, position = {}, {id(l): i for i, l in enumerate(layers)}

    def call(layer, *args, **kwargs):
        if id(layer) in position:
            x = args[0]
            zero = zeros[position[id(layer)]] = _Zero((batch,) + tuple(x.shape[1:]))
            args = (zero(x),) + args[1:]
        y = layer(*args, **kwargs)
        if layer is layers[-1]:
            zero = zeros[len(layers)] = _Zero((batch,) + tuple(y.shape[1:]))
            y = zero(y)
        return y

    rerun = keras.models.clone_model(model, clone_function=lambda layer: layer,
                                     call_function=call)
    if len(zeros) != len(layers) + 1:
        raise ValueError("on JAX, activation gradients need the probed layers to be layers of "
                         "the model itself (not inside nested models).")
    variables = [zeros[i].zero for i in range(len(layers) + 1)]

    def error(values):
        with keras.StatelessScope(state_mapping=list(zip(variables, values))):
            return error_fn(rerun(inputs, training=training))

    gradients = jax.grad(error)([v.value for v in variables])
    return [np.asarray(g) for g in gradients]

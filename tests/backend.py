"""Backend-neutral helpers for the tests (TensorFlow and JAX legs of CI)."""

import keras
import pytest
from keras import ops

BACKEND = keras.backend.backend()
tensorflow_only = pytest.mark.skipif(BACKEND != "tensorflow",
                                     reason="TensorFlow graphs or tf.distribute")
jax_only = pytest.mark.skipif(BACKEND != "jax", reason="JAX backend only")
# Tests that run the package's programs end to end in processes of their own
# (the README's commands, the notebook, the installed wheel, the experiment
# drivers' smoke runs, the benchmark, which starts one worker per backend
# itself): their Python is the same on every backend and each backend's
# training step, checkpoints and exports are tested in-process on every leg,
# so they run once, on the TensorFlow leg (the JAX route's programs without
# TensorFlow: tests/test_tensorflow_optional.py, benchmarks' JAX-only run).
default_route = pytest.mark.skipif(
    BACKEND != "tensorflow", reason="runs the package's programs end to end in processes "
                                    "of their own; run once, on the TensorFlow leg")
# Tests whose outcome does not depend on the Keras backend that trained or
# exported the model (the flags' checks of a program that needs TensorFlow, the
# local server's handling of HTTP): they run once, on the TensorFlow leg, not
# again in the JAX leg that has TensorFlow beside it.
backend_neutral = pytest.mark.skipif(
    BACKEND != "tensorflow", reason="does not depend on the Keras backend; run once, on "
                                    "the TensorFlow leg")

# Tests of the JAX route's input in Grain's worker processes: each worker
# imports Keras and its backend (TensorFlow on the TensorFlow leg: seconds a
# worker), and the workers' streams do not depend on the backend; the
# TensorFlow route reads through tf.data.  They run on the JAX leg, without
# TensorFlow, as the JAX route runs.
jax_route = pytest.mark.skipif(
    BACKEND != "jax", reason="the JAX route's Grain worker processes; run on the JAX leg")


def value_and_grad(model, loss_fn, inputs, training=True, sources=None):
    """``(loss, gradients of model.trainable_variables, outputs)`` of
    ``loss_fn(model(inputs))``, updating the non-trainable variables (BN
    moving statistics, seed states) as an eager call does.

    ``sources="inputs"`` returns the gradient with respect to ``inputs`` instead.
    """
    if BACKEND == "tensorflow":
        import tensorflow as tf

        inputs = tf.convert_to_tensor(inputs)
        with tf.GradientTape() as tape:
            tape.watch(inputs)
            outputs = model(inputs, training=training)
            loss = loss_fn(outputs)
        wrt = inputs if sources == "inputs" else model.trainable_variables
        return loss, tape.gradient(loss, wrt), outputs
    import jax

    trainable = [v.value for v in model.trainable_variables]
    non_trainable = [v.value for v in model.non_trainable_variables]

    def compute(trainable, inputs):
        outputs, updated = model.stateless_call(trainable, non_trainable, inputs,
                                                training=training)
        return loss_fn(outputs), (outputs, updated)

    argnums = 1 if sources == "inputs" else 0
    (loss, (outputs, updated)), grads = jax.value_and_grad(
        compute, argnums=argnums, has_aux=True)(trainable, ops.convert_to_tensor(inputs))
    for variable, value in zip(model.non_trainable_variables, updated):
        variable.assign(value)
    return loss, grads, outputs


def mse(target):
    return lambda outputs: ops.mean(ops.square(ops.cast(outputs, "float32") - target))


def vjp(fn, x, upstream, variables=()):
    """``(dx, [dvariable, ...])``: the gradients of ``sum(fn(x) * upstream)``
    with respect to ``x`` and to ``variables`` (Keras variables ``fn`` reads).

    ``upstream`` may be a callable of ``(x, y)`` computed without gradient
    (e.g. a tensor built from other outputs of the same layer).
    """
    if BACKEND == "tensorflow":
        import tensorflow as tf

        x = tf.convert_to_tensor(x)
        with tf.GradientTape() as tape:
            tape.watch(x)
            y = fn(x)
        grads = tape.gradient(y, [x] + list(variables), output_gradients=upstream)
        return grads[0], grads[1:]
    import jax

    variables = list(variables)

    def f(x, values):
        with keras.StatelessScope(state_mapping=list(zip(variables, values))):
            return fn(x)

    _, pullback = jax.vjp(f, ops.convert_to_tensor(x), [v.value for v in variables])
    dx, dvalues = pullback(ops.convert_to_tensor(upstream))
    return dx, list(dvalues)

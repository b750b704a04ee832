"""The forward pass of a JAX-backend model as a TensorFlow function (jax2tf).

TF Serving runs TensorFlow graphs.  On the JAX backend the model's inference
call is converted with ``jax.experimental.jax2tf`` (StableHLO in an
``XlaCallModule`` op, lowered for CPU, GPU and TPU so that the export serves
on any of them), its weights become ``tf.Variable`` s of the SavedModel, and
the serving signatures (decoding, normalisation, top-k: TensorFlow code)
call it.  Private to :mod:`keras_identity.serving.export`.
"""

import numpy as np
import tensorflow as tf

# Lowered for every platform TF Serving may run the export on.
PLATFORMS = ("cpu", "cuda", "tpu")


def _polymorphic_shape(shape):
    dims = ["b"] + [f"d{i}" if d is None else str(int(d)) for i, d in enumerate(shape[1:], 1)]
    return f"({', '.join(dims)})"


def model_forward(model, archive):
    """Returns ``forward(images) -> outputs`` (TensorFlow) computing
    ``model(images, training=False)``; the weights are added to ``archive``
    (a ``keras.export.ExportArchive``) as TensorFlow variables it tracks."""
    from jax.experimental import jax2tf

    trainable, non_trainable = model.trainable_variables, model.non_trainable_variables
    tf_variables = [tf.Variable(np.asarray(v.value), trainable=False,
                                name=v.path.replace("/", "_"))
                    for v in trainable + non_trainable]
    weights = tf.Module(name="jax_model_weights")
    weights.tracked = tf_variables
    archive.track(weights)
    count = len(trainable)

    def stateless(values, images):
        outputs, _ = model.stateless_call(values[:count], values[count:], images,
                                          training=False)
        return outputs

    converted = jax2tf.convert(
        stateless, native_serialization_platforms=PLATFORMS, with_gradient=False,
        polymorphic_shapes=[None, _polymorphic_shape(model.input_shape)])
    known = [None] + list(model.input_shape[1:])

    def forward(images):
        return converted(tf_variables, tf.ensure_shape(images, known))

    return forward

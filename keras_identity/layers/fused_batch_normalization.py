"""Batch normalisation on TensorFlow's fused kernel.

``keras.layers.BatchNormalization`` builds the moments, the normalisation and
their gradients from about ten small ops per layer; on the TensorFlow backend
``FusedBatchNormV3`` does the same in one op forward and one backward.  With
a few hundred BN layers (ResNet-164 has 164) that is both faster to run and
faster to trace.  On other backends (JAX) the same functions compute BN with
``keras.ops``, which XLA fuses itself.
"""

import keras
from keras import ops


def fused_batch_norm(x, gamma, beta, mean, variance, epsilon, training):
    """Batch normalisation of a channels-last 4-D ``x`` (Ioffe & Szegedy
    2015, Alg. 1), by the fused TF op on TensorFlow and by ``keras.ops``
    elsewhere.

    Returns the output in ``x``'s dtype and, in training, the batch mean and
    the biased batch variance (float32) for the moving statistics (the fused
    op itself returns the unbiased variance); at inference ``mean`` and
    ``variance`` normalise and the moments are ``None``.
    """
    if keras.backend.backend() != "tensorflow":
        return _ops_batch_norm(x, gamma, beta, mean, variance, epsilon, training)
    import tensorflow as tf

    if not training:
        y, _, _ = tf.compat.v1.nn.fused_batch_norm(
            x, gamma, beta, mean=mean, variance=variance, epsilon=epsilon, is_training=False)
        return ops.cast(y, x.dtype), None
    y, batch_mean, batch_variance = tf.compat.v1.nn.fused_batch_norm(
        x, gamma, beta, epsilon=epsilon, is_training=True)
    return ops.cast(y, x.dtype), (batch_mean, biased_variance(x, batch_variance))


def _ops_batch_norm(x, gamma, beta, mean, variance, epsilon, training):
    """:func:`fused_batch_norm` with ``keras.ops`` (moments in float32, as
    ``keras.layers.BatchNormalization`` computes them)."""
    x32 = ops.cast(x, "float32")
    moments = None
    if training:
        mean, variance = ops.moments(x32, axes=[0, 1, 2])
        moments = (ops.stop_gradient(mean), ops.stop_gradient(variance))
    y = ops.batch_normalization(x32, mean, variance, axis=-1, offset=beta, scale=gamma,
                                epsilon=epsilon)
    return ops.cast(y, x.dtype), moments


def biased_variance(x, variance):
    """The biased batch variance of ``x`` from the unbiased one the fused op
    returns (Keras's moving statistics use the biased variance)."""
    count = ops.cast(ops.prod(ops.shape(x)[:-1]), "float32")
    return variance * (count - 1.0) / ops.maximum(count, 1.0)


def update_moving_statistics(moving_mean, moving_variance, moments, momentum):
    """Keras's BatchNormalization rule for the moving statistics:
    ``moving = moving * momentum + batch * (1 - momentum)``, where ``moments``
    is the ``(mean, variance)`` pair returned by :func:`fused_batch_norm`."""
    for moving, batch in zip((moving_mean, moving_variance), moments):
        moving.assign(moving * momentum + batch * (1.0 - momentum))


@keras.saving.register_keras_serializable(package="keras_identity")
class FusedBatchNormalization(keras.layers.BatchNormalization):
    """``keras.layers.BatchNormalization`` computed by one fused TF op.

    Same arguments, variables and results as the Keras layer (Ioffe &
    Szegedy 2015, Alg. 1; moving statistics updated as
    ``moving = moving * momentum + batch * (1 - momentum)`` with the biased
    batch variance, as Keras does).  4-D channels-last inputs without mask,
    renorm or synchronisation take the fused path; anything else falls back to
    the Keras implementation.
    """

    def _fusable(self, inputs, mask):
        axis = self.axis if isinstance(self.axis, int) else (
            self.axis[0] if len(self.axis) == 1 else None)
        rank = len(inputs.shape)
        return (keras.backend.backend() == "tensorflow" and mask is None and rank == 4
                and axis in (3, -1) and self.center and self.scale
                and not getattr(self, "renorm", False)
                and not getattr(self, "synchronized", False))

    def call(self, inputs, training=None, mask=None):
        if not self._fusable(inputs, mask):
            return super().call(inputs, training=training, mask=mask)
        gamma = ops.convert_to_tensor(self.gamma, "float32")
        beta = ops.convert_to_tensor(self.beta, "float32")
        training = bool(training) and self.trainable
        outputs, moments = fused_batch_norm(
            inputs, gamma, beta, ops.convert_to_tensor(self.moving_mean, "float32"),
            ops.convert_to_tensor(self.moving_variance, "float32"), self.epsilon, training)
        if training:
            update_moving_statistics(self.moving_mean, self.moving_variance, moments,
                                     self.momentum)
        return ops.cast(outputs, self.compute_dtype)

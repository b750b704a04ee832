"""CReLU, the concatenated rectifier of Balduzzi et al. (2017), *The
Shattered Gradients Problem* (the lecture notes, "looks linear" slides).

With :class:`keras_identity.initializers.LooksLinear` on the next layer's
kernel, a feedforward CReLU net computes a linear function at
initialisation, as a residual net nearly does, without skip connections.
"""

import keras
from keras import ops


@keras.saving.register_keras_serializable(package="keras_identity")
class CReLU(keras.layers.Layer):
    """``Φ(x)_{2q-1} = σ(x_q)``, ``Φ(x)_{2q} = σ(-x_q)`` (the notes' indexing,
    1-based; σ = ReLU): each channel becomes the pair of its positive and
    negative parts, side by side, so the last axis doubles.

    The pairs are neighbours (not two halves) so that a looks-linear kernel,
    whose neighbouring input rows are ``W_q`` and ``-W_q``, gives
    ``W̃ Φ(x) = W x``.
    """

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.supports_masking = True

    def call(self, inputs):
        pairs = ops.stack([ops.relu(inputs), ops.relu(-inputs)], axis=-1)
        shape = ops.shape(inputs)
        return ops.reshape(pairs, (*shape[:-1], 2 * shape[-1]))

    def compute_output_shape(self, input_shape):
        channels = input_shape[-1]
        return (*input_shape[:-1], None if channels is None else 2 * channels)

"""Option A shortcut: parameter-free identity for a change of shape."""

import keras
from keras import ops

from keras_identity import _checks


def _pair(name, value):
    pair = (value, value) if isinstance(value, int) else tuple(value)
    if len(pair) != 2 or not all(isinstance(v, int) and not isinstance(v, bool) and v >= 1
                                 for v in pair):
        raise ValueError(f"{name}={value!r} is not valid; expected a positive integer "
                         f"or a pair of positive integers.")
    return pair


@keras.saving.register_keras_serializable(package="keras_identity")
class ZeroPadShortcut(keras.layers.Layer):
    """Shortcut option A of He et al. (2015), Sec. 3.3 (lecture notes, p. 11).

    When a residual unit halves the feature map and widens it from C to C'
    channels, option A keeps the shortcut an identity: it reads one pixel in
    every ``strides`` (the same grid a strided 1x1 convolution reads: pixels
    0, s, 2s, ...) and appends C' - C channels of zeros.  It has no
    parameters, so a ResNet with option A has exactly the parameters of its
    plain counterpart.

    Args:
        filters: C', the number of output channels; must be >= the input's.
        strides: subsampling step, an int or a pair (rows, columns).
    """

    def __init__(self, filters, strides=1, **kwargs):
        super().__init__(**kwargs)
        self.filters = _checks.check_positive_int("filters", filters)
        self.strides = _pair("strides", strides)

    def build(self, input_shape):
        shape = _checks.check_rank(type(self).__name__, input_shape, (4,),
                                   "(batch, height, width, channels)")
        if shape[-1] > self.filters:
            raise ValueError(
                f"{type(self).__name__} (option A) can only add channels: filters="
                f"{self.filters} is smaller than the input's {shape[-1]} channels; use "
                f"dimension_shortcut='B' (projection) to reduce channels.")

    def call(self, inputs):
        sh, sw = self.strides
        x = inputs
        if sh > 1 or sw > 1:
            x = x[:, ::sh, ::sw, :]
        extra = self.filters - x.shape[-1]
        if extra:
            x = ops.pad(x, [[0, 0], [0, 0], [0, 0], [0, extra]])
        return x

    def compute_output_shape(self, input_shape):
        b, h, w, _ = input_shape
        sh, sw = self.strides
        return (b, None if h is None else -(-h // sh), None if w is None else -(-w // sw),
                self.filters)

    def get_config(self):
        config = super().get_config()
        config.update(filters=self.filters, strides=self.strides)
        return config

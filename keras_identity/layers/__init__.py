"""Layers of the papers: residual units, option-A shortcuts, highway layers."""

from keras_identity.layers.fused_batch_normalization import FusedBatchNormalization
from keras_identity.layers.highway import Highway
from keras_identity.layers.highway import HighwayConv2D
from keras_identity.layers.highway import highway_layers
from keras_identity.layers.highway import transform_gate_activations
from keras_identity.layers.residual_stack import ResidualStack
from keras_identity.layers.residual_unit import BLOCKS
from keras_identity.layers.residual_unit import SHORTCUTS
from keras_identity.layers.residual_unit import UNITS
from keras_identity.layers.residual_unit import ResidualUnit
from keras_identity.layers.zero_pad_shortcut import ZeroPadShortcut

"""Layers of the papers: residual units and stacks (Figs. 2 and 4), option-A
shortcuts, highway layers, CReLU (Balduzzi et al. 2017), and the input normalisation."""

from keras_identity.layers.crelu import CReLU
from keras_identity.layers.fused_batch_normalization import FusedBatchNormalization
from keras_identity.layers.highway import Highway
from keras_identity.layers.highway import HighwayConv2D
from keras_identity.layers.highway import highway_layers
from keras_identity.layers.highway import transform_gate_activations
from keras_identity.layers.preprocessing import ImageNormalization
from keras_identity.layers.preprocessing import find_preprocessing
from keras_identity.layers.preprocessing import model_inputs
from keras_identity.layers.residual import BLOCKS
from keras_identity.layers.residual import GATED_SHORTCUTS
from keras_identity.layers.residual import RECOMPUTE
from keras_identity.layers.residual import SHORTCUTS
from keras_identity.layers.residual import UNITS
from keras_identity.layers.residual import ResidualStack
from keras_identity.layers.residual import ResidualUnit
from keras_identity.layers.residual import ZeroPadShortcut
from keras_identity.layers.residual import shortcuts  # Fig. 2's classes

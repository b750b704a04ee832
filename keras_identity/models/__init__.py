"""Functional Keras models of the papers' networks."""

from keras_identity.models.features import feature_extractor
from keras_identity.models.highway_net import highway_net
from keras_identity.models.highway_net import plain_net
from keras_identity.models.pretrained import presets
from keras_identity.models.pretrained import presets_table
from keras_identity.models.registry import get_model
from keras_identity.models.registry import list_models
from keras_identity.models.resnet import preact_resnet
from keras_identity.models.resnet import resnet
from keras_identity.models.resnet import resolve_depth
from keras_identity.models.saving import load_model
from keras_identity.models.stage import residual_stage
from keras_identity.models.stage import STAGE_MODES
from keras_identity.models.stage import transfer_weights
from keras_identity.models.stage import unroll
from keras_identity.models.weights import load_weights
from keras_identity.models.weights import to_float32

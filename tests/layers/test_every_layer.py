"""Every public layer of keras_identity.layers through the shared layer test."""

import keras
import pytest

from keras_identity import layers
from tests.layers.layer_test import run_layer_test

pytestmark = pytest.mark.quick  # the quick tier (docs/testing.md)

# (layer, arguments, input shape, output shape, trainable, non-trainable weights)
CASES = {
    "crelu": (layers.CReLU, {}, (2, 4, 4, 3), (2, 4, 4, 6), 0, 0),
    "fused_batch_normalization": (layers.FusedBatchNormalization, {}, (2, 4, 4, 3),
                                  (2, 4, 4, 3), 2, 2),
    "highway": (layers.Highway, {"transform_bias_init": -2.0}, (4, 8), (4, 8), 4, 0),
    "highway_conv2d": (layers.HighwayConv2D, {
        "kernel_size": 5, "activation": "tanh", "transform_bias_init": -2.0,
        "carry_gate": "separate"}, (2, 5, 5, 4), (2, 5, 5, 4), 6, 0),
    "image_normalization": (layers.ImageNormalization, {"mode": "scale"}, (2, 4, 4, 3),
                            (2, 4, 4, 3), 0, 0),
    "zero_pad_shortcut": (layers.ZeroPadShortcut, {"filters": 8, "strides": (2, 1)},
                          (2, 6, 6, 4), (2, 3, 6, 8), 0, 0),
    "unit_original_basic": (layers.ResidualUnit, {"filters": 4}, (2, 5, 5, 4),
                            (2, 5, 5, 4), 6, 4),
    "unit_preact_bottleneck_projection": (
        layers.ResidualUnit, {"filters": 16, "block": "bottleneck", "strides": 2,
                              "unit": "full_preactivation"},
        (2, 6, 6, 8), (2, 3, 3, 16), 10, 6),
    "unit_exclusive_gating": (
        layers.ResidualUnit, {"filters": 16, "block": "bottleneck", "strides": 2,
                              "unit": "relu_only_preactivation", "shortcut": "exclusive_gating",
                              "gate_bias_init": -6.0, "preactivation": "shared",
                              "kernel_regularizer": keras.regularizers.L2(1e-4)},
        (2, 6, 6, 8), (2, 3, 3, 16), 12, 6),
    "stack_preact_basic": (layers.ResidualStack, {"filters": 4, "num_units": 3,
                                                  "unit": "full_preactivation"},
                           (2, 5, 5, 4), (2, 5, 5, 4), 6, 4),
    "stack_conv1x1_bn_relu": (layers.ResidualStack, {
        "filters": 4, "num_units": 2, "shortcut": "conv1x1", "recompute": "bn_relu"},
        (2, 5, 5, 4), (2, 5, 5, 4), 7, 4),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_layer(name):
    layer_cls, kwargs, input_shape, output_shape, trainable, non_trainable = CASES[name]
    run_layer_test(layer_cls, kwargs, input_shape, expected_output_shape=output_shape,
                   expected_num_trainable_weights=trainable,
                   expected_num_non_trainable_weights=non_trainable,
                   input_range=(0.0, 255.0) if name == "image_normalization" else (-1.0, 1.0))

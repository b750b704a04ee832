"""Stage outputs of a model, for detection and segmentation heads."""

import re

import keras

_STAGE = re.compile(r"stage(\d+)_")


def feature_extractor(model, name=None):
    """A model that returns the output of every stage of ``model``.

    The outputs are a dict ``{"stage1": ..., "stage2": ...}``, one feature map per stage
    from the highest resolution to the lowest (a ResNet's ``stage{s}`` output is the sum of
    its last unit, before the final BN-ReLU of pre-activation nets; a convolutional highway
    net's is its last highway layer), as keras-hub backbones' ``pyramid_outputs``.  The new
    model shares ``model``'s layers and weights and takes the same inputs (raw pixels if
    ``model`` includes its preprocessing).

    Raises:
        ValueError: ``model`` has no stages (a fully connected highway net, or a model not
            built by keras_identity).
    """
    last = {}
    for layer in model.layers:
        match = _STAGE.match(layer.name)
        if match:
            last[int(match.group(1))] = layer
    if not last:
        raise ValueError(f"model {model.name!r} has no stages (layers named 'stage<s>_...'); "
                         f"feature_extractor() takes the convolutional ResNets and highway "
                         f"nets of keras_identity.models.")
    outputs = {f"stage{s}": last[s].output for s in sorted(last)}
    return keras.Model(model.inputs, outputs, name=name or f"{model.name}_features")

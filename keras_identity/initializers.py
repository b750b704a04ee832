"""Weight initialisations used by the authors' code.

``he_normal_fan_out`` is the He et al. (2015) initialisation the ResNet
reference implementations (resnet-1k-layers, fb.resnet.torch) apply to every
convolution: N(0, 2 / (k * k * output_channels)).  ``torch_linear`` is the
uniform(-1/sqrt(fan_in), 1/sqrt(fan_in)) default that those Torch models keep
for their final fully connected layer (whose bias they set to zero).
"""

import keras


def he_normal_fan_out(seed=None):
    """He initialisation with fan-out, normal distribution (not truncated)."""
    return keras.initializers.VarianceScaling(
        scale=2.0, mode="fan_out", distribution="untruncated_normal", seed=seed)


def torch_linear(seed=None):
    """Torch's default ``nn.Linear`` weight initialisation."""
    return keras.initializers.VarianceScaling(
        scale=1.0 / 3.0, mode="fan_in", distribution="uniform", seed=seed)


def get(identifier, default):
    """Returns a Keras initializer; ``None`` selects ``default()``."""
    if identifier is None:
        return default()
    return keras.initializers.get(identifier)

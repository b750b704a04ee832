"""Weight initialisations used by the authors' code.

``he_normal_fan_out`` is the He et al. (2015) initialisation the ResNet
reference implementations (resnet-1k-layers, fb.resnet.torch) apply to every
convolution: N(0, 2 / (k * k * output_channels)).  ``torch_linear`` is the
uniform(-1/sqrt(fan_in), 1/sqrt(fan_in)) default that those Torch models keep
for their final fully connected layer (whose bias they set to zero).

A Keras random initializer seeded with an integer (or unseeded: it then
picks an integer) returns the same values at every call, so layers of one
shape that share it would all start with identical weights.  Every
initializer made here draws from a ``keras.random.SeedGenerator`` instead:
successive calls differ, and a seeded build is reproducible.
"""

import keras


def he_normal_fan_out(seed=None):
    """He initialisation with fan-out, normal distribution (not truncated)."""
    return keras.initializers.VarianceScaling(
        scale=2.0, mode="fan_out", distribution="untruncated_normal",
        seed=keras.random.SeedGenerator(seed))


def torch_linear(seed=None):
    """Torch's default ``nn.Linear`` weight initialisation."""
    return keras.initializers.VarianceScaling(
        scale=1.0 / 3.0, mode="fan_in", distribution="uniform",
        seed=keras.random.SeedGenerator(seed))


def get(identifier, default=None):
    """Returns a Keras initializer whose successive calls draw new values.

    ``None`` selects ``default()``.  A random initializer with an integer
    seed is replaced by a copy drawing from a ``SeedGenerator`` of that seed.
    """
    if identifier is None:
        return default()
    initializer = keras.initializers.get(identifier)
    seed = getattr(initializer, "seed", None)
    if isinstance(seed, int) and not isinstance(seed, bool):
        config = initializer.get_config()
        config["seed"] = keras.random.SeedGenerator(seed)
        initializer = type(initializer).from_config(config)
    return initializer


def serialize(initializer):
    """``keras.initializers.serialize`` with a ``SeedGenerator`` seed written
    as its integer seed (:func:`get` turns it back into a generator)."""
    config = keras.initializers.serialize(initializer)
    seed = config.get("config", {}).get("seed")
    if isinstance(seed, dict) and seed.get("class_name") == "SeedGenerator":
        config["config"]["seed"] = seed["config"]["seed"]
    return config

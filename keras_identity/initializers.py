"""Weight initialisations used by the authors' code, and Balduzzi et al.'s.

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


def _orthogonal(rows, columns, generator, dtype):
    """A ``rows x columns`` matrix with orthonormal columns (rows >= columns)
    or rows, from the QR decomposition of a Gaussian matrix."""
    from keras import ops

    tall = rows >= columns
    shape = (rows, columns) if tall else (columns, rows)
    q, r = ops.linalg.qr(keras.random.normal(shape, seed=generator, dtype="float32"))
    q = q * ops.sign(ops.diagonal(r))[None, :]  # a uniform (Haar) draw
    return ops.cast(q if tall else ops.transpose(q), dtype)


@keras.saving.register_keras_serializable(package="keras_identity")
class LooksLinear(keras.initializers.Initializer):
    """The looks-linear initialisation of Balduzzi et al. (2017), for a layer
    fed by :class:`keras_identity.layers.CReLU`.

    A kernel W̃ whose neighbouring input rows are a row of an orthogonal W and
    its opposite (``W̃_{2q-1} = -W̃_{2q} = W_q``, the notes' indexing) gives
    ``W̃ᵀ Φ(x) = Wᵀ (σ(x) - σ(-x)) = Wᵀ x``: the layer after a CReLU is linear
    in the CReLU's input.  Dense kernels ``(2D, D')``; convolution kernels
    ``(k, k, 2C, C')`` are zero but for their centre tap, which is such a
    matrix (the paper's Sec. 5: ``K[:, :, 2, 2] := W``).

    Args:
        seed: an int or ``keras.random.SeedGenerator`` (successive calls
            draw new matrices; a seeded build is reproducible).
    """

    def __init__(self, seed=None):
        self.seed = seed
        self._generator = (seed if isinstance(seed, keras.random.SeedGenerator) else
                           keras.random.SeedGenerator(seed))

    def __call__(self, shape, dtype=None):
        from keras import ops

        shape = tuple(int(d) for d in shape)
        if len(shape) not in (2, 4) or (len(shape) == 4 and shape[0] != shape[1]):
            raise ValueError(f"LooksLinear initialises dense kernels (inputs, units) and "
                             f"square convolution kernels (k, k, inputs, filters); got the "
                             f"shape {shape}.")
        inputs, outputs = shape[-2], shape[-1]
        if inputs % 2:
            raise ValueError(f"LooksLinear needs an even number of inputs (a CReLU's "
                             f"output: pairs of channels); the kernel {shape} has {inputs}.")
        w = _orthogonal(inputs // 2, outputs, self._generator, dtype or "float32")
        pairs = ops.reshape(ops.stack([w, -w], axis=1), (inputs, outputs))
        if len(shape) == 2:
            return pairs
        k = shape[0]
        return ops.pad(pairs[None, None], ((k // 2, k - 1 - k // 2), (k // 2, k - 1 - k // 2),
                                           (0, 0), (0, 0)))

    def get_config(self):
        seed = self.seed
        if isinstance(seed, keras.random.SeedGenerator):
            seed = seed.get_config()["seed"]
        return {"seed": seed}


def get(identifier, default=None):
    """Returns a Keras initializer whose successive calls draw new values.

    ``None`` selects ``default()``.  A random initializer with an integer
    seed is replaced by a copy drawing from a ``SeedGenerator`` of that seed.
    """
    if identifier is None:
        return default()
    if identifier == "looks_linear":
        return LooksLinear()
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

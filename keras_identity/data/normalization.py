"""Input normalisation, computed from the training images and saved with a run.

The same :class:`Normalization` is applied by the training pipeline and,
inside the serving graph, by the SavedModel export, so a served model sees
exactly the inputs it was trained on.
"""

import dataclasses

import numpy as np

from keras_identity import storage

MODES = ("per_pixel_mean", "per_channel", "scale")
# ImageNet statistics in [0, 1] units (fb.resnet.torch's dataset means/stds).
IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)


@dataclasses.dataclass
class Normalization:
    """``x / 255`` followed by one of:

    * ``per_pixel_mean``: minus the mean training image (He et al. 2015,
      Sec. 4.2: "the per-pixel mean subtracted");
    * ``per_channel``: minus the channel means, divided by the channel
      standard deviations;
    * ``scale``: nothing more (inputs in [0, 1]).
    """

    mode: str
    mean: np.ndarray = None
    std: np.ndarray = None

    def __post_init__(self):
        if self.mode not in MODES:
            raise ValueError(f"normalization={self.mode!r} is not valid; expected one of: "
                             f"{', '.join(repr(m) for m in MODES)}.")
        if self.mean is not None:
            self.mean = np.asarray(self.mean, np.float32)
        if self.std is not None:
            self.std = np.asarray(self.std, np.float32)

    @classmethod
    def from_images(cls, mode, images, batch_size=1024):
        """The statistics of training ``images``: pixel values in [0, 255]
        (uint8, or float), an array ``(n, height, width, channels)`` or a
        ``tf.data.Dataset`` of image batches or ``(images, labels)`` batches.
        Accumulated in float64, ``batch_size`` images at a time.

        Raises:
            ValueError: images that are not 4-D, or whose values lie outside
                [0, 255] or within [0, 1] (already scaled).
        """
        if mode not in MODES:
            cls(mode)  # raises the one-line message
        if mode == "scale":
            return cls(mode)
        total = count = square = None
        largest = 0.0
        for batch in _image_batches(images, batch_size):
            x = np.asarray(batch, np.float64)
            if x.ndim != 4:
                raise ValueError(f"images of shape {x.shape} are not valid; expected (n, "
                                 f"height, width, channels).")
            if x.size and (x.min() < 0 or x.max() > 255):
                raise ValueError(f"images with values in [{x.min():g}, {x.max():g}] are not "
                                 f"valid; expected pixel values in [0, 255].")
            largest = max(largest, float(x.max()) if x.size else 0.0)
            x = x / 255.0
            axes = (0,) if mode == "per_pixel_mean" else (0, 1, 2)
            n = np.prod([x.shape[a] for a in axes])
            if total is not None and x.shape[1:] != shape:
                raise ValueError(f"images of shape {x.shape[1:]} and {shape} are mixed; "
                                 f"statistics need images of one shape.")
            shape = x.shape[1:]
            total = x.sum(axis=axes) + (0 if total is None else total)
            square = (x * x).sum(axis=axes) + (0 if square is None else square)
            count = n + (count or 0)
        if not count:
            raise ValueError("no images to compute the normalisation statistics from.")
        if largest <= 1.0:
            raise ValueError("the images' values all lie in [0, 1]; expected pixel values in "
                             "[0, 255] (the normalisation divides by 255 itself).")
        mean = total / count
        if mode == "per_pixel_mean":
            return cls(mode, mean=mean)
        return cls(mode, mean=mean, std=np.sqrt(np.maximum(square / count - mean * mean, 0)))

    @classmethod
    def imagenet(cls):
        return cls("per_channel", mean=IMAGENET_MEAN, std=IMAGENET_STD)

    def invert(self, x):
        """Pixel values in [0, 255] (float32) whose normalisation is ``x``: a
        TensorFlow tensor for a tensor, a NumPy array otherwise."""
        x = _float32(x)
        if self.std is not None:
            x = x * self.std
        if self.mean is not None:
            x = x + self.mean
        return x * 255.0

    def __call__(self, images):
        """Normalises uint8 or float images with values in [0, 255]: a
        TensorFlow tensor (the tf.data pipeline, the serving signatures) with
        TensorFlow ops, anything else (NumPy, JAX arrays) with NumPy."""
        x = _float32(images) / 255.0
        if self.mean is not None:
            x = x - self.mean
        if self.std is not None:
            x = x / self.std
        return x

    def to_dict(self):
        return {"mode": self.mode,
                "mean": None if self.mean is None else self.mean.tolist(),
                "std": None if self.std is None else self.std.tolist()}

    @classmethod
    def from_dict(cls, config):
        return cls(config["mode"], config.get("mean"), config.get("std"))


def _float32(x):
    """``x`` as float32: a TensorFlow tensor stays one (TensorFlow is imported
    only for it), anything else becomes a NumPy array."""
    if type(x).__module__.startswith("tensorflow"):
        import tensorflow as tf

        return tf.cast(x, tf.float32)
    return np.asarray(x, np.float32)


def _image_batches(images, batch_size):
    """Batches of ``images`` (an array, or a dataset of batches or of
    ``(images, labels)`` batches) as NumPy arrays."""
    if hasattr(images, "as_numpy_iterator"):  # a tf.data.Dataset
        for element in images.as_numpy_iterator():
            yield element[0] if isinstance(element, tuple) else element
        return
    images = np.asarray(images)
    for start in range(0, max(len(images), 1), batch_size):
        yield images[start:start + batch_size]


def save_preprocessing(path, *, dataset, normalization, image_shape, class_names, eval_resize=None):
    """Writes what serving needs to reproduce the training inputs (JSON) to
    ``path``, a local file or a bucket's (written whole)."""
    config = {"dataset": dataset, "normalization": normalization.to_dict(),
              "image_shape": list(image_shape), "class_names": list(class_names),
              "eval_resize": eval_resize}
    storage.write_json(path, config, indent=None)
    return config


def load_preprocessing(path):
    """The dict :func:`save_preprocessing` wrote to ``path`` (local or in a
    bucket), its normalisation a :class:`Normalization`."""
    config = storage.read_json(path)
    config["normalization"] = Normalization.from_dict(config["normalization"])
    return config

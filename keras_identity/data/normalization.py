"""Input normalisation, computed from the training images and saved with a run.

The same :class:`Normalization` is applied by the training pipeline and,
inside the serving graph, by the SavedModel export, so a served model sees
exactly the inputs it was trained on.
"""

import dataclasses
import json

import numpy as np

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
    def from_images(cls, mode, images):
        """Statistics of ``images`` (uint8, ``(n, height, width, channels)``)."""
        if mode == "scale":
            return cls(mode)
        x = np.asarray(images, np.float64) / 255.0
        if mode == "per_pixel_mean":
            return cls(mode, mean=x.mean(axis=0))
        return cls(mode, mean=x.mean(axis=(0, 1, 2)), std=x.std(axis=(0, 1, 2)))

    @classmethod
    def imagenet(cls):
        return cls("per_channel", mean=IMAGENET_MEAN, std=IMAGENET_STD)

    def __call__(self, images):
        """Normalises a uint8 or float image tensor with values in [0, 255]."""
        import tensorflow as tf

        x = tf.cast(images, tf.float32) / 255.0
        if self.mean is not None:
            x = x - tf.constant(self.mean)
        if self.std is not None:
            x = x / tf.constant(self.std)
        return x

    def to_dict(self):
        return {"mode": self.mode,
                "mean": None if self.mean is None else self.mean.tolist(),
                "std": None if self.std is None else self.std.tolist()}

    @classmethod
    def from_dict(cls, config):
        return cls(config["mode"], config.get("mean"), config.get("std"))


def save_preprocessing(path, *, dataset, normalization, image_shape, class_names, eval_resize=None):
    """Writes what serving needs to reproduce the training inputs (JSON)."""
    config = {"dataset": dataset, "normalization": normalization.to_dict(),
              "image_shape": list(image_shape), "class_names": list(class_names),
              "eval_resize": eval_resize}
    with open(path, "w") as f:
        json.dump(config, f)
    return config


def load_preprocessing(path):
    with open(path) as f:
        config = json.load(f)
    config["normalization"] = Normalization.from_dict(config["normalization"])
    return config

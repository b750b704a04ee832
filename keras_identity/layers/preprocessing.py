"""Input normalisation as a layer of the model (``include_preprocessing=True``).

A model whose first layer is :class:`ImageNormalization` takes raw pixel
values in [0, 255] in training, evaluation, its ``.keras`` file and every
export signature, as ``keras.applications`` models built with
``include_preprocessing=True`` do: the statistics travel with the model, so
a served or fine-tuned model cannot meet inputs normalised otherwise than
in training.
"""

import keras
import numpy as np
from keras import ops

from keras_identity.data.normalization import Normalization


@keras.saving.register_keras_serializable(package="keras_identity")
class ImageNormalization(keras.layers.Layer):
    """``x / 255``, then the mean subtracted (and divided by the standard deviation), as
    :class:`keras_identity.data.Normalization` defines it:

    * ``"per_pixel_mean"``: minus the mean training image (He et al. 2015, Sec. 4.2, the
      recipe of both ResNet papers' CIFAR experiments);
    * ``"per_channel"``: minus the channel means, over the channel standard deviations
      (fb.resnet.torch's ImageNet statistics, the highway CIFAR recipe);
    * ``"scale"``: nothing more (inputs in [0, 1], the highway paper's MNIST).

    The statistics are part of the layer's config (so ``.keras`` files, ``clone_model`` and
    exports carry them); give them as ``mean``/``std`` or compute them from training images
    with :meth:`adapt` before the model is first called.  Computation is in float32 whatever
    the dtype policy, on the inputs as given (not autocast to a mixed policy's
    bfloat16/float16); the output is cast to the layer's compute dtype.

    Args:
        mode: one of ``"per_pixel_mean"``, ``"per_channel"``, ``"scale"``.
        mean: ``(height, width, channels)`` (per-pixel) or ``(channels,)`` (per-channel), in
            [0, 1] units.
        std: ``(channels,)``, per-channel mode only.
    """

    def __init__(self, mode="scale", mean=None, std=None, **kwargs):
        # Pixel values reach call() as given: under a mixed policy Keras would
        # otherwise cast float inputs to bfloat16 first (127.7 -> 127.5).
        kwargs["autocast"] = False
        super().__init__(**kwargs)
        self.set_normalization(Normalization(mode, mean, std))

    def set_normalization(self, normalization):
        """Replaces the mode and statistics (a :class:`Normalization`), before
        the layer first runs on data.

        Raises:
            ValueError: the layer has run already: the model's compiled
                ``fit``/``predict`` functions keep the statistics they were
                traced with.
        """
        if getattr(self, "_ran", False):
            raise ValueError(
                f"layer {self.name!r} (ImageNormalization) has already run with its current "
                f"statistics, which the model's compiled functions keep; adapt or set them "
                f"before the model's first fit/predict/call, or build a new model.")
        mode, mean, std = normalization.mode, normalization.mean, normalization.std
        if mode == "scale" and (mean is not None or std is not None):
            raise ValueError("ImageNormalization(mode='scale') takes no mean or std.")
        if mode == "per_pixel_mean" and std is not None:
            raise ValueError("ImageNormalization(mode='per_pixel_mean') takes no std (it "
                             "subtracts the mean image only).")
        if mode == "per_pixel_mean" and mean is not None and mean.ndim != 3:
            raise ValueError(f"mean of shape {mean.shape} is not valid for mode="
                             f"'per_pixel_mean'; expected (height, width, channels).")
        if mode == "per_channel":
            if (mean is None) != (std is None):
                raise ValueError("ImageNormalization(mode='per_channel') needs both mean and "
                                 "std (or neither, then adapt()).")
            if mean is not None and (mean.ndim != 1 or std.shape != mean.shape):
                raise ValueError(f"mean {mean.shape} and std {std.shape} are not valid for "
                                 f"mode='per_channel'; expected two (channels,) vectors.")
            if std is not None and not np.all(std > 0):
                raise ValueError("std must be positive in every channel.")
        self.normalization = normalization
        if self.built:
            self._check_shape(self._input_shape)

    @property
    def mode(self):
        return self.normalization.mode

    @property
    def adapted(self):
        """Whether the layer has the statistics its mode needs."""
        return self.mode == "scale" or self.normalization.mean is not None

    def _check_shape(self, input_shape):
        mean = self.normalization.mean
        if mean is None:
            return
        channels = input_shape[-1]
        if mean.shape[-1] != channels:
            raise ValueError(f"ImageNormalization: the statistics have {mean.shape[-1]} "
                             f"channels; the input has {channels} (input shape "
                             f"{tuple(input_shape)}).")
        if mean.ndim == 3 and tuple(input_shape[1:3]) != mean.shape[:2]:
            raise ValueError(f"ImageNormalization(mode='per_pixel_mean'): the mean image is "
                             f"{mean.shape[0]}x{mean.shape[1]}; the input is "
                             f"{input_shape[1]}x{input_shape[2]} (a per-pixel mean needs "
                             f"inputs of the training images' size).")

    def build(self, input_shape):
        if len(input_shape) != 4 or input_shape[-1] is None:
            raise ValueError(f"ImageNormalization expects images (batch, height, width, "
                             f"channels) with known channels; got {tuple(input_shape)}.")
        if self.mode == "per_pixel_mean" and None in tuple(input_shape[1:3]):
            raise ValueError("ImageNormalization(mode='per_pixel_mean') needs a fixed input "
                             "height and width; use mode='per_channel' for inputs of any "
                             "size.")
        self._input_shape = tuple(input_shape)
        self._check_shape(self._input_shape)

    def adapt(self, images, batch_size=1024):
        """Computes the mode's statistics from training ``images``.

        Args:
            images: pixel values in [0, 255] (uint8, or float): an array
                ``(n, height, width, channels)``, or a ``tf.data.Dataset`` of
                image batches or of ``(images, labels)`` batches.
        """
        if self.mode == "scale":
            return self
        normalization = Normalization.from_images(self.mode, images, batch_size=batch_size)
        self.set_normalization(normalization)
        return self

    def compute_output_shape(self, input_shape):
        return input_shape

    def compute_output_spec(self, inputs):
        # Not traced symbolically: a layer without statistics may be placed in
        # a functional model before adapt(); its first real call checks.
        return keras.KerasTensor(inputs.shape, dtype=self.compute_dtype)

    def __call__(self, inputs, *args, **kwargs):
        # Checked here, before Keras wraps errors of call() in its context.
        if isinstance(inputs, keras.KerasTensor):
            return super().__call__(inputs, *args, **kwargs)
        if not self.adapted:
            raise ValueError(
                f"layer {self.name!r} (ImageNormalization, mode={self.mode!r}) has no "
                f"statistics: call model.get_layer({self.name!r}).adapt(train_images) "
                f"(pixel values in [0, 255]) before training, or build the model with "
                f"normalization=keras_identity.data.Normalization.from_images(...).")
        self._ran = True
        return super().__call__(inputs, *args, **kwargs)

    def call(self, inputs):
        x = ops.cast(inputs, "float32") / 255.0
        if self.normalization.mean is not None:
            x = x - ops.convert_to_tensor(self.normalization.mean)
        if self.normalization.std is not None:
            x = x / ops.convert_to_tensor(self.normalization.std)
        return ops.cast(x, self.compute_dtype)

    def get_config(self):
        config = super().get_config()
        config.update(self.normalization.to_dict())
        return config


def find_preprocessing(model):
    """The :class:`ImageNormalization` that reads ``model``'s input directly
    (also inside a nested model that does, e.g. a backbone with a new head),
    or ``None`` (a model that takes normalised inputs)."""
    if not getattr(model, "inputs", None):
        return None
    for layer in model.layers:
        inbound = layer._inbound_nodes
        if not (inbound and any(t is model.inputs[0] for node in inbound
                                for t in node.input_tensors)):
            continue
        if isinstance(layer, ImageNormalization):
            return layer
        if isinstance(layer, keras.Model):
            found = find_preprocessing(layer)
            if found is not None:
                return found
    return None


def model_inputs(model, images, normalization=None):
    """What ``model`` takes for pixel ``images`` (values in [0, 255]): the
    images themselves if the model includes its preprocessing, else
    ``normalization(images)`` (a run's :class:`Normalization`, e.g.
    ``load_preprocessing(...)["normalization"]`` of an older run).

    Raises:
        ValueError: the model takes normalised inputs and no normalisation
            is given.
    """
    if find_preprocessing(model) is not None:
        return images
    if normalization is None:
        raise ValueError(f"model {model.name!r} takes normalised inputs (it has no "
                         f"preprocessing layer); pass the normalization of its training run.")
    return normalization(images)

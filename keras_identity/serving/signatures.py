"""Serving functions: the model behind TF Serving's request formats.

Three signatures, each returning ``probabilities`` (float32, [N, classes]), the top-k
``classes`` (int64), their ``scores`` (float32) and their ``class_names`` (string):

* ``serving_default``: ``images``, float32 [N, H, W, C] pixel values in [0, 255] (the
  model's input layout); NaN, infinities and values outside [0, 255] are refused with
  ``InvalidArgument`` (TF Serving: HTTP 400);
* ``serving_bytes``: ``image_bytes``, string [N] of JPEG/PNG/GIF/BMP bytes (the
  ``_bytes`` suffix lets TF Serving's REST API accept ``{"b64": ...}``), decoded and
  resized/cropped as at evaluation time;
* ``serving_uint8``: ``images``, uint8 [N, H, W, C].

A client sends plain pixels: a model built with ``include_preprocessing`` normalises
them itself, and for a model without it (runs made before models carried their
preprocessing) the signatures apply the training run's :class:`Normalization` from
``preprocessing.json`` in the graph.  A model with neither is refused
(:func:`check_inputs`): the pixel signatures would feed it values in [0, 255] where it
was trained on normalised inputs, and answer wrongly without a word, unless
``raw_pixels=True`` says that the model takes pixel values as they are (see
:func:`input_description`).  Inputs of the wrong size or corrupt image
bytes fail with ``InvalidArgument``, and so does an encoded image over
``max_image_bytes`` or one whose header (JPEG, PNG, GIF, BMP) declares more than
``max_image_pixels`` pixels, before it is decoded: the decode is in the exported graph,
so without a bound one small request of decompression bombs takes a server's memory.
The channel dimension is static (Keras compiles convolutions over an unknown channel
count with XLA, which TF Serving builds need not have).
"""

import tensorflow as tf

from keras_identity.data import image_headers
from keras_identity.data.augment import center_crop

SIGNATURES = ("serving_default", "serving_bytes", "serving_uint8")
# Defaults of the bounds on one encoded image (a 6000x6000 photo passes).
MAX_IMAGE_BYTES = 20 * 2 ** 20
MAX_IMAGE_PIXELS = 36_000_000


def image_pixels(encoded):
    """Height x width that an image's header declares (JPEG, PNG, GIF, BMP),
    without decoding; -1 for bytes of another format (which the bytes
    signature refuses: TensorFlow decodes more formats than it can bound).
    The header is read by :func:`keras_identity.data.image_headers.tf_declared_pixels`,
    as the training pipelines read it."""
    return image_headers.tf_declared_pixels(encoded)


def _shape_check(images, height, width, channels):
    checks = []
    shape = tf.shape(images)
    if height is not None and width is not None:
        checks.append(tf.debugging.assert_equal(
            shape[1:3], tf.constant([height, width]),
            message=f"images must have shape (batch, {height}, {width}, {channels})"))
    return checks


def check_inputs(model, preprocessing=None, raw_pixels=False):
    """Refuses (``ValueError``, one line) a model that neither normalises its
    inputs (a preprocessing layer) nor gets a normalisation in
    ``preprocessing``, unless ``raw_pixels`` says it takes pixel values in
    [0, 255] as they are; and ``raw_pixels`` for a model that normalises."""
    from keras_identity.layers.preprocessing import find_preprocessing

    normalises = (find_preprocessing(model) is not None
                  or (preprocessing or {}).get("normalization") is not None)
    if raw_pixels and normalises:
        raise ValueError("raw_pixels (--raw_pixels) is not valid for a model whose inputs are "
                         "normalised (its preprocessing layer, or the preprocessing given); "
                         "its signatures take pixel values in [0, 255] already.")
    if not raw_pixels and not normalises:
        raise ValueError("the model has no preprocessing layer and no preprocessing was given "
                         "(--preprocessing), so the pixel signatures would feed it pixel "
                         "values in [0, 255] unnormalised; build it with "
                         "include_preprocessing=True, give its run's preprocessing.json "
                         "(--preprocessing), or pass raw_pixels=True (--raw_pixels) if it "
                         "takes pixel values as they are.")


def input_description(model, preprocessing=None):
    """What the signatures feed ``model`` (one line, for the export log), of
    a model :func:`check_inputs` passed: one with neither a preprocessing
    layer nor a normalisation takes pixel values as they are (``raw_pixels``)."""
    from keras_identity.layers.preprocessing import find_preprocessing

    refused = ("; serving_default refuses (InvalidArgument) values that are not finite or "
               "lie outside [0, 255]")
    layer = find_preprocessing(model)
    if layer is not None:
        return (f"the model normalises its inputs itself (layer {layer.name!r}, "
                f"{layer.mode}): every signature takes pixel values in [0, 255]" + refused)
    normalization = (preprocessing or {}).get("normalization")
    if normalization is not None:
        return (f"the signatures apply the run's normalisation ({normalization.mode}) to "
                f"pixel values in [0, 255]" + refused)
    return ("the model takes pixel values as they are (raw_pixels): every signature "
            "feeds it pixel values in [0, 255] as float32" + refused)


def _value_checks(images):
    """InvalidArgument for non-finite float inputs and for values outside
    [0, 255] (TF Serving answers 400): every signature takes pixels."""
    if not images.dtype.is_floating:
        return []
    return [tf.debugging.assert_equal(
        tf.reduce_all(tf.math.is_finite(images)), True,
        message="images: every value must be finite (NaN or infinity given)"),
        tf.debugging.assert_equal(
            tf.reduce_all(tf.logical_and(images >= 0.0, images <= 255.0)), True,
            message="images: pixel values must lie in [0, 255]")]


def make_serving_functions(model, preprocessing=None, top_k=5,
                           max_image_bytes=MAX_IMAGE_BYTES,
                           max_image_pixels=MAX_IMAGE_PIXELS, forward=None,
                           raw_pixels=False):
    """Returns ``{signature_name: (fn, input_signature)}`` for ``model``.

    Args:
        model: a Keras model.
        forward: a TensorFlow callable computing ``model(images, training=False)`` (default:
            the model itself, on TensorFlow; the exporter passes the jax2tf-converted model
            on JAX).
        preprocessing: ``None``, or the dict of :func:`load_preprocessing` (normalisation,
            image shape, class names, ImageNet evaluation resize); its normalisation is
            applied only to a model that does not include its own.
        top_k: classes and scores returned per example.
        max_image_bytes, max_image_pixels: bounds on each encoded image of ``serving_bytes``
            (``InvalidArgument`` beyond, before decoding).
        raw_pixels: the model takes pixel values in [0, 255] as they are (a model that
            neither normalises its inputs nor gets a normalisation is refused without it:
            :func:`check_inputs`).
    """
    check_inputs(model, preprocessing, raw_pixels)
    for name, value in (("max_image_bytes", max_image_bytes),
                        ("max_image_pixels", max_image_pixels)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{name}={value!r} is not valid; expected an integer >= 1.")
    _, height, width, channels = model.input_shape
    if channels is None:
        raise ValueError("the model's input needs a known number of channels.")
    from keras_identity.layers.preprocessing import find_preprocessing

    preprocessing = preprocessing or {}
    target = tuple(preprocessing.get("image_shape") or (height, width, channels))
    out_height = height or target[0]
    out_width = width or target[1]
    if out_height is None or out_width is None:
        raise ValueError("the model's input has no fixed height and width; give the serving "
                         "image size as preprocessing={'image_shape': (height, width, "
                         "channels)} (the bytes signature resizes and crops to it).")
    normalization = preprocessing.get("normalization")
    if find_preprocessing(model) is not None:
        normalization = None  # in the model
    num_classes = model.output_shape[-1]
    names = list(preprocessing.get("class_names") or [])
    if len(names) != num_classes:
        names = [str(i) for i in range(num_classes)]
    class_names = tf.constant(names)
    k = min(top_k, num_classes)
    eval_resize = preprocessing.get("eval_resize")
    if forward is None:
        def forward(images):
            return model(images, training=False)

    def predict(pixels):
        images = pixels if normalization is None else normalization(pixels)
        probabilities = tf.cast(forward(images), tf.float32)
        top = tf.math.top_k(probabilities, k=k)
        return {"probabilities": probabilities,
                "classes": tf.cast(top.indices, tf.int64),
                "scores": top.values,
                "class_names": tf.gather(class_names, top.indices)}

    def from_pixels(images):
        with tf.control_dependencies(_shape_check(images, height, width, channels)
                                     + _value_checks(images)):
            return predict(tf.identity(tf.cast(images, tf.float32)))

    def decode(encoded):
        size_check = tf.debugging.assert_less_equal(
            tf.strings.length(encoded, unit="BYTE"), max_image_bytes,
            message=f"image_bytes: an encoded image is larger than max_image_bytes="
                    f"{max_image_bytes}")
        with tf.control_dependencies([size_check]):
            pixels = image_pixels(encoded)
        format_check = tf.debugging.assert_greater_equal(
            pixels, tf.constant(0, tf.int64),
            message="image_bytes: Unknown image file format (expected JPEG, PNG, GIF or BMP)")
        pixel_check = tf.debugging.assert_less_equal(
            pixels, tf.constant(max_image_pixels, tf.int64),
            message=f"image_bytes: an image declares more than max_image_pixels="
                    f"{max_image_pixels} pixels")
        with tf.control_dependencies([format_check, pixel_check]):
            image = tf.io.decode_image(encoded, channels=channels, expand_animations=False)
        if eval_resize:  # ImageNet: shorter side to 256 (or 320), central crop
            image = center_crop(image, eval_resize, out_height)
        else:  # small images: as trained, else shorter side to H and central crop
            image = tf.cast(image, tf.float32)
            same = tf.reduce_all(tf.equal(tf.shape(image)[:2], [out_height, out_width]))
            image = tf.cond(same, lambda: image,
                            lambda: center_crop(image, out_height, out_height))
        return tf.ensure_shape(image, [out_height, out_width, channels])

    def from_bytes(image_bytes):
        images = tf.map_fn(decode, image_bytes, fn_output_signature=tf.TensorSpec(
            [out_height, out_width, channels], tf.float32))
        return predict(images)

    spec = [None, None, None, channels]
    return {
        "serving_default": (from_pixels, [tf.TensorSpec(spec, tf.float32, name="images")]),
        "serving_bytes": (from_bytes, [tf.TensorSpec([None], tf.string, name="image_bytes")]),
        "serving_uint8": (from_pixels, [tf.TensorSpec(spec, tf.uint8, name="images")]),
    }

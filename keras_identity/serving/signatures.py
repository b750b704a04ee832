"""Serving functions: the model behind TF Serving's request formats.

Three signatures, each returning ``probabilities`` (float32, [N, classes]),
the top-k ``classes`` (int64), their ``scores`` (float32) and their
``class_names`` (string):

* ``serving_default``: ``images``, float32 [N, H, W, C] pixel values in
  [0, 255] (the model's input layout);
* ``serving_bytes``: ``image_bytes``, string [N] of JPEG/PNG/GIF/BMP bytes
  (the ``_bytes`` suffix lets TF Serving's REST API accept
  ``{"b64": ...}``), decoded and resized/cropped as at evaluation time;
* ``serving_uint8``: ``images``, uint8 [N, H, W, C].

Every signature applies the training run's :class:`Normalization` in the
graph, so a client sends plain pixels.  Inputs of the wrong size or
corrupt image bytes fail with ``InvalidArgument``.  The channel dimension is
static (Keras compiles convolutions over an unknown channel count with XLA,
which TF Serving builds need not have).
"""

import tensorflow as tf

from keras_identity.data.augment import center_crop

SIGNATURES = ("serving_default", "serving_bytes", "serving_uint8")


def _shape_check(images, height, width, channels):
    checks = []
    shape = tf.shape(images)
    if height is not None and width is not None:
        checks.append(tf.debugging.assert_equal(
            shape[1:3], tf.constant([height, width]),
            message=f"images must have shape (batch, {height}, {width}, {channels})"))
    return checks


def make_serving_functions(model, preprocessing, top_k=5):
    """Returns ``{signature_name: (fn, input_signature)}`` for ``model``.

    Args:
        model: a Keras model taking normalised images.
        preprocessing: the dict of :func:`load_preprocessing` (normalisation,
            image shape, class names, ImageNet evaluation resize).
        top_k: classes and scores returned per example.
    """
    _, height, width, channels = model.input_shape
    if channels is None:
        raise ValueError("the model's input needs a known number of channels.")
    target = tuple(preprocessing["image_shape"])
    out_height = height or target[0]
    out_width = width or target[1]
    normalization = preprocessing["normalization"]
    num_classes = model.output_shape[-1]
    names = list(preprocessing.get("class_names") or [])
    if len(names) != num_classes:
        names = [str(i) for i in range(num_classes)]
    class_names = tf.constant(names)
    k = min(top_k, num_classes)
    eval_resize = preprocessing.get("eval_resize")

    def predict(pixels):
        probabilities = tf.cast(model(normalization(pixels), training=False), tf.float32)
        top = tf.math.top_k(probabilities, k=k)
        return {"probabilities": probabilities,
                "classes": tf.cast(top.indices, tf.int64),
                "scores": top.values,
                "class_names": tf.gather(class_names, top.indices)}

    def from_pixels(images):
        with tf.control_dependencies(_shape_check(images, height, width, channels)):
            return predict(tf.identity(tf.cast(images, tf.float32)))

    def decode(encoded):
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

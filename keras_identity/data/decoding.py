"""Image bytes to pixels: the header checks made before anything is
decoded (declared size, format, colour PNGs' conversion to gray),
:func:`decode_image` (Pillow) and :func:`decode_all` (a whole in-memory
split: TensorFlow where it is installed, Pillow elsewhere), each refusing
an image in one line naming it.  Both decoders give the same pixels for
PNGs (:mod:`~keras_identity.data.png_pixels`: 16-bit images to their high
byte)."""

import numpy as np

from keras_identity.data import image_headers
from keras_identity.data import png_pixels
from keras_identity.data.errors import DataError
from keras_identity.data.errors import first_line

# What an image file that does not decode should be (the end of its refusal).
EXPECTED_IMAGE = "expected a complete JPEG, PNG, GIF or BMP file"
# The refusal of a file (after its name) with no header of those formats.
NO_IMAGE_HEADER = f" is not a readable image (no JPEG, PNG, GIF or BMP header); {EXPECTED_IMAGE}."


def check_pixels(data, name, require_header=False):
    """Raises :class:`DataError` naming ``name`` if the header of the image
    bytes ``data`` declares more than ``image_headers.MAX_IMAGE_PIXELS``
    pixels (read before decoding: a small file can declare gigabytes), or,
    with ``require_header``, if it has no JPEG, PNG, GIF or BMP header
    (TensorFlow decodes other formats, unbounded)."""
    size = image_headers.declared_size(data)
    if size is None:
        if require_header:
            raise DataError(f"{name}{NO_IMAGE_HEADER}")
    elif size[0] * size[1] > image_headers.MAX_IMAGE_PIXELS:
        raise DataError(image_headers.describe_too_many(name, size[1], size[0]))


def check_gray_conversion(data, name):
    """For a 1-channel dataset: the gamma with which the image bytes ``data``
    are converted to gray (:func:`png_pixels.gray_conversion`; ``None``: not
    a colour PNG); raises :class:`DataError` naming ``name`` for a colour
    PNG whose conversion Pillow's pixels do not reproduce (refused on both
    routes, so that they read the same images)."""
    try:
        return png_pixels.gray_conversion(data)
    except png_pixels.NotReproduced as error:
        raise DataError(png_pixels.refusal(name, error)) from None


def decode_image(data, channels, name="image"):
    """Decodes the bytes of a JPEG/PNG/BMP/GIF file into a uint8 array
    ``(height, width, channels)`` (the first frame of an animation) with
    Pillow; raises :class:`DataError` naming ``name`` if it does not decode,
    or if its header declares more than ``image_headers.MAX_IMAGE_PIXELS``
    pixels (:func:`check_pixels`; other formats Pillow reads: the size it
    reads from their header, before decoding).  PNGs decode to TensorFlow's
    pixels (:mod:`~keras_identity.data.png_pixels`): 16-bit samples reduced
    to their high byte, colour converted to gray as libpng does (a colour
    PNG whose conversion is not reproduced is refused, see
    :func:`check_gray_conversion`)."""
    import io

    from PIL import Image

    check_pixels(data, name)
    gamma = check_gray_conversion(data, name) if channels == 1 else None
    try:
        with Image.open(io.BytesIO(data)) as picture:
            width, height = picture.size
            if width * height > image_headers.MAX_IMAGE_PIXELS:
                raise DataError(image_headers.describe_too_many(name, width, height))
            return png_pixels.pillow_pixels(picture, channels, gamma)
    except DataError:
        raise
    except Exception as error:  # PIL.UnidentifiedImageError, OSError, ...
        if image_headers.declared_size(data) is None:   # an empty file, another format
            raise DataError(f"{name}{NO_IMAGE_HEADER}") from None
        raise DataError(f"{name} is not a readable image ({type(error).__name__}: "
                        f"{first_line(error)}); {EXPECTED_IMAGE}.") from None


def conversions(encoded, channels, names):
    """What decoding the image bytes ``encoded`` (files ``names``) into
    ``channels`` changes, in words for a dataset's description (empty
    where nothing): 16-bit PNGs reduced to their high byte, and images of
    fewer colour channels (grayscale) made into ``channels`` (3)."""
    sixteen, gray = [], []
    for data, name in zip(encoded, names):
        layout = image_headers.declared_layout(data)
        if layout is None:
            continue
        if layout[1] == 16 and png_pixels.header(data) is not None:
            sixteen.append(name)
        if channels == 3 and layout[0] < 3:
            gray.append(name)
    notes = []
    for found, what in ((sixteen, "16-bit PNG{} reduced to 8 bits (the high byte)"),
                        (gray, "grayscale image{} made RGB")):
        if found:
            plural = "s" if len(found) > 1 else ""
            notes.append(f"{len(found):,} {what.format(plural)}: {', '.join(found[:3])}"
                         f"{', ...' if len(found) > 3 else ''}")
    return "; ".join(notes)


def decode_all(encoded, channels, names, source):
    """Decodes JPEG/PNG byte strings into one uint8 array; a file whose header
    declares too many pixels (:func:`check_pixels`, before anything is
    decoded), a colour PNG whose conversion to gray (``channels`` 1) Pillow
    does not reproduce (:func:`check_gray_conversion`, on either decoder),
    one that does not decode, or whose size differs from the others, is
    named in the error.
    TensorFlow decodes where it is installed (the tf.data route's decoder),
    Pillow elsewhere."""
    from keras_identity import _tensorflow

    for data, name in zip(encoded, names):
        check_pixels(data, f"{source}: {name}", require_header=True)
        if channels == 1:
            check_gray_conversion(data, f"{source}: {name}")
    if not _tensorflow.available():
        images, sizes = [], {}
        for data, name in zip(encoded, names):
            images.append(decode_image(data, channels, f"{source}: {name}"))
            _note_size(sizes, images[-1].shape, name, source)
        return np.stack(images) if images else np.zeros((0, 1, 1, channels), np.uint8)
    import tensorflow as tf

    ds = tf.data.Dataset.from_tensor_slices(encoded).map(
        lambda b: tf.io.decode_image(b, channels=channels, expand_animations=False),
        num_parallel_calls=tf.data.AUTOTUNE).batch(4096)
    try:
        parts = [batch.numpy() for batch in ds]
    except tf.errors.OpError:
        _raise_for_bad_image(encoded, channels, names, source)
        raise
    return np.concatenate(parts) if parts else np.zeros((0, 1, 1, channels), np.uint8)


def _note_size(sizes, shape, name, source):
    """Adds image ``name``'s ``shape`` to ``sizes`` (shape -> first image of
    it); raises :class:`DataError` naming both images once two sizes are seen."""
    sizes.setdefault(tuple(shape), name)
    if len(sizes) > 1:
        (first, first_name), (other, other_name) = list(sizes.items())[:2]
        raise DataError(f"{source}: {other_name} is {other[1]}x{other[0]}x{other[2]}, "
                        f"other images ({first_name}, ...) are "
                        f"{first[1]}x{first[0]}x{first[2]}; in-memory datasets need one "
                        f"size.")


def _raise_for_bad_image(encoded, channels, names, source):
    """Finds the image that stopped :func:`decode_all` and raises naming it."""
    import tensorflow as tf

    sizes = {}
    for data, name in zip(encoded, names):
        try:
            image = tf.io.decode_image(data, channels=channels, expand_animations=False)
        except tf.errors.OpError as error:
            raise DataError(f"{source}: {name} is not a readable image "
                            f"({first_line(error.message)}); {EXPECTED_IMAGE}.") from None
        _note_size(sizes, image.shape, name, source)

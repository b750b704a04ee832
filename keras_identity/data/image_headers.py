"""The size an image file's header declares, read before anything is decoded.

A decoder allocates what the header declares: a PNG of a few kilobytes can
declare 20000x20000 pixels (1.2 GB once decoded).  Every place that decodes
image files (the loading of in-memory datasets, the tf.data file pipeline,
the Pillow decoder of the JAX route, serving's bytes signature) first reads
the size from the header of the four formats TensorFlow decodes (JPEG, PNG,
GIF, BMP) and refuses an image over its bound:

* :func:`declared_size` reads Python bytes (no TensorFlow needed);
* :func:`tf_declared_size` and :func:`tf_declared_pixels` read a string
  tensor in a TensorFlow graph (tf.data, exported serving functions).

Both read the same fields: a JPEG's frame header (SOF), a PNG's IHDR, a
GIF's logical screen, a BMP's BITMAPINFOHEADER.
"""

# The bound on an image's pixels when reading datasets (training and test
# images): Pillow's default ``Image.MAX_IMAGE_PIXELS`` (a 9459x9459 image,
# 268 MB of RGB once decoded), so that both routes refuse the same images.
MAX_IMAGE_PIXELS = 89_478_485

_PNG = b"\x89PNG"
# JPEG frame headers (SOF0-SOF15), less DHT (C4), JPG (C8) and DAC (CC).
_JPEG_FRAMES = frozenset(range(0xC0, 0xD0)) - {0xC4, 0xC8, 0xCC}
# Markers without a length field: TEM, RST0-RST7, SOI.
_JPEG_STANDALONE = frozenset([0x01, 0xD8, *range(0xD0, 0xD8)])


def _unsigned(data, start, length, little_endian):
    return int.from_bytes(data[start:start + length], "little" if little_endian else "big")


def _jpeg_frame(data):
    """Where the JPEG's frame header (SOFn) begins, or ``None`` if the
    markers before it are cut short or broken."""
    i = 2
    while i + 4 <= len(data):
        if data[i] != 0xFF:
            return None
        marker = data[i + 1]
        if marker == 0xFF:  # fill byte
            i += 1
        elif marker in _JPEG_STANDALONE:
            i += 2
        elif marker in _JPEG_FRAMES:
            return i if i + 10 <= len(data) else None
        elif marker in (0xD9, 0xDA):  # end of image, or scan data before any frame
            return None
        else:
            i += 2 + _unsigned(data, i + 2, 2, False)
    return None


def _jpeg_size(data):
    """``(height, width)`` of the JPEG's frame header, or ``None``."""
    i = _jpeg_frame(data)
    return None if i is None else (_unsigned(data, i + 5, 2, False),
                                   _unsigned(data, i + 7, 2, False))


def _gif_size(data):
    """``(height, width)`` a GIF decodes to: its logical screen (little-endian
    16-bit at 6 and 8) or, larger, the extent of a frame (TensorFlow decodes
    to the frames' extent, which a crafted file makes larger than the screen).
    The blocks are walked without decoding; ``None`` if they are cut short."""
    height, width = _unsigned(data, 8, 2, True), _unsigned(data, 6, 2, True)
    i = 13 + (3 << ((data[10] & 0x07) + 1) if data[10] & 0x80 else 0)  # global colour table

    def skip_sub_blocks(i):
        while i < len(data) and data[i]:
            i += 1 + data[i]
        return i + 1

    while i < len(data):
        block = data[i]
        if block == 0x3B:  # trailer
            break
        if block == 0x21:  # extension: label, then sub-blocks
            i = skip_sub_blocks(i + 2)
        elif block == 0x2C and i + 10 <= len(data):  # image descriptor
            left, top = _unsigned(data, i + 1, 2, True), _unsigned(data, i + 3, 2, True)
            width = max(width, left + _unsigned(data, i + 5, 2, True))
            height = max(height, top + _unsigned(data, i + 7, 2, True))
            flags = data[i + 9]
            i += 10 + (3 << ((flags & 0x07) + 1) if flags & 0x80 else 0)
            i = skip_sub_blocks(i + 1)  # the LZW code size, then the image data
        else:
            return None
    return height, width


def declared_size(data):
    """``(height, width)`` that the header of the image bytes ``data``
    declares (JPEG, PNG, GIF, BMP), without decoding; ``None`` for bytes of
    another format, or a header cut short."""
    data = bytes(data)
    if data.startswith(b"\xff\xd8"):
        return _jpeg_size(data)
    if len(data) < 24:
        return None
    if data.startswith(_PNG):  # IHDR: width, height as big-endian 32-bit at 16 and 20
        return _unsigned(data, 20, 4, False), _unsigned(data, 16, 4, False)
    if data.startswith(b"GIF"):
        return _gif_size(data)
    if data.startswith(b"BM") and len(data) >= 26:  # BITMAPINFOHEADER, height signed
        height = _unsigned(data, 22, 4, True)
        height = 2 ** 32 - height if height >= 2 ** 31 else height
        return height, _unsigned(data, 18, 4, True)
    return None


# The channels of a PNG's colour types (gray, RGB, palette, gray + alpha, RGBA).
_PNG_CHANNELS = {0: 1, 2: 3, 3: 3, 4: 2, 6: 4}


def declared_layout(data):
    """``(channels, bits per sample)`` that the header of a JPEG or PNG
    declares (a palette PNG: 3 channels of its palette's 8 bits); ``None``
    for another format, or a header cut short."""
    data = bytes(data)
    if data.startswith(b"\xff\xd8"):
        i = _jpeg_frame(data)
        return None if i is None else (data[i + 9], data[i + 4])
    if data.startswith(_PNG) and len(data) >= 26 and data[25] in _PNG_CHANNELS:
        return _PNG_CHANNELS[data[25]], 8 if data[25] == 3 else data[24]
    return None


def describe_too_many(name, width, height, bound=MAX_IMAGE_PIXELS):
    """``name: its header declares WIDTHxHEIGHT pixels; ...`` (one line)."""
    return (f"{name}: its header declares {width}x{height} pixels; images of at most "
            f"{bound:,} pixels are read (a decompression bomb, or an image to resize), so "
            f"it is not decoded.")


def _tf_unsigned(encoded, start, length, little_endian):
    """The unsigned integer of ``length`` bytes at ``start`` of a string tensor."""
    import tensorflow as tf

    digits = tf.cast(tf.io.decode_raw(tf.strings.substr(encoded, start, length), tf.uint8),
                     tf.int64)
    powers = [256 ** i for i in range(length)]
    weights = tf.constant(powers if little_endian else powers[::-1], tf.int64)
    return tf.reduce_sum(digits[:length] * weights[:tf.shape(digits)[0]])


def tf_declared_size(encoded):
    """``[height, width]`` (int64) that the header of an encoded image (a
    scalar string tensor) declares (JPEG, PNG, GIF, BMP), without decoding;
    ``[-1, -1]`` for bytes of another format.  A JPEG whose markers are
    broken before its frame header raises ``InvalidArgumentError``
    (``tf.image.extract_jpeg_shape``)."""
    import tensorflow as tf

    length = tf.strings.length(encoded)

    def starts_with(prefix):
        return tf.logical_and(length >= len(prefix) + 8,
                              tf.equal(tf.strings.substr(encoded, 0, len(prefix)), prefix))

    def jpeg():
        return tf.cast(tf.image.extract_jpeg_shape(encoded)[:2], tf.int64)

    def png():
        return tf.stack([_tf_unsigned(encoded, 20, 4, False),
                         _tf_unsigned(encoded, 16, 4, False)])

    def gif():
        return tf.stack([_tf_unsigned(encoded, 8, 2, True), _tf_unsigned(encoded, 6, 2, True)])

    def bmp():
        height = _tf_unsigned(encoded, 22, 4, True)
        height = tf.where(height >= 2 ** 31, 2 ** 32 - height, height)
        return tf.stack([height, _tf_unsigned(encoded, 18, 4, True)])

    return tf.case([(starts_with(b"\xff\xd8"), jpeg), (starts_with(_PNG), png),
                    (starts_with(b"GIF"), gif), (starts_with(b"BM"), bmp)],
                   default=lambda: tf.constant([-1, -1], tf.int64), exclusive=True)


def tf_declared_pixels(encoded):
    """Height x width that an encoded image's header declares (see
    :func:`tf_declared_size`); -1 for bytes of another format."""
    import tensorflow as tf

    size = tf_declared_size(encoded)
    return tf.where(size[0] < 0, tf.constant(-1, tf.int64), size[0] * size[1])

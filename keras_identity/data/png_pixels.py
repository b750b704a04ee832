"""The pixels TensorFlow's PNG decoder gives, reproduced from Pillow's.

TensorFlow (``tf.io.decode_image``, ``decode_png(dtype=uint8)``: the tf.data route and
serving) decodes PNGs with libpng; the JAX route decodes with Pillow
(:func:`keras_identity.data.decoding.decode_image`).  The two agree on 8-bit PNGs read
as RGB, and on 16-bit colour ones (Pillow keeps the high byte too), but not on:

* 16-bit grayscale PNGs (with or without tRNS): libpng keeps the high byte of every
  sample (``value >> 8``, ``png_set_strip_16``, measured on gray, gray+alpha, RGB and
  RGBA); Pillow reads them in mode ``I;16`` (``I`` in older Pillow), which its
  conversions clip to 255, i.e. white (16-bit gray+alpha it reads as RGBA of the high
  bytes, as libpng).  :func:`pillow_pixels` takes the high byte, for 1 or 3 channels;
* colour PNGs (RGB, RGBA, palette) read as one channel (MNIST): libpng's
  ``png_set_rgb_to_gray(0.299, 0.587)`` is ``(9797 R + 19234 G + 3737 B) >> 15``,
  truncated, and through the file's gamma when a gAMA or sRGB chunk declares one
  (:func:`libpng_gray`); Pillow's ``L`` rounds, ignoring gamma.  What cannot be
  reproduced from Pillow's pixels is refused by both decoders when a dataset is read
  (:func:`gray_conversion`): a 16-bit colour PNG (Pillow keeps 8 of its bits), or chunks
  whose effect on libpng's gamma is not reproduced (iCCP, cICP, repeated or invalid
  gAMA/sRGB chunks, or any after PLTE).

JPEG, GIF and BMP files are converted by Pillow as they always were (its JPEG decoder
rounds differently from TensorFlow's: a run's identity names the decoder, see
``image_folders.assemble``).

``tests/data/test_png_pixels.py`` compares both decoders pixel for pixel.
"""

import math
import struct

import numpy as np

_SIGNATURE = b"\x89PNG\r\n\x1a\n"
# IHDR colour types that libpng converts to gray with rgb_to_gray.
_COLOUR_TYPES = {2: "RGB", 3: "palette", 6: "RGBA"}
_ARTICLES = {2: "an", 3: "a", 6: "an"}
# Pillow modes of 16-bit grayscale samples (and "I", in which older Pillow
# read 16-bit gray PNGs: see pillow_pixels).
SIXTEEN_BIT_MODES = ("I;16", "I;16L", "I;16B", "I;16N")
# libpng's rgb_to_gray coefficients for (0.299, 0.587), in 1/32768.
_RED, _GREEN = 29900 * 32768 // 100000, 58700 * 32768 // 100000
_BLUE = 32768 - _RED - _GREEN
# libpng's fixed-point gamma of an sRGB chunk (1 / 2.2).
_SRGB_GAMMA = 45455
# What a 1-channel dataset reads (the end of a refusal).
GRAY_EXPECTED = ("a 1-channel (grayscale) dataset reads grayscale images, or colour PNGs "
                 "of 8 bits per channel with at most one gAMA and one sRGB chunk before "
                 "PLTE and no iCCP or cICP chunk.")


class NotReproduced(ValueError):
    """A PNG whose conversion to gray is not reproduced from Pillow's pixels;
    the message says what it is (after the file's name: "is a 16-bit RGB
    PNG"), :func:`refusal` the whole line."""


def refusal(name, error):
    """The one-line refusal of the file ``name`` for :class:`NotReproduced` ``error``."""
    return (f"{name} {error}, which would not be converted to gray the same way on both "
            f"routes (TensorFlow's decoder and Pillow's); {GRAY_EXPECTED}")


def header(data):
    """``(bit_depth, colour_type)`` of a PNG's IHDR, or ``None`` for another format."""
    if data[:8] != _SIGNATURE or len(data) < 26 or data[12:16] != b"IHDR":
        return None
    return data[24], data[25]


def _significant(gamma):
    """libpng's ``png_gamma_significant``: not within 5% of 1 (fixed point 1e5)."""
    return gamma < 95000 or gamma > 105000


def _reciprocal(gamma):
    """libpng's ``png_reciprocal`` of a fixed-point gamma."""
    return int(math.floor(1e10 / gamma + 0.5))


def _gamma_table(gamma):
    """libpng's ``png_build_8bit_table`` (``png_gamma_8bit_correct``)."""
    values = np.arange(256)
    if not _significant(gamma):
        return values
    table = np.floor(255 * np.power(values / 255.0, gamma * 1e-5) + 0.5).astype(np.int64)
    table[0], table[255] = 0, 255
    return table


def _matches(gamma, other):
    """libpng's ``png_colorspace_check_gamma``: ``gamma / other`` within 5% of 1."""
    return not _significant(int(math.floor(gamma * 100000 / other + 0.5)))


def _file_gamma(data):
    """The fixed-point gamma (1e5) libpng reads from the PNG's gAMA and sRGB
    chunks, or ``None``; raises :class:`NotReproduced` for chunks whose
    effect is not reproduced here."""
    at, gama, srgb, order, after_palette = 8, [], [], [], False
    while at + 8 <= len(data):
        length = struct.unpack(">I", data[at:at + 4])[0]
        kind, body = data[at + 4:at + 8], data[at + 8:at + 8 + length]
        if kind in (b"IDAT", b"IEND"):
            break
        if kind in (b"iCCP", b"cICP"):
            raise NotReproduced(f"with an {kind.decode()} chunk")
        if kind in (b"gAMA", b"sRGB"):
            if after_palette:
                raise NotReproduced(f"with a {kind.decode()} chunk after PLTE")
            valid = (len(body) == 4 and 16 <= struct.unpack(">I", body)[0] <= 625000000
                     if kind == b"gAMA" else len(body) == 1 and body[0] <= 3)
            if not valid:
                raise NotReproduced(f"with an invalid {kind.decode()} chunk")
            (gama if kind == b"gAMA" else srgb).append(body)
            order.append(kind)
        after_palette = after_palette or kind == b"PLTE"
        at += 12 + length
    if len(gama) > 1 or len(srgb) > 1:
        raise NotReproduced(f"with {len(gama)} gAMA and {len(srgb)} sRGB chunks")
    declared = struct.unpack(">I", gama[0])[0] if gama else None
    if not srgb:
        return declared
    # An sRGB chunk sets 1/2.2; a gAMA after it replaces that only if it agrees.
    if order == [b"sRGB", b"gAMA"] and _matches(_SRGB_GAMMA, declared):
        return declared
    return _SRGB_GAMMA


def gray_conversion(data):
    """How libpng converts the image bytes ``data`` to one channel: ``None``
    if they are not a colour PNG (nothing to reproduce), else the file's
    gamma for :func:`libpng_gray` (``0`` for none).  Raises
    :class:`NotReproduced` for a 16-bit colour PNG and for the chunks
    :func:`_file_gamma` refuses."""
    found = header(data)
    if found is None or found[1] not in _COLOUR_TYPES:
        return None
    kind = f"{_COLOUR_TYPES[found[1]]} PNG"
    if found[0] == 16:
        raise NotReproduced(f"is a 16-bit {kind} (Pillow reads 8 of its bits)")
    try:
        return _file_gamma(data) or 0
    except NotReproduced as error:
        raise NotReproduced(f"is {_ARTICLES[found[1]]} {kind} {error}") from None


def libpng_gray(rgb, gamma):
    """libpng's ``png_do_rgb_to_gray`` of the 8-bit ``rgb`` ``(h, w, 3)``
    (``gamma``: the file's, from :func:`gray_conversion`): uint8 ``(h, w)``."""
    red, green, blue = (rgb[..., i].astype(np.int64) for i in range(3))
    if not gamma or not (_significant(gamma) or _significant(_reciprocal(gamma))):
        return ((_RED * red + _GREEN * green + _BLUE * blue) >> 15).astype(np.uint8)
    to_linear = _gamma_table(_reciprocal(gamma))
    from_linear = _gamma_table(_reciprocal(_reciprocal(gamma)))
    linear = (_RED * to_linear[red] + _GREEN * to_linear[green] + _BLUE * to_linear[blue]
              + 16384) >> 15
    gray = np.where((red == green) & (green == blue), red, from_linear[linear])
    return gray.astype(np.uint8)


def pillow_pixels(picture, channels, gamma=None):
    """The uint8 ``(h, w, channels)`` pixels of the open Pillow image
    ``picture`` (``channels`` 1 or 3) that TensorFlow's decoder gives:
    16-bit gray reduced to its high byte; a colour PNG converted to gray by
    :func:`libpng_gray` when ``gamma`` (from :func:`gray_conversion`) is not
    ``None``; anything else converted by Pillow (``L`` or ``RGB``)."""
    if picture.mode in SIXTEEN_BIT_MODES or (picture.mode == "I" and picture.format == "PNG"):
        high = (np.clip(np.asarray(picture), 0, 65535).astype(np.uint16) >> 8).astype(np.uint8)
        return np.repeat(high[..., None], channels, axis=-1)
    if channels == 1 and gamma is not None:
        return libpng_gray(np.asarray(picture.convert("RGB")), gamma)[..., None]
    image = np.asarray(picture.convert("L" if channels == 1 else "RGB"), np.uint8)
    return image[..., None] if image.ndim == 2 else image

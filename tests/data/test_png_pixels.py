"""Pillow's decoder (the JAX route) gives the pixels of TensorFlow's (the
tf.data route, serving) for every PNG both read: 16-bit samples reduced to
their high byte, colour converted to gray as libpng does; a colour PNG whose
conversion to gray is not reproduced is refused on both routes
(keras_identity/data/png_pixels.py).  JPEG, GIF and BMP decode as before."""

import io
import os
import struct
import zlib

import numpy as np
import pytest
from PIL import Image

from keras_identity.data import DataError
from keras_identity.data import load_dataset
from keras_identity.data.decoding import decode_image

pytestmark = pytest.mark.quick  # the quick tier (docs/testing.md)


def _chunk(kind, body):
    return (struct.pack(">I", len(body)) + kind + body
            + struct.pack(">I", zlib.crc32(kind + body) & 0xFFFFFFFF))


def _png(samples, colour_type, bit_depth=8, chunks=b""):
    """A PNG of ``samples`` ``(h, w, c)`` (``bit_depth`` 8 or 16) with
    ``chunks`` before its image data: what Pillow does not write (16-bit
    colour and gray+alpha, gAMA and sRGB chunks)."""
    samples = np.asarray(samples)
    height, width = samples.shape[:2]
    rows = samples.astype(">u2" if bit_depth == 16 else np.uint8).reshape(height, -1)
    ihdr = struct.pack(">IIBBBBB", width, height, bit_depth, colour_type, 0, 0, 0)
    return (b"\x89PNG\r\n\x1a\n" + _chunk(b"IHDR", ihdr) + chunks
            + _chunk(b"IDAT", zlib.compress(b"".join(b"\x00" + r.tobytes() for r in rows)))
            + _chunk(b"IEND", b""))


def _gamma(value):
    return _chunk(b"gAMA", struct.pack(">I", value))


_SRGB = _chunk(b"sRGB", b"\x00")
# Every 16-bit value once, 256x256.
_ALL16 = np.arange(65536, dtype=np.int64).reshape(256, 256)
# PNG colour types: gray, RGB, palette, gray+alpha, RGBA.
_GRAY, _RGB, _GRAY_ALPHA, _RGBA = 0, 2, 4, 6


def _sixteen_bit(colour_type):
    channels = {_GRAY: 1, _GRAY_ALPHA: 2, _RGB: 3, _RGBA: 4}[colour_type]
    return np.stack([(_ALL16 * (7 * k + 1)) % 65536 for k in range(channels)], -1)


def _pillow(image, format="PNG", **options):
    buffer = io.BytesIO()
    image.save(buffer, format=format, **options)
    return buffer.getvalue()


# --- 16-bit gray: TensorFlow keeps the high byte; Pillow clipped it to white -------

def test_a_16_bit_gray_png_decodes_to_the_high_byte_of_its_samples():
    """Every 16-bit value: TensorFlow's decoder gives ``value >> 8`` (mean
    127.5); Pillow's ``convert`` clipped them to 255 (mean 254.5, white)."""
    expected = (_ALL16 >> 8).astype(np.uint8)
    for encoded in (_png(_ALL16[..., None], _GRAY, 16),
                    _png(_ALL16[..., None], _GRAY, 16, _chunk(b"tRNS", struct.pack(">H", 300))),
                    _png(_sixteen_bit(_GRAY_ALPHA), _GRAY_ALPHA, 16),
                    _pillow(Image.fromarray(_ALL16.astype(np.uint16)))):  # Pillow's I;16
        gray = decode_image(encoded, 1, "deep.png")
        assert gray.shape == (256, 256, 1) and gray.mean() == 127.5
        np.testing.assert_array_equal(gray[..., 0], expected)
        rgb = decode_image(encoded, 3, "deep.png")
        assert rgb.shape == (256, 256, 3)
        np.testing.assert_array_equal(rgb, np.repeat(expected[..., None], 3, -1))


def test_16_bit_colour_pngs_decode_to_the_high_byte_as_before():
    for colour_type in (_RGB, _RGBA):
        samples = _sixteen_bit(colour_type)
        rgb = decode_image(_png(samples, colour_type, 16), 3, "deep.png")
        np.testing.assert_array_equal(rgb, (samples[..., :3] >> 8).astype(np.uint8))


@pytest.mark.parametrize("decoder", ["default", "pillow"])
@pytest.mark.parametrize("name, channels", [("cifar10", 3), ("mnist", 1)])
def test_an_image_folder_of_16_bit_gray_pngs_reads_the_same_pixels_on_both_decoders(
        tmp_path, monkeypatch, decoder, name, channels):
    if decoder == "pillow":
        from keras_identity import _tensorflow

        monkeypatch.setattr(_tensorflow, "available", lambda: False)
    values = {"a": 0x1234, "b": 0xFF00}
    for split in ("train", "test"):
        for cls, value in values.items():
            os.makedirs(tmp_path / split / cls)
            (tmp_path / split / cls / "0.png").write_bytes(
                _png(np.full((4, 4, 1), value), _GRAY, 16))
    data = load_dataset(name, str(tmp_path))
    assert data.x_train.shape == (2, 4, 4, channels)
    for x, y in ((data.x_train, data.y_train), (data.x_test, data.y_test)):
        assert {data.class_names[label]: int(image.max()) for image, label in zip(x, y)} \
            == {"a": 0x12, "b": 0xFF}
        assert [int(image.min()) for image in x] == [int(image.max()) for image in x]


def _imagenet_of_16_bit_gray(root):
    """An ImageNet folder tree of 8x8 16-bit gray PNGs: class a 0x8040
    (high byte 128), class b 0x10FF (16); the tree's ``load_dataset``."""
    for split in ("train", "val"):
        for cls, value in (("a", 0x8040), ("b", 0x10FF)):
            os.makedirs(root / split / cls)
            (root / split / cls / "0.png").write_bytes(_png(np.full((8, 8, 1), value), _GRAY,
                                                           16))
    return load_dataset("imagenet", str(root))


def test_the_jax_route_streams_16_bit_gray_image_files_as_their_high_byte(tmp_path):
    """ImageNet folders are decoded by Pillow on the JAX route, TensorFlow
    installed or not: 128 and 16, where they were read as 255 (white)."""
    from keras_identity.data import Normalization
    from keras_identity.data import arrays

    data = _imagenet_of_16_bit_gray(tmp_path)
    test = arrays.EvalBatches(data, batch_size=2, normalization=Normalization("scale"),
                              eval_resize=8, eval_crop=8, raw_pixels=True)
    try:
        x, y = test[0]
    finally:
        test.close()
    assert x.shape == (2, 8, 8, 3) and y.tolist() == [0, 1]
    assert [np.unique(image).tolist() for image in x] == [[128.0], [16.0]]


@pytest.mark.needs_tensorflow
def test_the_tf_data_route_streams_the_same_pixels(tmp_path):
    from keras_identity.data import Normalization
    from keras_identity.data import arrays
    from keras_identity.data import eval_dataset

    data = _imagenet_of_16_bit_gray(tmp_path)
    norm = Normalization("scale")
    (theirs, labels), = [(x.numpy(), y.numpy()) for x, y in eval_dataset(
        data, batch_size=2, normalization=norm, eval_resize=8, eval_crop=8, raw_pixels=True)]
    test = arrays.EvalBatches(data, batch_size=2, normalization=norm, eval_resize=8,
                              eval_crop=8, raw_pixels=True)
    try:
        ours, our_labels = test[0]
    finally:
        test.close()
    assert labels.tolist() == our_labels.tolist() == [0, 1]
    np.testing.assert_array_equal(ours, theirs)
    assert [np.unique(image).tolist() for image in theirs] == [[128.0], [16.0]]


# --- colour to gray (1-channel datasets): libpng's conversion ------------------------

# (1, 1, 0), red, green, blue, (200, 100, 50), gray 90: what TensorFlow 2.21's
# decode_image(channels=1) gave, without and with the gamma of an sRGB chunk
# (Pillow's "L" gives [1, 76, 150, 29, 124, 90] for both).
_PIXELS = np.array([[[1, 1, 0], [255, 0, 0], [0, 255, 0], [0, 0, 255], [200, 100, 50],
                     [90, 90, 90]]])
_TENSORFLOW_GRAY = [0, 76, 149, 29, 124, 90]
_TENSORFLOW_GRAY_SRGB = [0, 147, 200, 95, 137, 90]


@pytest.mark.parametrize("chunks, expected", [
    (b"", _TENSORFLOW_GRAY), (_SRGB, _TENSORFLOW_GRAY_SRGB),
    (_gamma(45455), _TENSORFLOW_GRAY_SRGB), (_gamma(45455) + _SRGB, _TENSORFLOW_GRAY_SRGB),
    (_gamma(100000), _TENSORFLOW_GRAY)], ids=["plain", "sRGB", "gAMA", "gAMA+sRGB", "linear"])
def test_a_colour_png_is_converted_to_gray_as_tensorflow_converts_it(chunks, expected):
    for colour_type, samples in ((_RGB, _PIXELS), (_RGBA, np.concatenate(
            [_PIXELS, np.full(_PIXELS.shape[:2] + (1,), 128)], -1))):
        gray = decode_image(_png(samples, colour_type, 8, chunks), 1, "colour.png")
        assert gray[0, :, 0].tolist() == expected
    # A palette PNG: the same colours.
    palette = Image.new("P", (6, 1))
    palette.putdata(range(6))
    palette.putpalette(_PIXELS[0].ravel().tolist())
    encoded = _pillow(palette)
    if chunks:
        at = encoded.index(b"PLTE") - 4
        encoded = encoded[:at] + chunks + encoded[at:]
    assert decode_image(encoded, 1, "palette.png")[0, :, 0].tolist() == expected


@pytest.mark.parametrize("decoder", ["default", "pillow"])
@pytest.mark.parametrize("encoded, words", [
    (_png(_sixteen_bit(_RGB), _RGB, 16), "is a 16-bit RGB PNG (Pillow reads 8 of its bits)"),
    (_png(_PIXELS, _RGB, 8, _chunk(b"iCCP", b"p\x00\x00" + zlib.compress(b"x"))),
     "is an RGB PNG with an iCCP chunk"),
    (_png(_PIXELS, _RGB, 8, _gamma(50000) + _gamma(45455)),
     "is an RGB PNG with 2 gAMA and 0 sRGB chunks"),
], ids=["16-bit", "iCCP", "two-gAMA"])
def test_a_colour_png_whose_gray_is_not_reproduced_is_refused_on_both_decoders(
        tmp_path, monkeypatch, decoder, encoded, words):
    """A 1-channel dataset refuses it whichever decoder reads it (TensorFlow
    would decode it, Pillow's pixels cannot give the same gray); a 3-channel
    one reads it."""
    if decoder == "pillow":
        from keras_identity import _tensorflow

        monkeypatch.setattr(_tensorflow, "available", lambda: False)
    gray = _png(np.full((4, 6, 1), 9), _GRAY)
    for split in ("train", "test"):
        for cls in ("a", "b"):
            os.makedirs(tmp_path / split / cls)
            (tmp_path / split / cls / "0.png").write_bytes(gray)
    (tmp_path / "train" / "b" / "1.png").write_bytes(encoded)
    with pytest.raises(DataError) as error:
        load_dataset("mnist", str(tmp_path))
    message = str(error.value)
    assert "\n" not in message
    assert message.startswith(f"{tmp_path}: train/b/1.png {words}, which would not be "
                              f"converted to gray the same way on both routes")
    assert message.endswith("a 1-channel (grayscale) dataset reads grayscale images, or "
                            "colour PNGs of 8 bits per channel with at most one gAMA and "
                            "one sRGB chunk before PLTE and no iCCP or cICP chunk.")
    assert decode_image(encoded, 3, "colour.png").shape[-1] == 3


# --- the two decoders, pixel for pixel -------------------------------------------------

def _cases():
    rng = np.random.default_rng(0)
    cases = {}
    for colour_type, name in ((_GRAY, "gray"), (_GRAY_ALPHA, "gray+alpha"), (_RGB, "RGB"),
                              (_RGBA, "RGBA")):
        samples = _sixteen_bit(colour_type)
        cases[f"16-bit {name}"] = _png(samples, colour_type, 16)
        cases[f"16-bit {name}, gAMA"] = _png(samples, colour_type, 16, _gamma(45455))
        eight = rng.integers(0, 256, (32, 32, samples.shape[-1]))
        eight[:2, :2] = 77  # gray pixels of a colour image
        cases[f"8-bit {name}"] = _png(eight, colour_type)
        for gamma in (22000, 45455, 95000, 95100, 105100, 200000, 16, 625000000):
            cases[f"8-bit {name}, gAMA {gamma}"] = _png(eight, colour_type, 8, _gamma(gamma))
        cases[f"8-bit {name}, sRGB"] = _png(eight, colour_type, 8, _SRGB)
        cases[f"8-bit {name}, sRGB then gAMA 45000"] = _png(
            eight, colour_type, 8, _SRGB + _gamma(45000))
        cases[f"8-bit {name}, gAMA 50000 then sRGB"] = _png(
            eight, colour_type, 8, _gamma(50000) + _SRGB)
    cases["16-bit gray, tRNS"] = _png(_ALL16[..., None], _GRAY, 16,
                                      _chunk(b"tRNS", struct.pack(">H", 300)))
    cases["16-bit gray, sBIT 12"] = _png(_ALL16[..., None], _GRAY, 16, _chunk(b"sBIT", b"\x0c"))
    cases["8-bit RGB, tRNS"] = _png(rng.integers(0, 256, (32, 32, 3)), _RGB, 8,
                                    _chunk(b"tRNS", struct.pack(">HHH", 1, 3, 5)))
    colours = Image.fromarray(rng.integers(0, 256, (32, 32, 3), dtype=np.uint8))
    for mode in ("1", "L", "LA", "P", "RGB", "RGBA"):
        cases[f"Pillow's {mode}"] = _pillow(colours.convert(mode))
    cases["Pillow's I;16"] = _pillow(Image.fromarray(
        rng.integers(0, 65536, (32, 32)).astype(np.uint16)))
    for bits in (1, 2, 4):
        cases[f"{bits}-bit palette"] = _pillow(colours.quantize(2 ** bits), bits=bits)
    cases["palette, tRNS"] = _pillow(colours.quantize(16), transparency=3)
    palette = _pillow(colours.quantize(16))
    at = palette.index(b"PLTE") - 4
    cases["palette, gAMA"] = palette[:at] + _gamma(45455) + palette[at:]
    return cases


_CASES = _cases()


@pytest.mark.needs_tensorflow
@pytest.mark.parametrize("channels", [1, 3])
@pytest.mark.parametrize("case", sorted(_CASES))
def test_pillow_decodes_every_png_as_tensorflow_does(case, channels):
    """Bit-equal to ``tf.io.decode_image`` and ``decode_png(dtype=uint8)``,
    or, for a colour PNG read as gray whose conversion is not reproduced
    (16 bits), refused."""
    import tensorflow as tf

    encoded = _CASES[case]
    tensorflow = tf.io.decode_image(encoded, channels=channels, expand_animations=False)
    np.testing.assert_array_equal(
        tensorflow, tf.io.decode_png(encoded, channels=channels, dtype=tf.uint8))
    if channels == 1 and case in ("16-bit RGB", "16-bit RGB, gAMA", "16-bit RGBA",
                                  "16-bit RGBA, gAMA"):
        with pytest.raises(DataError, match="is a 16-bit RGBA? PNG"):
            decode_image(encoded, channels, case)
        return
    pillow = decode_image(encoded, channels, case)
    assert pillow.dtype == np.uint8 and pillow.shape == tuple(tensorflow.shape)
    np.testing.assert_array_equal(pillow, tensorflow.numpy())


def test_jpeg_gif_and_bmp_decode_as_pillow_converts_them():
    """Unchanged by the PNG rules: Pillow's own ``L``/``RGB`` conversion."""
    rng = np.random.default_rng(1)
    image = Image.fromarray(rng.integers(0, 256, (16, 16, 3), dtype=np.uint8))
    for format, modes in (("JPEG", ("L", "RGB")), ("GIF", ("L", "P")),
                          ("BMP", ("1", "L", "P", "RGB"))):
        for mode in modes:
            encoded = _pillow(image.convert(mode), format)
            for channels, target in ((1, "L"), (3, "RGB")):
                expected = np.asarray(Image.open(io.BytesIO(encoded)).convert(target))
                decoded = decode_image(encoded, channels, f"x.{format.lower()}")
                np.testing.assert_array_equal(decoded.reshape(expected.shape), expected)

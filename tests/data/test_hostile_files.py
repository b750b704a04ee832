"""Files that would stop a run with a traceback, or train it on the wrong data,
are refused in one line naming them: links that loop or point nowhere, test
classes without training images, images that do not decode (in memory, in
the tf.data file pipeline, in the JAX route's threads and worker processes), headers
that declare more pixels than are read, arrays of the wrong kind, images
outside ``<split>/<class>/<image>`` (class folders that are links to
folders are read).  PNG pixels: tests/data/test_png_pixels.py."""

import io
import os
import struct
import tarfile
import warnings
import zlib

import numpy as np
import pytest
from PIL import Image

from keras_identity.data import DataError
from keras_identity.data import Normalization
from keras_identity.data import arrays
from keras_identity.data import image_headers
from keras_identity.data import load_dataset
from keras_identity.data.decoding import decode_image
from keras_identity.data.errors import as_data_error
from tests.backend import jax_route


def _encode(value, size=(8, 8), format="JPEG"):
    buffer = io.BytesIO()
    Image.fromarray(np.full(size + (3,), value, np.uint8)).save(buffer, format=format)
    return buffer.getvalue()


def _png_claiming(width, height):
    """A PNG of a few dozen bytes whose IHDR declares ``width`` x ``height``
    pixels (its image data is not all there: nothing is allocated)."""
    def chunk(kind, data):
        return (struct.pack(">I", len(data)) + kind + data
                + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF))

    ihdr = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr)
            + chunk(b"IDAT", zlib.compress(b"\x00" * 64)) + chunk(b"IEND", b""))


def _gif_hiding_a_frame():
    """A GIF whose 2x2 screen hides a 20000x20000 frame (TensorFlow decodes
    to the frame); a few dozen bytes."""
    screen = b"GIF89a" + struct.pack("<HHBBB", 2, 2, 0, 0, 0)
    frame = b"\x2c" + struct.pack("<HHHHB", 0, 0, 20000, 20000, 0) + b"\x02\x01\x44\x00"
    return screen + b"\x21\xf9\x04\x00\x00\x00\x00\x00" + frame + b"\x3b"


def _tree(root, classes=None, per_class=2, format="JPEG"):
    """An image-folder tree of constant 8x8 images (``classes``: the class
    folders of each split; two classes by default); returns ``root``."""
    classes = classes or {"train": ("a", "b"), "val": ("a", "b")}
    extension = {"JPEG": "jpg", "PNG": "png"}[format]
    for split, names in classes.items():
        for c, name in enumerate(names):
            folder = os.path.join(root, split, name)
            os.makedirs(folder, exist_ok=True)
            for i in range(per_class):
                with open(os.path.join(folder, f"{i}.{extension}"), "wb") as f:
                    f.write(_encode(40 * c + 10 * i, format=format))
    return str(root)


def _one_line(error):
    message = str(error.value)
    assert "\n" not in message and "Traceback" not in message
    return message


def _symlink(target, link):
    try:
        os.symlink(target, link)
    except (OSError, NotImplementedError):
        pytest.skip("this file system has no symbolic links")


# --- 1, 2: links that loop or point nowhere, refused when the folder is listed --

@pytest.mark.parametrize("name", ["imagenet", "cifar10"])
@pytest.mark.parametrize("link, target, words", [
    ("loop.jpg", "loop.jpg", "train/a/loop.jpg is a symbolic link that loops"),
    ("x.jpg", "/nonexistent/x.jpg", "train/a/x.jpg is a symbolic link to /nonexistent/x.jpg, "
                                    "which does not exist"),
], ids=["loop", "dangling"])
def test_links_that_loop_or_point_nowhere_are_refused_naming_them(tmp_path, name, link,
                                                                  target, words):
    root = _tree(tmp_path / "tree", format="PNG")
    _symlink(target, os.path.join(root, "train", "a", link))
    with pytest.raises(DataError) as error:
        load_dataset(name, root)
    message = _one_line(error)
    assert words in message and "links to existing image files" in message


def test_a_link_to_an_image_is_read_and_a_dangling_file_elsewhere_does_not_matter(tmp_path):
    root = _tree(tmp_path / "tree", format="PNG")
    _symlink(os.path.join(root, "train", "a", "0.png"), os.path.join(root, "train", "a",
                                                                      "link.png"))
    _symlink("/nonexistent/notes.txt", os.path.join(root, "notes.txt"))
    data = load_dataset("cifar10", root)
    assert data.num_train == 5 and data.fingerprint.startswith("tree-sha256:")


# --- 3: a class with test images and no training images -------------------------

@pytest.mark.parametrize("name, archive", [("imagenet", False), ("cifar10", False),
                                           ("cifar10", True)],
                         ids=["imagenet-folder", "cifar10-folder", "cifar10-archive"])
def test_a_test_class_without_training_images_is_refused_naming_its_folder(
        tmp_path, name, archive):
    root = _tree(tmp_path / "tree", classes={"train": ("a", "b"), "val": ("a", "b", "c")},
                 format="PNG")
    os.makedirs(os.path.join(root, "train", "c"))  # an empty folder has no images either
    source = root
    if archive:
        source = str(tmp_path / "tree.tar.gz")
        with tarfile.open(source, "w:gz") as tar:
            tar.add(root, arcname="tree")
    with pytest.raises(DataError) as error:
        load_dataset(name, source)
    message = _one_line(error)
    assert "test class folder" in message and "val/c/ has no training images" in message
    assert "every test class needs training images" in message
    # A class with training images only is fine.
    _tree(tmp_path / "ok", classes={"train": ("a", "b", "c"), "val": ("a", "b")}, format="PNG")
    assert load_dataset(name, str(tmp_path / "ok")).num_classes == 3


# --- 4: an image that does not decode, in the pipelines that decode during training --

def _imagenet_with(tmp_path, split, bad_name, content):
    root = _tree(tmp_path / "tree")
    path = os.path.join(root, split, "b", bad_name)
    with open(path, "wb") as f:
        f.write(content)
    return load_dataset("imagenet", root), path


def _truncated_jpeg():
    """The first half of an 8x8 JPEG of noise: its header is whole, its scan is not."""
    buffer = io.BytesIO()
    noise = np.random.default_rng(0).integers(0, 256, (8, 8, 3), dtype=np.uint8)
    Image.fromarray(noise).save(buffer, format="JPEG", quality=100)
    jpeg = buffer.getvalue()
    assert image_headers.declared_size(jpeg[:len(jpeg) // 2]) == (8, 8)
    return jpeg[:len(jpeg) // 2]


@pytest.mark.needs_tensorflow
@pytest.mark.parametrize("content, words", [
    (_truncated_jpeg(), "is not a readable image"),
    (_png_claiming(20000, 20000), "its header declares 20000x20000 pixels; images of at most "
                                  "89,478,485 pixels are read"),
    (_encode(7, format="WEBP"), "no JPEG, PNG, GIF or BMP header"),
    (_gif_hiding_a_frame(), "its header declares 20000x20000 pixels"),
], ids=["truncated", "bomb", "webp", "gif_frame"])
def test_tf_data_names_the_file_that_does_not_decode(tmp_path, content, words):
    import tensorflow as tf

    from keras_identity.data import eval_dataset
    from keras_identity.data import train_dataset

    norm = Normalization("scale")
    for split, make in (("train", lambda data: train_dataset(
            data, batch_size=2, normalization=norm, raw_pixels=True).take(6)),
            ("val", lambda data: eval_dataset(data, batch_size=2, normalization=norm,
                                              eval_resize=8, eval_crop=8))):
        # "9.jpg" comes last in its split: a finite stream checks after its last file too.
        data, path = _imagenet_with(tmp_path / split, split, "9.jpg", content)
        with pytest.raises(tf.errors.InvalidArgumentError) as error:
            for _ in make(data):
                pass
        message = str(as_data_error(error.value))
        assert message.startswith(f"{path} ") or message.startswith(f"{path}:")
        assert words in message and "\n" not in message


@pytest.mark.needs_tensorflow
def test_tf_data_streams_are_unchanged_by_the_checks(tmp_path):
    from keras_identity.data import eval_dataset
    from keras_identity.data import train_dataset

    data = load_dataset("imagenet", _tree(tmp_path / "tree", per_class=3))
    norm = Normalization("scale")
    train = [y.numpy().tolist() for _, y in train_dataset(
        data, batch_size=4, normalization=norm, raw_pixels=True).take(3)]
    resumed = [y.numpy().tolist() for _, y in train_dataset(
        data, batch_size=4, normalization=norm, raw_pixels=True, start_step=1).take(2)]
    assert resumed == train[1:] and sorted(sum(train[:3], [])[:6]) == [0, 0, 0, 1, 1, 1]
    test = list(eval_dataset(data, batch_size=4, normalization=norm, eval_resize=8,
                             eval_crop=8))
    assert [len(y) for _, y in test] == [4, 2]
    assert np.concatenate([y for _, y in test]).tolist() == [0, 0, 0, 1, 1, 1]


@pytest.mark.parametrize("workers", [0, pytest.param(2, marks=jax_route)],
                         ids=["threads", "grain_workers"])
def test_the_jax_route_names_the_file_from_its_threads_or_worker_processes(tmp_path,
                                                                           workers):
    if workers:
        pytest.importorskip("grain")
    data, path = _imagenet_with(tmp_path, "train", "9.jpg", _truncated_jpeg())
    train = arrays.TrainBatches(data, batch_size=2, normalization=Normalization("scale"),
                                raw_pixels=True, worker_processes=workers)
    try:
        with pytest.raises(DataError) as error:
            for step in range(6):  # the bad file is in one of the first three batches
                train[step]
        message = _one_line(error)
        assert message.startswith(f"{path} is not a readable image")
        assert as_data_error(error.value) is error.value
    finally:
        train.close()
    data, path = _imagenet_with(tmp_path / "val", "val", "9.jpg", _truncated_jpeg())
    test = arrays.EvalBatches(data, batch_size=2, normalization=Normalization("scale"),
                              eval_resize=8, eval_crop=8, worker_processes=workers)
    try:
        with pytest.raises(DataError, match=f"{path} is not a readable image"):
            for number in range(test.num_batches):
                test[number]
    finally:
        test.close()


def test_fit_stops_with_the_data_error_naming_the_file(tmp_path):
    """What the trainer sees: ``fit`` on the backend's own training stream."""
    import keras

    data, path = _imagenet_with(tmp_path, "train", "9.jpg", _truncated_jpeg())
    norm = Normalization("scale")
    if keras.backend.backend() == "tensorflow":
        from keras_identity.data import train_dataset

        stream = train_dataset(data, batch_size=2, normalization=norm, raw_pixels=True)
    else:
        stream = arrays.TrainBatches(data, batch_size=2, normalization=norm, raw_pixels=True)
    model = keras.Sequential([keras.Input((8, 8, 3)), keras.layers.Flatten(),
                              keras.layers.Dense(2)])
    model.compile("sgd", keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    try:
        with pytest.raises(Exception) as error:
            model.fit(stream, epochs=1, steps_per_epoch=6, shuffle=False, verbose=0)
    finally:
        if hasattr(stream, "close"):
            stream.close()
    found = as_data_error(error.value)
    assert found is not None, f"{type(error.value).__name__}: {error.value}"
    assert str(found).startswith(f"{path} is not a readable image")
    assert "\n" not in str(found)


# --- 5: a header that declares more pixels than are read ------------------------

def test_headers_are_read_as_serving_reads_them():
    bmp = io.BytesIO()
    Image.fromarray(np.zeros((12, 20, 3), np.uint8)).save(bmp, format="BMP")
    gif = io.BytesIO()
    Image.fromarray(np.zeros((12, 20, 3), np.uint8)).save(gif, format="GIF")
    progressive = io.BytesIO()
    Image.fromarray(np.zeros((12, 20, 3), np.uint8)).save(progressive, format="JPEG",
                                                          progressive=True)
    for encoded in (_encode(0, (12, 20)), _encode(0, (12, 20), "PNG"), bmp.getvalue(),
                    gif.getvalue(), progressive.getvalue()):
        assert image_headers.declared_size(encoded) == (12, 20)
    assert image_headers.declared_size(_png_claiming(20000, 10)) == (10, 20000)
    for broken in (b"not an image, long enough", b"\xff\xd8\xff", _encode(0)[:20]):
        assert image_headers.declared_size(broken) is None


@pytest.mark.needs_tensorflow
def test_the_tensorflow_header_reader_agrees():
    import tensorflow as tf

    for encoded in (_encode(0, (12, 20)), _encode(0, (12, 20), "PNG"),
                    _png_claiming(20000, 10)):
        size = image_headers.tf_declared_size(tf.constant(encoded)).numpy().tolist()
        assert tuple(size) == image_headers.declared_size(encoded)
    assert int(image_headers.tf_declared_pixels(tf.constant(b"not an image, long enough"))) \
        == -1


@pytest.mark.parametrize("decoder", ["default", "pillow"])
def test_an_in_memory_dataset_refuses_a_decompression_bomb_before_decoding(
        tmp_path, monkeypatch, decoder):
    if decoder == "pillow":
        from keras_identity import _tensorflow

        monkeypatch.setattr(_tensorflow, "available", lambda: False)
    root = _tree(tmp_path / "tree", format="PNG")
    with open(os.path.join(root, "train", "b", "bomb.png"), "wb") as f:
        f.write(_png_claiming(20000, 20000))
    with pytest.raises(DataError) as error:
        load_dataset("cifar10", root)
    message = _one_line(error)
    assert "train/b/bomb.png: its header declares 20000x20000 pixels" in message
    assert "at most 89,478,485 pixels" in message


def test_pillow_refuses_a_decompression_bomb_before_decoding():
    with pytest.raises(DataError, match="bomb.png: its header declares 20000x20000 pixels"):
        decode_image(_png_claiming(20000, 20000), 3, "bomb.png")
    # A format whose header only Pillow reads (TIFF): the size Pillow reads.
    tiff = io.BytesIO()
    Image.new("L", (1, 1)).save(tiff, format="TIFF")
    with warnings.catch_warnings():  # Pillow's own DecompressionBombWarning, from this size
        warnings.simplefilter("ignore")
        with pytest.raises(DataError, match="big.tif: its header declares 9460x9460 pixels"):
            _decode_claiming(tiff.getvalue(), 9460)


def _decode_claiming(tiff, side):
    """``decode_image`` of a one-pixel TIFF whose header is edited to declare
    ``side`` x ``side`` pixels."""
    patched = bytearray(tiff)
    offset = struct.unpack("<I", tiff[4:8])[0]
    for entry in range(struct.unpack("<H", tiff[offset:offset + 2])[0]):
        at = offset + 2 + 12 * entry
        tag, kind = struct.unpack("<HH", tiff[at:at + 4])
        if tag in (256, 257):  # ImageWidth, ImageLength
            patched[at + 8:at + 12] = (struct.pack("<HH", side, 0) if kind == 3
                                       else struct.pack("<I", side))
    return decode_image(bytes(patched), 3, "big.tif")


# --- 6: arrays of the wrong kind --------------------------------------------------

def test_a_boolean_npz_is_refused_saying_what_it_is(tmp_path):
    path = str(tmp_path / "masks.npz")
    np.savez(path, x_train=np.ones((64, 28, 28), bool), y_train=np.zeros(64, np.int64),
             x_test=np.zeros((2, 28, 28), np.uint8), y_test=np.zeros(2, np.int64))
    with pytest.raises(DataError) as error:
        load_dataset("mnist", path)
    message = _one_line(error)
    assert message == (f"{path}: x_train has dtype bool; expected uint8 images, or float "
                       f"images in [0, 1] or [0, 255].")


def test_a_gif_frame_larger_than_its_screen_is_bounded_by_the_frame():
    """TensorFlow decodes a GIF to its frames' extent: a 2x2 screen hiding a
    20000x20000 frame is measured by the frame."""
    crafted = _gif_hiding_a_frame()
    assert image_headers.declared_size(crafted) == (20000, 20000)
    assert image_headers.declared_size(_encode(9, size=(30, 40), format="GIF")) == (30, 40)
    with pytest.raises(DataError, match="its header declares 20000x20000 pixels"):
        decode_image(crafted, 3, "bomb.gif")


# --- 7: images outside <split>/<class>/<image>; class folders that are links -------

_LAYOUT = ("an image-folder tree holds its images as <split>/<class>/<image> (train/<class>/ "
           "and test/<class>/, val/<class>/ or validation/<class>/).")


@pytest.mark.parametrize("archive", [False, True], ids=["folder", "archive"])
@pytest.mark.parametrize("name", ["imagenet", "cifar10"])
@pytest.mark.parametrize("image, where", [
    ("train/a/sub/x.png", "is in a subfolder of the class folder train/a/"),
    ("train/a/sub/deeper/x.png", "is in a subfolder of the class folder train/a/"),
    ("train/a/train/b/x.png", "is in a subfolder of the class folder train/a/"),
    ("train/x.png", "is directly under train/, outside any class folder"),
    ("val/x.png", "is directly under val/, outside any class folder"),
], ids=["nested", "deeper", "nested-tree", "in-train", "in-val"])
def test_an_image_outside_a_class_folder_is_refused_naming_it(tmp_path, name, archive, image,
                                                              where):
    """It was left out silently (and ``train/a/train/b/x.png`` read as class b)."""
    root = _tree(tmp_path / "tree", format="PNG")
    os.makedirs(os.path.dirname(os.path.join(root, image)), exist_ok=True)
    with open(os.path.join(root, image), "wb") as f:
        f.write(_encode(3, format="PNG"))
    source, named = root, image
    if archive:
        source, named = str(tmp_path / "tree.tar.gz"), f"tree/{image}"
        with tarfile.open(source, "w:gz") as tar:
            tar.add(root, arcname="tree")
    with pytest.raises(DataError) as error:
        load_dataset(name, source)
    assert _one_line(error) == f"{source}: {named} {where}; {_LAYOUT}"


def test_other_files_and_folders_beside_the_splits_are_not_read(tmp_path):
    root = _tree(tmp_path / "tree", format="PNG")
    for extra in ("preview.png", "docs/x.png", "train/README.txt", "train/a/notes/n.txt"):
        os.makedirs(os.path.dirname(os.path.join(root, extra)), exist_ok=True)
        with open(os.path.join(root, extra), "wb") as f:
            f.write(_encode(3, format="PNG"))
    data = load_dataset("cifar10", root)
    assert data.num_train == 4 and data.num_test == 4 and data.class_names == ["a", "b"]


def _tree_with_a_linked_class(tmp_path):
    """A folder tree whose train/b is a link to a class folder elsewhere (3
    images; train/a has 2): ``(root, elsewhere)``."""
    root = _tree(tmp_path / "tree", classes={"train": ("a",), "val": ("a", "b")},
                 format="PNG")
    elsewhere = _tree(tmp_path / "elsewhere", classes={"train": ("b",)}, per_class=3,
                      format="PNG")
    _symlink(os.path.join(elsewhere, "train", "b"), os.path.join(root, "train", "b"))
    return root, elsewhere


def test_a_class_folder_that_links_to_a_folder_is_followed(tmp_path):
    """As Keras's ``image_dataset_from_directory`` follows it; the listing
    (shared by both routes) once left it out, reporting ``num_classes=1``."""
    root, elsewhere = _tree_with_a_linked_class(tmp_path)
    before = load_dataset("imagenet", root)
    assert before.num_classes == 2 and before.class_names == ["a", "b"]
    assert before.files_train[1].tolist() == [0, 0, 1, 1, 1]
    assert before.files_train[0][2] == os.path.join(root, "train", "b", "0.png")
    data = load_dataset("cifar10", root)
    assert data.num_classes == 2 and sorted(data.y_train.tolist()) == [0, 0, 1, 1, 1]
    # The run's identity covers the linked images: a changed one changes it.
    os.utime(os.path.join(elsewhere, "train", "b", "2.png"), ns=(1, 1))
    assert load_dataset("imagenet", root).fingerprint != before.fingerprint
    # The JAX route reads the listed files (the tf.data route: the next test).
    test = arrays.EvalBatches(before, batch_size=4, normalization=Normalization("scale"),
                              eval_resize=8, eval_crop=8, raw_pixels=True)
    try:
        assert np.concatenate([test[i][1] for i in range(test.num_batches)]).tolist() \
            == [0, 0, 1, 1]
    finally:
        test.close()


@pytest.mark.needs_tensorflow
def test_the_tf_data_route_reads_a_linked_class_folder(tmp_path):
    from keras_identity.data import train_dataset

    root, _ = _tree_with_a_linked_class(tmp_path)
    data = load_dataset("imagenet", root)
    labels = [y.numpy().tolist() for _, y in train_dataset(
        data, batch_size=5, normalization=Normalization("scale"), raw_pixels=True).take(1)]
    assert sorted(labels[0]) == [0, 0, 1, 1, 1]


@pytest.mark.parametrize("target, words", [
    ("b", "train/b is a symbolic link that loops"),
    ("/nonexistent/b", "train/b is a symbolic link to /nonexistent/b, which does not exist"),
], ids=["loop", "dangling"])
def test_a_class_link_that_loops_or_points_nowhere_is_refused(tmp_path, target, words):
    root = _tree(tmp_path / "tree", classes={"train": ("a",), "val": ("a",)}, format="PNG")
    _symlink(target, os.path.join(root, "train", "b"))
    with pytest.raises(DataError) as error:
        load_dataset("cifar10", root)
    assert _one_line(error) == (f"{root}: {words}; a split folder holds class folders, or "
                                f"links to existing folders.")


def _small_tree(root, extra=None):
    """An image-folder tree of 8x8 RGB JPEGs (2 classes, 2 train and 1 test
    image each) and ``extra``: ``{relative name: bytes}``."""
    rng = np.random.default_rng(0)
    for split, count in (("train", 2), ("test", 1)):
        for cls in ("cat", "dog"):
            os.makedirs(root / split / cls, exist_ok=True)
            for i in range(count):
                Image.fromarray(rng.integers(0, 256, (8, 8, 3), dtype=np.uint8)).save(
                    root / split / cls / f"{i}.jpg")
    for name, content in (extra or {}).items():
        (root / name).write_bytes(content)
    return root


@pytest.mark.parametrize("content", [b"", b"\xff\xd8\xff\xe0garbage" * 10],
                         ids=["empty", "corrupt"])
def test_an_empty_or_corrupt_file_is_one_line_naming_it_on_either_route(tmp_path, content):
    # In memory (a CIFAR-sized folder: TensorFlow's decoder, or Pillow's where
    # TensorFlow is not installed) and file by file (Pillow's, the JAX
    # route's threads and workers): the same line, not Pillow's
    # "cannot identify image file <_io.BytesIO object at 0x...>".
    root = _small_tree(tmp_path / "tree", {"train/cat/bad.jpg": content})
    with pytest.raises(DataError) as error:
        load_dataset("cifar10", str(root))
    assert str(error.value) == (f"{root}: train/cat/bad.jpg is not a readable image (no JPEG, "
                                f"PNG, GIF or BMP header); expected a complete JPEG, PNG, GIF "
                                f"or BMP file.")
    with pytest.raises(DataError) as error:
        decode_image(content, 3, name="bad.jpg")
    assert str(error.value) == ("bad.jpg is not a readable image (no JPEG, PNG, GIF or BMP "
                                "header); expected a complete JPEG, PNG, GIF or BMP file.")


def test_a_truncated_archive_is_one_line(tmp_path):
    tree = _small_tree(tmp_path / "tree")
    archive = tmp_path / "cifar.tar.gz"
    with tarfile.open(archive, "w:gz") as tar:
        tar.add(tree, arcname="cifar")
    data = archive.read_bytes()
    archive.write_bytes(data[:len(data) // 2])
    with pytest.raises(DataError) as error:
        load_dataset("cifar10", str(archive))
    assert str(error.value) == (f"cannot read the archive {archive} (EOFError: Compressed file "
                                f"ended before the end-of-stream marker was reached); is it "
                                f"complete?")


def test_a_16_bit_png_and_a_grayscale_image_are_converted_and_said_so(tmp_path):
    # Among 8-bit RGB JPEGs: a 16-bit grayscale PNG (its high byte, made RGB)
    # and an 8-bit grayscale PNG (made RGB), on either decoder; the dataset's
    # description (the run's "data ... from" line) says so, its fingerprint
    # (the run's identity) is the folder's as before.
    deep = np.arange(64, dtype=np.uint16).reshape(8, 8) * 1000 + 7
    gray = np.arange(64, dtype=np.uint8).reshape(8, 8) * 3
    buffers = []
    for array in (deep, gray):
        buffer = io.BytesIO()
        Image.fromarray(array).save(buffer, format="PNG")
        buffers.append(buffer.getvalue())
    assert [image_headers.declared_layout(b) for b in buffers] == [(1, 16), (1, 8)]
    root = _small_tree(tmp_path / "tree", {"train/cat/deep.png": buffers[0],
                                           "train/dog/gray.png": buffers[1]})
    data = load_dataset("cifar10", str(root))
    assert data.source == (f"{root} (converted: 1 16-bit PNG reduced to 8 bits (the high "
                           f"byte): train/cat/deep.png; 2 grayscale images made RGB: "
                           f"train/cat/deep.png, train/dog/gray.png)")
    assert "converted" not in data.fingerprint
    names = sorted(os.listdir(root / "train" / "cat")) + sorted(os.listdir(root / "train" / "dog"))
    pixels = dict(zip(names, data.x_train))
    np.testing.assert_array_equal(pixels["deep.png"], np.repeat((deep >> 8)[..., None], 3, -1))
    np.testing.assert_array_equal(pixels["gray.png"], np.repeat(gray[..., None], 3, -1))

"""Where the images come from: tensorflow_datasets, or offline files.

``load_dataset("cifar10")`` uses tensorflow_datasets (Colab, or any machine
with internet or a prepared ``~/tensorflow_datasets``).  Offline,
``data_dir`` may be

* a ``.npz`` file with ``x_train, y_train, x_test, y_test`` (e.g. MNIST);
* an image-folder tree ``train/<class>/*.jpg``, ``test/<class>/*.jpg``
  (``val/`` or ``validation/`` also accepted for the test split), or a
  ``.tar.gz`` / ``.tgz`` / ``.tar`` archive of one.  A class folder may be
  a symbolic link to a folder; an image elsewhere in a split folder
  (directly under it, or in a subfolder of a class folder) is refused
  naming it, as it would be left out;
* a folder holding one of those whose name starts with the dataset's name
  (``--data_dir=../shared/data`` finds ``cifar10-jpg.tar.gz``);
* a tensorflow_datasets data directory (ImageNet: with the manual download
  in ``<data_dir>/downloads/manual``).

MNIST ships with the package (``keras_identity/data/mnist.npz``), so the
default first run needs no network.  Small datasets (MNIST, CIFAR) are held
in memory as uint8 arrays; ImageNet image folders are read file by file.
Image files are decoded by TensorFlow where it is installed (in-memory
datasets, the tf.data route) and by Pillow elsewhere (and on the JAX
route's file streams), to the same pixels for PNGs
(:mod:`~keras_identity.data.png_pixels`: 16-bit images to their high byte).
"""

import dataclasses
import errno
import hashlib
import os
import stat
import tarfile
import zlib

import numpy as np

from keras_identity.data import image_headers
from keras_identity.data import png_pixels
from keras_identity.data.facts import DATASETS  # noqa: F401  (re-exported)
from keras_identity.data.facts import IMAGE_SHAPES
from keras_identity.data.facts import NUM_CLASSES
BUILTIN_MNIST = os.path.join(os.path.dirname(os.path.abspath(__file__)), "mnist.npz")
_IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".png", ".bmp", ".gif")
_TEST_SPLIT_NAMES = ("test", "val", "validation")
# What an image file that does not decode should be (the end of its refusal).
EXPECTED_IMAGE = "expected a complete JPEG, PNG, GIF or BMP file"
# The refusal of a file (after its name) with no header of those formats.
NO_IMAGE_HEADER = f" is not a readable image (no JPEG, PNG, GIF or BMP header); {EXPECTED_IMAGE}."
# What an image folder may hold (the end of the refusal of anything else).
FOLDER_FILES = "an image folder holds image files, or links to existing image files."
# Where an image-folder tree holds its images (the end of the refusal of one elsewhere).
LAYOUT = ("an image-folder tree holds its images as <split>/<class>/<image> (train/<class>/ "
          "and test/<class>/, val/<class>/ or validation/<class>/).")
# What a split folder may hold (the end of the refusal of a link that leads nowhere).
SPLIT_FOLDERS = "a split folder holds class folders, or links to existing folders."


class DataError(ValueError):
    """A data source could not be found or read; the message says what to do."""


@dataclasses.dataclass
class ImageDataset:
    """Images and labels of one dataset.

    In-memory datasets hold uint8 arrays ``x_*`` of shape ``(n, h, w, c)``
    and int32 labels ``y_*``.  File-based datasets (ImageNet folders) hold
    ``files_*`` (paths) instead, and tfds-streamed ones ``tfds_*``.
    ``x_val``/``y_val`` are set by :meth:`with_validation_split`.
    """

    name: str
    num_classes: int
    class_names: list
    image_shape: tuple
    source: str
    x_train: np.ndarray = None
    y_train: np.ndarray = None
    x_test: np.ndarray = None
    y_test: np.ndarray = None
    x_val: np.ndarray = None
    y_val: np.ndarray = None
    files_train: list = None
    files_test: list = None
    tfds_train: object = None
    tfds_test: object = None
    # What the data came from, for a run's identity (see :func:`fingerprint`).
    fingerprint: str = None

    @property
    def in_memory(self):
        return self.x_train is not None

    @property
    def num_train(self):
        if self.x_train is not None:
            return len(self.x_train)
        if self.files_train is not None:
            return len(self.files_train[0])
        return self.tfds_train[1]

    @property
    def num_test(self):
        if self.x_test is not None:
            return len(self.x_test)
        if self.files_test is not None:
            return len(self.files_test[0])
        return self.tfds_test[1]

    def with_validation_split(self, fraction, seed=0):
        """Carves a validation set out of the training images (stratified).

        The test images are dropped, so a hyper-parameter search built on the
        result can never see them.
        """
        if not self.in_memory:
            raise DataError("a validation split needs an in-memory dataset (MNIST, CIFAR).")
        if not 0.0 < fraction < 1.0:
            raise ValueError(f"validation_split={fraction!r} is not valid; expected a "
                             f"number in (0, 1).")
        rng = np.random.default_rng(seed)
        val_index = []
        for label in np.unique(self.y_train):
            members = np.flatnonzero(self.y_train == label)
            take = max(1, int(round(fraction * len(members))))
            val_index.append(rng.choice(members, take, replace=False))
        val_index = np.sort(np.concatenate(val_index))
        keep = np.ones(len(self.y_train), bool)
        keep[val_index] = False
        return dataclasses.replace(
            self, x_train=self.x_train[keep], y_train=self.y_train[keep],
            x_val=self.x_train[val_index], y_val=self.y_train[val_index],
            x_test=None, y_test=None, source=f"{self.source}, validation split {fraction}")

    def subset(self, num_train=None, num_test=None, seed=0):
        """A class-balanced random subset (for quick runs and tests)."""
        rng = np.random.default_rng(seed)

        def pick(x, y, n):
            if x is None or n is None or n >= len(y):
                return x, y
            index = np.sort(rng.choice(len(y), n, replace=False))
            return x[index], y[index]

        x_train, y_train = pick(self.x_train, self.y_train, num_train)
        x_test, y_test = pick(self.x_test, self.y_test, num_test)
        return dataclasses.replace(self, x_train=x_train, y_train=y_train, x_test=x_test,
                                   y_test=y_test)


def _expand_gray(x):
    return x[..., None] if x.ndim == 3 else x


def _read_npz(path):
    """The four arrays of a ``.npz`` file; any read error names the file.
    Nothing is unpickled: a file that is not a zip archive of arrays, or
    holds object arrays, is refused."""
    import zipfile

    if os.path.isfile(path) and not zipfile.is_zipfile(path):
        raise DataError(f"cannot read {path}: not a valid .npz file (not a complete zip "
                        f"archive of arrays); expected x_train, y_train, x_test, y_test saved "
                        f"with numpy.savez.")
    try:
        with np.load(path, allow_pickle=False) as data:
            missing = {"x_train", "y_train", "x_test", "y_test"} - set(data.files)
            if missing:
                raise DataError(f"{path} lacks the arrays {sorted(missing)}; expected "
                                f"x_train, y_train, x_test, y_test.")
            return {k: data[k] for k in ("x_train", "y_train", "x_test", "y_test")}
    except DataError:
        raise
    except ValueError as error:
        if "allow_pickle" in str(error):  # numpy's hint to unpickle: never taken here
            raise DataError(f"cannot read {path}: it holds object (pickled) arrays, which are "
                            f"never loaded; expected numeric arrays x_train, y_train, x_test, "
                            f"y_test.") \
                from None
        raise DataError(f"cannot read {path}: ValueError: {_first_line(error)}") from None
    except Exception as error:  # zipfile.BadZipFile, EOFError, OSError, ...
        raise DataError(f"cannot read {path}: {type(error).__name__}: "
                        f"{_first_line(error)}") from None


# tf.data cannot raise a DataError: the error it raises for an image file it
# cannot read (keras_identity.data.pipeline) carries one's message between these.
TF_MESSAGE_START, TF_MESSAGE_END = "<DataError>", "</DataError>"


def as_data_error(error):
    """The :class:`DataError` that ``error``, raised while a model trains or
    is evaluated, reports: ``error`` itself, or the one that a tf.data
    pipeline raised inside TensorFlow (an ``InvalidArgumentError``) for an
    image file it cannot read, naming it; ``None`` for any other error."""
    if isinstance(error, DataError):
        return error
    text = str(error)
    start, end = text.find(TF_MESSAGE_START), text.find(TF_MESSAGE_END)
    if start < 0 or end < start:
        return None
    return DataError(text[start + len(TF_MESSAGE_START):end])


def read_file(path):
    """The bytes of the image file ``path``; :class:`DataError` naming it if
    it cannot be read (removed, or unreadable, since it was listed)."""
    try:
        with open(path, "rb") as f:
            return f.read()
    except OSError as error:
        raise DataError(f"cannot read the image {path} ({error.strerror or error}); "
                        f"{FOLDER_FILES}") from None


def _first_line(error):
    text = str(error).strip()
    return text.splitlines()[0][:200] if text else "no details"


def _as_images(path, key, array, notes):
    """``array`` as uint8 images: uint8 as it is; float in [0, 1] or [0, 255]
    converted (and noted); anything else refused naming the file and array."""
    if array.ndim not in (3, 4):
        raise DataError(f"{path}: {key} has shape {array.shape}; expected images "
                        f"(n, height, width) or (n, height, width, channels).")
    if array.dtype == np.uint8:
        return _expand_gray(array)
    expected = "expected uint8 images, or float images in [0, 1] or [0, 255]"
    if not (np.issubdtype(array.dtype, np.integer) or np.issubdtype(array.dtype, np.floating)):
        # bool (a mask saved by mistake?), complex, strings, ...: never converted
        raise DataError(f"{path}: {key} has dtype {array.dtype}; {expected}.")
    low = high = None
    if array.size:
        low, high = float(np.min(array)), float(np.max(array))
    if np.issubdtype(array.dtype, np.floating) and low is not None and np.isfinite(
            [low, high]).all() and low >= 0.0 and high <= 255.0:
        scale = 255.0 if high <= 1.0 else 1.0
        notes.append(f"{key}: float in [0, {1 if scale == 255.0 else 255}], "
                     f"{'scaled by 255 and ' if scale == 255.0 else ''}rounded to uint8")
        return _expand_gray(np.round(array * scale).astype(np.uint8))
    value_range = "no values" if low is None else f"values in [{low:g}, {high:g}]"
    raise DataError(f"{path}: {key} has dtype {array.dtype} with {value_range}; {expected}.")


def _as_labels(path, key, array, num_images, classes, notes):
    """``array`` as int32 labels in [0, classes) (``classes`` None: any >= 0)."""
    labels = array.reshape(-1)
    if len(labels) != num_images:
        raise DataError(f"{path}: {key} has {len(labels)} labels for {num_images} images "
                        f"in x_{key[2:]}; expected one label per image.")
    if not (np.issubdtype(labels.dtype, np.integer) or (
            np.issubdtype(labels.dtype, np.floating) and np.all(np.isfinite(labels))
            and np.all(labels == np.round(labels)))):
        raise DataError(f"{path}: {key} has dtype {labels.dtype} with non-integer values; "
                        f"expected integer class labels.")
    if labels.size:
        low, high = int(labels.min()), int(labels.max())
        if low < 0 or (classes is not None and high >= classes):
            allowed = f"[0, {classes})" if classes is not None else "[0, classes)"
            raise DataError(f"{path}: {key} has labels in [{low}, {high}]; expected integers "
                            f"in {allowed}.")
    if not np.issubdtype(labels.dtype, np.integer):
        notes.append(f"{key}: integral floats converted to int32")
    return labels.astype(np.int32)


def _from_npz(path, name):
    arrays = _read_npz(path)
    notes = []
    classes = NUM_CLASSES.get(name)
    x_train = _as_images(path, "x_train", arrays["x_train"], notes)
    x_test = _as_images(path, "x_test", arrays["x_test"], notes)
    if x_train.shape[1:] != x_test.shape[1:]:
        raise DataError(f"{path}: x_train images are {x_train.shape[1:]}, x_test images "
                        f"{x_test.shape[1:]}; expected one size.")
    y_train = _as_labels(path, "y_train", arrays["y_train"], len(x_train), classes, notes)
    y_test = _as_labels(path, "y_test", arrays["y_test"], len(x_test), classes, notes)
    num_classes = classes or int(max(y_train.max(initial=0), y_test.max(initial=0))) + 1
    source = path + (f" ({'; '.join(notes)})" if notes else "")
    return ImageDataset(
        name=name, num_classes=num_classes, class_names=[str(i) for i in range(num_classes)],
        image_shape=tuple(x_train.shape[1:]), source=source, x_train=x_train,
        y_train=y_train, x_test=x_test, y_test=y_test, fingerprint=fingerprint(path))


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
        raise DataError(f"{name} is not a readable image ({type(error).__name__}: "
                        f"{_first_line(error)}); {EXPECTED_IMAGE}.") from None


def _decode_all(encoded, channels, names, source):
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
    """Finds the image that stopped :func:`_decode_all` and raises naming it."""
    import tensorflow as tf

    sizes = {}
    for data, name in zip(encoded, names):
        try:
            image = tf.io.decode_image(data, channels=channels, expand_animations=False)
        except tf.errors.OpError as error:
            raise DataError(f"{source}: {name} is not a readable image "
                            f"({_first_line(error.message)}); {EXPECTED_IMAGE}.") from None
        _note_size(sizes, image.shape, name, source)


def _split_name(name):
    """'train' | 'test' | None: the split a folder named ``name`` holds."""
    name = name.lower()
    return "train" if name == "train" else "test" if name in _TEST_SPLIT_NAMES else None


def _misplaced(source, name, parts):
    """The :class:`DataError` for the image ``name`` of ``source`` whose path
    in the tree, ``parts`` (``[<split>, ...]``), is not
    ``<split>/<class>/<image>`` (it would be left out)."""
    where = (f"directly under {parts[0]}/, outside any class folder" if len(parts) == 2
             else f"in a subfolder of the class folder {parts[0]}/{parts[1]}/")
    return DataError(f"{source}: {name} is {where}; {LAYOUT}")


def _archive_images(path, names):
    """``{"train": [(class, index), ...], "test": [...]}`` of the image
    members ``names`` (``index``: in ``names``) of the archive ``path`` of an
    image-folder tree, which may sit in a folder of the archive
    (``cifar10/train/<class>/...``): a tree's root is any folder holding a
    ``train/`` folder with images, the outermost where several are nested.
    An image of a split folder outside ``<split>/<class>/<image>`` is
    refused (:func:`_misplaced`)."""
    split_names = [name.replace("\\", "/").split("/") for name in names]
    roots = {tuple(parts[:i]) for parts in split_names
             for i, part in enumerate(parts[:-1]) if part.lower() == "train"}
    items = {"train": [], "test": []}
    for index, (name, parts) in enumerate(zip(names, split_names)):
        for i, part in enumerate(parts[:-1]):
            split = _split_name(part)
            if split and tuple(parts[:i]) in roots:
                if len(parts) - i != 3:
                    raise _misplaced(path, name, parts[i:])
                items[split].append((parts[i + 1], index))
                break
    return items


def _check_test_classes(source, train, test):
    """Raises :class:`DataError` naming the class folders of the test split
    (``test``: ``(class, file name)`` pairs) that have no training images
    (``train``: ``(class, ...)`` tuples): the model would be trained on
    fewer classes than the run reports, and score nothing on theirs."""
    trained = {entry[0] for entry in train}
    missing = {}
    for cls, name in test:
        if cls not in trained:
            missing.setdefault(cls, os.path.dirname(name.replace("\\", "/")) + "/")
    if missing:
        folders = ", ".join(missing[cls] for cls in sorted(missing))
        plural = len(missing) > 1
        raise DataError(f"{source}: the test class folder{'s' if plural else ''} {folders} "
                        f"ha{'ve' if plural else 's'} no training images; every test class "
                        f"needs training images under train/<class>/ (a class only in "
                        f"train/ is fine).")


def _assemble(name, source, items, channels):
    classes = sorted({cls for split in items.values() for cls, _, _ in split})
    if not items["train"] or not items["test"]:
        raise DataError(f"{source} is not an image-folder tree: expected images under "
                        f"train/<class>/ and test/<class>/ (or val/<class>/).")
    _check_test_classes(source, items["train"], [(c, n) for c, _, n in items["test"]])
    index = {cls: i for i, cls in enumerate(classes)}
    arrays = {}
    for split, entries in items.items():
        arrays[f"x_{split}"] = _decode_all([b for _, b, _ in entries], channels,
                                           [n for _, _, n in entries], source)
        arrays[f"y_{split}"] = np.array([index[c] for c, _, _ in entries], np.int32)
    shapes = {arrays["x_train"].shape[1:], arrays["x_test"].shape[1:]}
    if len(shapes) != 1:
        raise DataError(f"{source}: images of different sizes {sorted(shapes)}; in-memory "
                        f"datasets need one size.")
    from keras_identity import _tensorflow

    # Pillow's JPEG decoder rounds differently from TensorFlow's (by up to 4
    # levels): a run's identity names the decoder, so that it never resumes
    # on other pixels.
    decoder = "" if _tensorflow.available() else "; decoded by Pillow"
    return ImageDataset(name=name, num_classes=len(classes), class_names=classes,
                        image_shape=tuple(arrays["x_train"].shape[1:]), source=source,
                        fingerprint=fingerprint(source) + decoder, **arrays)


def _channels(name):
    return IMAGE_SHAPES.get(name, (0, 0, 3))[-1]


def _from_archive(path, name):
    images = []  # (name, bytes) of the image members, in archive order
    try:
        with tarfile.open(path, "r:*") as archive:
            for member in archive:
                if member.isfile() and member.name.lower().endswith(_IMAGE_EXTENSIONS):
                    images.append((member.name, archive.extractfile(member).read()))
    except (tarfile.TarError, OSError, EOFError, zlib.error) as error:
        raise DataError(f"cannot read the archive {path} ({type(error).__name__}: "
                        f"{_first_line(error)}); is it complete?") from None
    listed = _archive_images(path, [name for name, _ in images])
    items = {split: [(cls, images[i][1], images[i][0]) for cls, i in entries]
             for split, entries in listed.items()}
    for split in items:  # archive order is arbitrary; make it deterministic
        items[split].sort(key=lambda entry: entry[0])
    return _assemble(name, path, items, _channels(name))


def _check_file(root, path):
    """Raises :class:`DataError` unless ``path`` (an image of the folder
    tree ``root``) is a regular file or a link to one: a link that loops or
    points nowhere, or a FIFO, would fail (or block) only when read."""
    rel = os.path.relpath(path, root)
    try:
        info = os.stat(path)
    except OSError as error:
        if os.path.islink(path) and error.errno == errno.ELOOP:
            problem = "is a symbolic link that loops"
        elif os.path.islink(path):
            problem = f"is a symbolic link to {os.path.realpath(path)}, which does not exist"
        else:
            problem = f"cannot be read ({error.strerror or error})"
        raise DataError(f"{root}: {rel} {problem}; {FOLDER_FILES}") from None
    if not stat.S_ISREG(info.st_mode):
        raise DataError(f"{root}: {rel} is not a regular file; {FOLDER_FILES}")


def _check_class_folder(root, path):
    """Raises :class:`DataError` if ``path`` (an entry of a split folder of
    the tree ``root`` that is no folder) is a link that loops or points
    nowhere: a class folder would be left out."""
    if os.path.islink(path) and not os.path.exists(path):
        rel = os.path.relpath(path, root).replace(os.sep, "/")
        try:
            os.stat(path)
            problem = "cannot be read"
        except OSError as error:
            problem = ("is a symbolic link that loops" if error.errno == errno.ELOOP else
                       f"is a symbolic link to {os.path.realpath(path)}, which does not exist")
        raise DataError(f"{root}: {rel} {problem}; {SPLIT_FOLDERS}")


def _folder_entries(root, folder):
    """The sorted entries of the folder ``folder`` of the tree ``root``;
    :class:`DataError` naming it if it cannot be listed."""
    try:
        return sorted(os.listdir(folder))
    except OSError as error:
        rel = os.path.relpath(folder, root).replace(os.sep, "/")
        raise DataError(f"{root}: the folder {rel}/ cannot be listed "
                        f"({error.strerror or error}).") from None


def _first_image(folder):
    """The first image file (sorted) anywhere inside ``folder``, or ``None``
    (links to folders inside it are not followed)."""
    for dirpath, dirnames, filenames in os.walk(folder):
        dirnames.sort()
        for filename in sorted(filenames):
            if filename.lower().endswith(_IMAGE_EXTENSIONS):
                return os.path.join(dirpath, filename)
    return None


def _list_folder(root):
    """``{"train": [(class, path), ...], "test": [...]}`` of the image-folder
    tree ``root/<split>/<class>/<image>``, sorted.  A class folder may be a
    symbolic link to a folder (followed, as Keras's
    ``image_dataset_from_directory`` does; one that loops or points nowhere
    is refused); an image elsewhere in a split folder (directly under it,
    or in a subfolder of a class folder) is refused naming it
    (:func:`_misplaced`), and every image is checked to be a readable file
    (:func:`_check_file`).  Anything outside the split folders is not read."""
    files = {"train": [], "test": []}
    for split_folder in _folder_entries(root, root):
        split, folder = _split_name(split_folder), os.path.join(root, split_folder)
        if not split or not os.path.isdir(folder):
            continue
        for cls in _folder_entries(root, folder):
            class_folder = os.path.join(folder, cls)
            if not os.path.isdir(class_folder):
                if cls.lower().endswith(_IMAGE_EXTENSIONS):
                    raise _misplaced(root, f"{split_folder}/{cls}", [split_folder, cls])
                _check_class_folder(root, class_folder)
                continue
            for filename in _folder_entries(root, class_folder):
                path = os.path.join(class_folder, filename)
                if os.path.isdir(path):
                    image = _first_image(path)
                    if image:
                        rel = os.path.relpath(image, root).replace(os.sep, "/")
                        raise _misplaced(root, rel, rel.split("/"))
                elif filename.lower().endswith(_IMAGE_EXTENSIONS):
                    _check_file(root, path)
                    files[split].append((cls, path))
    for split in files:
        files[split].sort()
    return files


def _from_folder(root, name):
    files = _list_folder(root)
    if name == "imagenet":
        classes = sorted({cls for split in files.values() for cls, _ in split})
        if not files["train"] or not files["test"]:
            raise DataError(f"{root} is not an image-folder tree: expected train/<class>/ "
                            f"and val/<class>/.")
        _check_test_classes(root, files["train"],
                            [(c, os.path.relpath(p, root)) for c, p in files["test"]])
        index = {cls: i for i, cls in enumerate(classes)}
        as_lists = {s: ([p for _, p in e], np.array([index[c] for c, _ in e], np.int32))
                    for s, e in files.items()}
        return ImageDataset(name=name, num_classes=len(classes), class_names=classes,
                            image_shape=IMAGE_SHAPES["imagenet"], source=root,
                            fingerprint=fingerprint(root),
                            files_train=as_lists["train"], files_test=as_lists["test"])
    items = {s: [] for s in files}
    for split, entries in files.items():
        for cls, path in entries:
            items[split].append((cls, read_file(path), os.path.relpath(path, root)))
    return _assemble(name, root, items, _channels(name))


def _is_tfds_dir(path, name):
    """A tensorflow_datasets data_dir: prepared ``<name>/<version>/dataset_info.json``
    or a manual-download folder."""
    tfds_name = "imagenet2012" if name == "imagenet" else name
    prepared = os.path.join(path, tfds_name)
    if os.path.isdir(prepared):
        for version in os.listdir(prepared):
            if os.path.exists(os.path.join(prepared, version, "dataset_info.json")):
                return True
    return os.path.isdir(os.path.join(path, "downloads", "manual"))


def _from_path(path, name):
    lower = path.lower()
    if os.path.isfile(path):
        if lower.endswith(".npz"):
            return _from_npz(path, name)
        if lower.endswith((".tar.gz", ".tgz", ".tar")):
            return _from_archive(path, name)
        raise DataError(f"data_dir={path!r}: unknown file type; expected a .npz file or a "
                        f".tar.gz/.tgz/.tar image-folder archive.")
    if not os.path.isdir(path):
        raise DataError(f"data_dir={path!r} does not exist.")
    if any(os.path.isdir(os.path.join(path, s)) for s in ("train",)):
        return _from_folder(path, name)
    if _is_tfds_dir(path, name):
        return None  # a tensorflow_datasets directory
    candidates = sorted(entry for entry in os.listdir(path)
                        if entry.lower().startswith(name.lower()))
    # "cifar10" must not pick "cifar100-..."; prefer exact-prefix matches.
    candidates = [c for c in candidates
                  if not c[len(name):len(name) + 1].isdigit()]
    for candidate in candidates:
        full = os.path.join(path, candidate)
        if os.path.isdir(full) or full.lower().endswith((".npz", ".tar.gz", ".tgz", ".tar")):
            return _from_path(full, name)
    raise DataError(f"data_dir={path!r} holds no {name} data: expected a .npz file, an "
                    f"image-folder tree (train/<class>/, test/<class>/) or archive, or a "
                    f"file/folder named {name}* inside it.")


def _data_source_arrays(source):
    """``(images, labels)`` of a random-access tfds data source, in memory."""
    examples = [source[i] for i in range(len(source))]
    images = np.stack([np.asarray(e["image"], np.uint8) for e in examples])
    return _expand_gray(images), np.asarray([e["label"] for e in examples], np.int32)


def _from_tfds(name, data_dir, random_access=False):
    try:
        import tensorflow_datasets as tfds
    except ImportError:
        raise DataError(f"loading {name} without --data_dir needs tensorflow-datasets "
                        f"(pip install 'keras_identity[data]'), or pass --data_dir with "
                        f"offline files (e.g. --data_dir=../shared/data).") from None
    tfds_name = "imagenet2012" if name == "imagenet" else name
    try:
        if random_access:
            # The array_record files that tfds.data_source reads without TensorFlow.
            builder = tfds.builder(tfds_name, data_dir=data_dir, file_format="array_record")
        else:
            builder = tfds.builder(tfds_name, data_dir=data_dir)
        builder.download_and_prepare()
        info = builder.info
        class_names = list(info.features["label"].names)
        if random_access:
            splits = ("train", "validation" if name == "imagenet" else "test")
            sources = [builder.as_data_source(split=split) for split in splits]
            if name == "imagenet":
                return ImageDataset(
                    name=name, num_classes=len(class_names), class_names=class_names,
                    image_shape=IMAGE_SHAPES[name], source=f"tfds:{tfds_name}",
                    tfds_train=(sources[0], len(sources[0])),
                    tfds_test=(sources[1], len(sources[1])))
            arrays = {}
            for split, source in zip(("train", "test"), sources):
                arrays[f"x_{split}"], arrays[f"y_{split}"] = _data_source_arrays(source)
        elif name == "imagenet":
            train = builder.as_dataset(split="train", as_supervised=True, shuffle_files=True)
            test = builder.as_dataset(split="validation", as_supervised=True)
            return ImageDataset(
                name=name, num_classes=len(class_names), class_names=class_names,
                image_shape=IMAGE_SHAPES[name], source=f"tfds:{tfds_name}",
                tfds_train=(train, info.splits["train"].num_examples),
                tfds_test=(test, info.splits["validation"].num_examples))
        else:
            arrays = {}
            for split in ("train", "test"):
                x, y = tfds.as_numpy(builder.as_dataset(split=split, as_supervised=True,
                                                        batch_size=-1))
                arrays[f"x_{split}"] = x.astype(np.uint8)
                arrays[f"y_{split}"] = y.astype(np.int32)
    except Exception as error:  # tfds raises many types (download, manual dir, ...)
        hint = ("ImageNet needs the manual download in <data_dir>/downloads/manual"
                if name == "imagenet" else
                "no internet? pass --data_dir with offline files (e.g. --data_dir="
                "../shared/data)")
        if random_access:
            hint += ("; the JAX route reads tfds's array_record files (a data_dir "
                     "prepared as tfrecord for tf.data is prepared again)")
        first_line = str(error).strip().splitlines()[0] if str(error).strip() else ""
        raise DataError(f"tensorflow_datasets could not load {tfds_name} "
                        f"({type(error).__name__}: {first_line[:200]}); {hint}.") from None
    return ImageDataset(name=name, num_classes=len(class_names), class_names=class_names,
                        image_shape=tuple(arrays["x_train"].shape[1:]),
                        source=f"tfds:{tfds_name}", **arrays)


def _walk(top, depth=0):
    """``os.walk(top)`` (top-down, sorted), following the links to folders
    that the listing of an image-folder tree follows (:func:`_list_folder`:
    split and class folders, ``depth`` 0 and 1) and no others."""
    try:
        entries = sorted(os.listdir(top))
    except OSError:
        return
    dirnames = [e for e in entries if os.path.isdir(os.path.join(top, e))]
    yield top, dirnames, [e for e in entries if e not in dirnames]
    for name in dirnames:
        folder = os.path.join(top, name)
        if depth <= 1 or not os.path.islink(folder):
            yield from _walk(folder, depth + 1)


def fingerprint(path):
    """A digest of the data at ``path``: SHA-256 of a file's bytes, or of a
    folder's relative paths, sizes and modification times (a changed, added
    or removed image changes it; images in a linked class folder too)."""
    digest = hashlib.sha256()
    if os.path.isfile(path):
        with open(path, "rb") as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                digest.update(block)
        return f"sha256:{digest.hexdigest()}"
    for dirpath, _, filenames in _walk(path):
        for filename in filenames:
            full = os.path.join(dirpath, filename)
            try:
                info = os.stat(full)
            except OSError:  # a link that points nowhere (not an image: images are checked)
                info = os.lstat(full)
            digest.update(f"{os.path.relpath(full, path)}:{info.st_size}:"
                          f"{info.st_mtime_ns}\n".encode())
    return f"tree-sha256:{digest.hexdigest()}"


def load_dataset(name, data_dir=None, random_access=False):
    """Loads ``name`` (``mnist``, ``cifar10``, ``cifar100``, ``imagenet``).

    Args:
        name: dataset name.
        data_dir: offline files or a tensorflow_datasets directory (see the
            module docstring); ``None`` uses the built-in MNIST or
            tensorflow_datasets.
        random_access: read tensorflow_datasets through its random-access
            ``data_source`` (array_record files, no TensorFlow needed), as
            the JAX route's NumPy pipeline does; otherwise through tf.data.

    Raises:
        ValueError: unknown ``name``; :class:`DataError` (a ValueError)
            when the data cannot be found, with what to do instead.
    """
    if name not in DATASETS:
        raise ValueError(f"dataset={name!r} is not valid; expected one of: "
                         f"{', '.join(repr(d) for d in DATASETS)}.")
    if data_dir:
        data_dir = os.path.expanduser(data_dir)
        dataset = _from_path(data_dir, name)
        if dataset is not None:
            return dataset
        dataset = _from_tfds(name, data_dir, random_access)
        dataset.fingerprint = f"{dataset.source} in {os.path.abspath(data_dir)}"
        return dataset
    if name == "mnist":
        dataset = _from_npz(BUILTIN_MNIST, name)
        dataset.source = "built-in MNIST (keras_identity/data/mnist.npz)"
        return dataset
    dataset = _from_tfds(name, None, random_access)
    dataset.fingerprint = dataset.source
    return dataset

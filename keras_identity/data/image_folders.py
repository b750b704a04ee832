"""Image-folder trees ``<split>/<class>/<image>`` (``train/``, and
``test/``, ``val/`` or ``validation/``): where a tree's images must sit
(one elsewhere is refused naming it, as it would be left out), how a folder
tree is listed (class folders may be links to folders; links that loop or
lead nowhere are refused), and how a tree's images become a dataset:
ImageNet as lists of files, others decoded into memory (:func:`assemble`,
also for the archives of :mod:`~keras_identity.data.archives`); an image
file's bytes, with the one-line refusals (:func:`read_file`, which the JAX
route also reads its files through)."""

import errno
import os
import stat

import numpy as np

from keras_identity.data.decoding import conversions
from keras_identity.data.decoding import decode_all
from keras_identity.data.errors import DataError
from keras_identity.data.facts import IMAGE_SHAPES
from keras_identity.data.fingerprints import fingerprint as _fingerprint
from keras_identity.data.image_dataset import ImageDataset

IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".png", ".bmp", ".gif")
_TEST_SPLIT_NAMES = ("test", "val", "validation")
# What an image folder may hold (the end of the refusal of anything else).
FOLDER_FILES = "an image folder holds image files, or links to existing image files."
# Where an image-folder tree holds its images (the end of the refusal of one elsewhere).
LAYOUT = ("an image-folder tree holds its images as <split>/<class>/<image> (train/<class>/ "
          "and test/<class>/, val/<class>/ or validation/<class>/).")
# What a split folder may hold (the end of the refusal of a link that leads nowhere).
SPLIT_FOLDERS = "a split folder holds class folders, or links to existing folders."


def read_file(path):
    """The bytes of the image file ``path``; :class:`DataError` naming it if
    it cannot be read (removed, or unreadable, since it was listed)."""
    try:
        with open(path, "rb") as f:
            return f.read()
    except OSError as error:
        raise DataError(f"cannot read the image {path} ({error.strerror or error}); "
                        f"{FOLDER_FILES}") from None


def split_name(name):
    """'train' | 'test' | None: the split a folder named ``name`` holds."""
    name = name.lower()
    return "train" if name == "train" else "test" if name in _TEST_SPLIT_NAMES else None


def misplaced(source, name, parts):
    """The :class:`DataError` for the image ``name`` of ``source`` whose path
    in the tree, ``parts`` (``[<split>, ...]``), is not
    ``<split>/<class>/<image>`` (it would be left out)."""
    where = (f"directly under {parts[0]}/, outside any class folder" if len(parts) == 2
             else f"in a subfolder of the class folder {parts[0]}/{parts[1]}/")
    return DataError(f"{source}: {name} is {where}; {LAYOUT}")


def check_test_classes(source, train, test):
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


def assemble(name, source, items, channels, fingerprint=None):
    """The in-memory dataset ``name`` of the image-folder tree ``source`` (a
    folder or an archive): ``items`` ``{"train": [(class, bytes, file name),
    ...], "test": [...]}``, decoded to ``channels`` (:func:`decode_all`);
    :class:`DataError` for a split without images, test classes without
    training images (:func:`check_test_classes`), or images of several
    sizes."""
    classes = sorted({cls for split in items.values() for cls, _, _ in split})
    if not items["train"] or not items["test"]:
        raise DataError(f"{source} is not an image-folder tree: expected images under "
                        f"train/<class>/ and test/<class>/ (or val/<class>/).")
    check_test_classes(source, items["train"], [(c, n) for c, _, n in items["test"]])
    index = {cls: i for i, cls in enumerate(classes)}
    arrays = {}
    for split, entries in items.items():
        arrays[f"x_{split}"] = decode_all([b for _, b, _ in entries], channels,
                                          [n for _, _, n in entries], source)
        arrays[f"y_{split}"] = np.array([index[c] for c, _, _ in entries], np.int32)
    shapes = {arrays["x_train"].shape[1:], arrays["x_test"].shape[1:]}
    if len(shapes) != 1:
        raise DataError(f"{source}: images of different sizes {sorted(shapes)}; in-memory "
                        f"datasets need one size.")
    # Conversions are said with the data's description (as npz_files does).
    converted = conversions([b for split in items.values() for _, b, _ in split], channels,
                            [n for split in items.values() for _, _, n in split])
    described = source + (f" (converted: {converted})" if converted else "")
    return ImageDataset(name=name, num_classes=len(classes), class_names=classes,
                        image_shape=tuple(arrays["x_train"].shape[1:]), source=described,
                        fingerprint=fingerprint or (_fingerprint(source) + decoder_note()),
                        **arrays)


def decoder_note():
    """What a dataset's fingerprint adds for the JPEG decoder: Pillow's
    rounds differently from TensorFlow's (by up to 4 levels), so that a run
    never resumes on other pixels."""
    from keras_identity import _tensorflow

    return "" if _tensorflow.available() else "; decoded by Pillow"


def dataset_channels(name):
    """The channels of the images of the dataset ``name`` (3 if unknown)."""
    return IMAGE_SHAPES.get(name, (0, 0, 3))[-1]


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
            if filename.lower().endswith(IMAGE_EXTENSIONS):
                return os.path.join(dirpath, filename)
    return None


def _list_folder(root):
    """``{"train": [(class, path), ...], "test": [...]}`` of the image-folder
    tree ``root/<split>/<class>/<image>``, sorted.  A class folder may be a
    symbolic link to a folder (followed, as Keras's
    ``image_dataset_from_directory`` does; one that loops or points nowhere
    is refused); an image elsewhere in a split folder (directly under it,
    or in a subfolder of a class folder) is refused naming it
    (:func:`misplaced`), and every image is checked to be a readable file
    (:func:`_check_file`).  Anything outside the split folders is not read."""
    files = {"train": [], "test": []}
    for split_folder in _folder_entries(root, root):
        split, folder = split_name(split_folder), os.path.join(root, split_folder)
        if not split or not os.path.isdir(folder):
            continue
        for cls in _folder_entries(root, folder):
            class_folder = os.path.join(folder, cls)
            if not os.path.isdir(class_folder):
                if cls.lower().endswith(IMAGE_EXTENSIONS):
                    raise misplaced(root, f"{split_folder}/{cls}", [split_folder, cls])
                _check_class_folder(root, class_folder)
                continue
            for filename in _folder_entries(root, class_folder):
                path = os.path.join(class_folder, filename)
                if os.path.isdir(path):
                    image = _first_image(path)
                    if image:
                        rel = os.path.relpath(image, root).replace(os.sep, "/")
                        raise misplaced(root, rel, rel.split("/"))
                elif filename.lower().endswith(IMAGE_EXTENSIONS):
                    _check_file(root, path)
                    files[split].append((cls, path))
    for split in files:
        files[split].sort()
    return files


def from_folder(root, name):
    """The dataset ``name`` of the image-folder tree ``root``: ImageNet as
    lists of files (read while training), others decoded into memory."""
    files = _list_folder(root)
    if name == "imagenet":
        classes = sorted({cls for split in files.values() for cls, _ in split})
        if not files["train"] or not files["test"]:
            raise DataError(f"{root} is not an image-folder tree: expected train/<class>/ "
                            f"and val/<class>/.")
        check_test_classes(root, files["train"],
                           [(c, os.path.relpath(p, root)) for c, p in files["test"]])
        index = {cls: i for i, cls in enumerate(classes)}
        as_lists = {s: ([p for _, p in e], np.array([index[c] for c, _ in e], np.int32))
                    for s, e in files.items()}
        return ImageDataset(name=name, num_classes=len(classes), class_names=classes,
                            image_shape=IMAGE_SHAPES["imagenet"], source=root,
                            fingerprint=_fingerprint(root),
                            files_train=as_lists["train"], files_test=as_lists["test"])
    items = {s: [] for s in files}
    for split, entries in files.items():
        for cls, path in entries:
            items[split].append((cls, read_file(path), os.path.relpath(path, root)))
    return assemble(name, root, items, dataset_channels(name))

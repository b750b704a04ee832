"""Image-folder trees in ``.tar.gz`` / ``.tgz`` / ``.tar`` archives (the
tree may sit in a folder of the archive, ``cifar10/train/<class>/...``),
read into memory as :mod:`~keras_identity.data.image_folders` reads a
folder tree, and decoded once (:mod:`~keras_identity.data.decoded_archives`)."""

import io
import tarfile
import zlib

from keras_identity.data import decoded_archives
from keras_identity.data.errors import DataError
from keras_identity.data.errors import first_line
from keras_identity.data.fingerprints import bytes_fingerprint
from keras_identity.data.image_folders import IMAGE_EXTENSIONS
from keras_identity.data.image_folders import assemble
from keras_identity.data.image_folders import dataset_channels
from keras_identity.data.image_folders import decoder_note
from keras_identity.data.image_folders import misplaced
from keras_identity.data.image_folders import split_name


def _archive_images(path, names):
    """``{"train": [(class, index), ...], "test": [...]}`` of the image
    members ``names`` (``index``: in ``names``) of the archive ``path`` of an
    image-folder tree, which may sit in a folder of the archive
    (``cifar10/train/<class>/...``): a tree's root is any folder holding a
    ``train/`` folder with images, the outermost where several are nested.
    An image of a split folder outside ``<split>/<class>/<image>`` is
    refused (:func:`~keras_identity.data.image_folders.misplaced`)."""
    split_names = [name.replace("\\", "/").split("/") for name in names]
    roots = {tuple(parts[:i]) for parts in split_names
             for i, part in enumerate(parts[:-1]) if part.lower() == "train"}
    items = {"train": [], "test": []}
    for index, (name, parts) in enumerate(zip(names, split_names)):
        for i, part in enumerate(parts[:-1]):
            split = split_name(part)
            if split and tuple(parts[:i]) in roots:
                if len(parts) - i != 3:
                    raise misplaced(path, name, parts[i:])
                items[split].append((parts[i + 1], index))
                break
    return items


def from_archive(path, name):
    """The in-memory dataset ``name`` of the archive ``path`` of an
    image-folder tree; :class:`DataError` naming it if it cannot be read.
    Read back from :mod:`~keras_identity.data.decoded_archives` where the
    same bytes were decoded before, with the same decoder."""
    channels = dataset_channels(name)
    try:
        with open(path, "rb") as f:
            raw = f.read()  # read once: the bytes hashed are the bytes decoded
        digest = bytes_fingerprint(raw) + decoder_note()
        kept = decoded_archives.load(path, name, channels, digest)
        if kept is not None:
            return kept
        images = []  # (name, bytes) of the image members, in archive order
        with tarfile.open(fileobj=io.BytesIO(raw), mode="r:*") as archive:
            for member in archive:
                if member.isfile() and member.name.lower().endswith(IMAGE_EXTENSIONS):
                    images.append((member.name, archive.extractfile(member).read()))
    except (tarfile.TarError, OSError, EOFError, zlib.error) as error:
        raise DataError(f"cannot read the archive {path} ({type(error).__name__}: "
                        f"{first_line(error)}); is it complete?") from None
    del raw
    listed = _archive_images(path, [name for name, _ in images])
    items = {split: [(cls, images[i][1], images[i][0]) for cls, i in entries]
             for split, entries in listed.items()}
    for split in items:  # archive order is arbitrary; make it deterministic
        items[split].sort(key=lambda entry: entry[0])
    dataset = assemble(name, path, items, channels, fingerprint=digest)
    decoded_archives.save(path, dataset, channels)
    return dataset

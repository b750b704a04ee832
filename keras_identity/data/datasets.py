"""Where the images come from: tensorflow_datasets, or offline files
(:func:`load_dataset`, which picks the source that reads them).

``load_dataset("cifar10")`` uses tensorflow_datasets (Colab, or any machine with
internet or a prepared ``~/tensorflow_datasets``).  Offline, ``data_dir`` may be

* a ``.npz`` file with ``x_train, y_train, x_test, y_test`` (e.g. MNIST);
* an image-folder tree ``train/<class>/*.jpg``, ``test/<class>/*.jpg`` (``val/`` or
  ``validation/`` also accepted for the test split), or a ``.tar.gz`` / ``.tgz`` /
  ``.tar`` archive of one.  A class folder may be a symbolic link to a folder; an image
  elsewhere in a split folder (directly under it, or in a subfolder of a class folder)
  is refused naming it, as it would be left out;
* a folder holding one of those whose name starts with the dataset's name
  (``--data_dir=../shared/data`` finds ``cifar10-jpg.tar.gz``);
* a tensorflow_datasets data directory (ImageNet: with the manual download in
  ``<data_dir>/downloads/manual``).

MNIST ships with the package (``keras_identity/data/mnist.npz``), so the default first
run needs no network.  Small datasets (MNIST, CIFAR) are held in memory as uint8 arrays;
ImageNet image folders are read file by file.  Image files are decoded by TensorFlow
where it is installed (in-memory datasets, the tf.data route) and by Pillow elsewhere
(and on the JAX route's file streams), to the same pixels for PNGs
(:mod:`~keras_identity.data.decoding`).

The sources: :mod:`~keras_identity.data.npz_files`,
:mod:`~keras_identity.data.image_folders`, :mod:`~keras_identity.data.archives` and
:mod:`~keras_identity.data.tfds_source`; what they give,
:class:`~keras_identity.data.image_dataset.ImageDataset`, or
:class:`~keras_identity.data.errors.DataError`.
"""

import os

from keras_identity import storage
from keras_identity.data.archives import from_archive
from keras_identity.data.errors import DataError
from keras_identity.data.facts import DATASETS
from keras_identity.data.image_folders import from_folder
from keras_identity.data.npz_files import from_npz
from keras_identity.data.tfds_source import from_tfds
from keras_identity.data.tfds_source import is_tfds_dir

BUILTIN_MNIST = os.path.join(os.path.dirname(os.path.abspath(__file__)), "mnist.npz")


def _from_path(path, name):
    """The dataset ``name`` of the offline files at ``path`` (see the module
    docstring); ``None`` if ``path`` is a tensorflow_datasets directory."""
    lower = path.lower()
    if os.path.isfile(path):
        if lower.endswith(".npz"):
            return from_npz(path, name)
        if lower.endswith((".tar.gz", ".tgz", ".tar")):
            return from_archive(path, name)
        raise DataError(f"data_dir={path!r}: unknown file type; expected a .npz file or a "
                        f".tar.gz/.tgz/.tar image-folder archive.")
    if not os.path.isdir(path):
        raise DataError(f"data_dir={path!r} does not exist.")
    if any(os.path.isdir(os.path.join(path, s)) for s in ("train",)):
        return from_folder(path, name)
    if is_tfds_dir(path, name):
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
        storage.check_path(os.fspath(data_dir), "data_dir")
        data_dir = os.path.expanduser(data_dir)
        dataset = _from_path(data_dir, name)
        if dataset is not None:
            return dataset
        dataset = from_tfds(name, data_dir, random_access)
        dataset.fingerprint = f"{dataset.source} in {os.path.abspath(data_dir)}"
        return dataset
    if name == "mnist":
        dataset = from_npz(BUILTIN_MNIST, name)
        dataset.source = "built-in MNIST (keras_identity/data/mnist.npz)"
        return dataset
    dataset = from_tfds(name, None, random_access)
    dataset.fingerprint = dataset.source
    return dataset

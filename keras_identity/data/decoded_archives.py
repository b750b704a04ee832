"""Image-folder archives decoded once: the arrays of an archive read by
:func:`~keras_identity.data.archives.from_archive` are kept in
``<KERAS_HOME or ~/.keras>/keras_identity/decoded/`` (an uncompressed
``.npz``) and the next load of the same archive reads them back, for archives
of at least :data:`MIN_IMAGES` images: the CIFAR-10 JPEG copy (60,000 images)
takes 9-15 s to decode on 2 CPU cores and 0.5 s to read back.

An entry is keyed by the archive's path as given, the SHA-256 of the bytes
that were decoded, the decoder (TensorFlow's or Pillow's, and the versions of
TensorFlow, Pillow and keras_identity), the channels and :data:`FORMAT`; other
bytes or another decoder are decoded anew, with every check of the load.

Our own, not a maintained part: ``keras.utils.get_file`` caches downloaded
files, not the arrays decoded from them, and tensorflow_datasets would need
TensorFlow and a build step (the JAX route has neither).  The cache is an
optimisation only: an entry that cannot be read is decoded again and
rewritten, and a folder that cannot be written leaves the load as it was."""

import glob
import hashlib
import importlib.metadata
import json
import os
import tempfile
import time
import zipfile

import numpy as np

from keras_identity.data.image_dataset import ImageDataset
from keras_identity.version import __version__

# Raised when the decoding or what an entry holds changes within a version.
FORMAT = 1
# Smaller archives decode in well under a second and are not kept.
MIN_IMAGES = 1000
# A temporary file older than this is a killed writer's, removed by the next.
_STALE_SECONDS = 3600


def cache_dir():
    """Where decoded archives are kept: ``keras_identity/decoded`` in
    ``KERAS_HOME`` (Keras's own setting) or ``~/.keras``."""
    home = os.environ.get("KERAS_HOME") or os.path.expanduser("~/.keras")
    return os.path.join(home, "keras_identity", "decoded")


def _version(*distributions):
    for distribution in distributions:
        try:
            return importlib.metadata.version(distribution)
        except importlib.metadata.PackageNotFoundError:
            continue
    return None


def entry_path(path, name, channels, fingerprint):
    """The cache file of the archive ``path`` (as given) read as ``name``
    with ``channels``; ``fingerprint`` names its bytes and decoder."""
    key = json.dumps([FORMAT, __version__, path, name, channels, fingerprint,
                      _version("tensorflow", "tensorflow-cpu", "tensorflow-intel",
                               "tensorflow-macos", "tf-nightly"),
                      _version("pillow", "Pillow")])
    return os.path.join(cache_dir(), f"{name}-{hashlib.sha256(key.encode()).hexdigest()[:24]}.npz")


def load(path, name, channels, fingerprint):
    """The :class:`ImageDataset` kept for this archive, or ``None`` (none
    kept, or an entry that cannot be read)."""
    try:
        with np.load(entry_path(path, name, channels, fingerprint)) as entry:
            meta = json.loads(str(entry["meta"]))
            arrays = {key: entry[key] for key in ("x_train", "y_train", "x_test", "y_test")}
        if meta["fingerprint"] != fingerprint:
            return None
        class_names = [str(c) for c in meta["class_names"]]
        source = str(meta["source"])
    except (OSError, ValueError, KeyError, TypeError, AttributeError, EOFError,
            zipfile.BadZipFile):
        return None
    for split in ("train", "test"):
        x, y = arrays[f"x_{split}"], arrays[f"y_{split}"]
        if x.dtype != np.uint8 or x.ndim != 4 or x.shape[-1] != channels or \
                y.dtype != np.int32 or y.shape != x.shape[:1]:
            return None
    return ImageDataset(name=name, num_classes=len(class_names), class_names=class_names,
                        image_shape=tuple(arrays["x_train"].shape[1:]), source=source,
                        fingerprint=fingerprint, **arrays)


def save(path, dataset, channels):
    """Keeps the in-memory ``dataset`` read from the archive ``path``
    (written to a temporary file, then renamed: a reader never sees half an
    entry); nothing is kept for fewer than :data:`MIN_IMAGES` images or
    where the folder cannot be written."""
    if len(dataset.x_train) + len(dataset.x_test) < MIN_IMAGES:
        return
    target = entry_path(path, dataset.name, channels, dataset.fingerprint)
    folder = os.path.dirname(target)
    meta = json.dumps({"fingerprint": dataset.fingerprint, "source": dataset.source,
                       "class_names": list(dataset.class_names)})
    temporary = None
    try:
        os.makedirs(folder, exist_ok=True)
        for stale in glob.glob(os.path.join(folder, "*.partial")):
            if time.time() - os.path.getmtime(stale) > _STALE_SECONDS:
                os.remove(stale)
        handle, temporary = tempfile.mkstemp(dir=folder, suffix=".partial")
        with os.fdopen(handle, "wb") as f:
            np.savez(f, meta=np.array(meta), x_train=dataset.x_train,
                     y_train=dataset.y_train, x_test=dataset.x_test, y_test=dataset.y_test)
        os.chmod(temporary, 0o644)  # mkstemp's 0600: readable as Keras's own files are
        os.replace(temporary, target)
        temporary = None
    except OSError:
        pass
    finally:
        if temporary is not None:
            try:
                os.remove(temporary)
            except OSError:
                pass

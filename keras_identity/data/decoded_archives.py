"""Image-folder archives decoded once: the arrays of an archive read by
:func:`~keras_identity.data.archives.from_archive` are kept in
``<KERAS_HOME or ~/.keras>/keras_identity/decoded/`` (an uncompressed
``.npz``, keyed by the archive's path as given, the SHA-256 of its bytes, the decoder
and the channels), and the next load of the same archive reads them back (archives of at
least :data:`MIN_IMAGES` images):
the CIFAR-10 JPEG copy (60,000 images) takes 10-15 s to decode on 2 CPU
cores and about a second to read back.

Our own, not a maintained part: ``keras.utils.get_file`` caches downloaded
files, not the arrays decoded from them, and tensorflow_datasets would need
TensorFlow and a build step (the JAX route has neither).  The cache is an
optimisation only: an entry that cannot be read is decoded again and
rewritten, and a folder that cannot be written leaves the load as it was."""

import hashlib
import json
import os
import tempfile
import zipfile

import numpy as np

from keras_identity.data.image_dataset import ImageDataset

FORMAT = 1  # raised when what an entry holds changes
# Smaller archives decode in well under a second and are not kept.
MIN_IMAGES = 1000


def cache_dir():
    """Where decoded archives are kept: ``keras_identity/decoded`` in
    ``KERAS_HOME`` (Keras's own setting) or ``~/.keras``."""
    home = os.environ.get("KERAS_HOME") or os.path.expanduser("~/.keras")
    return os.path.join(home, "keras_identity", "decoded")


def entry_path(path, name, channels, fingerprint):
    """The cache file of the archive ``path`` read as ``name`` with
    ``channels``; ``fingerprint`` names its bytes and decoder."""
    key = json.dumps([FORMAT, path, name, channels, fingerprint])
    return os.path.join(cache_dir(), f"{name}-{hashlib.sha256(key.encode()).hexdigest()[:24]}.npz")


def load(path, name, channels, fingerprint):
    """The :class:`ImageDataset` kept for this archive, or ``None``."""
    try:
        with np.load(entry_path(path, name, channels, fingerprint)) as entry:
            meta = json.loads(str(entry["meta"]))
            arrays = {key: entry[key] for key in ("x_train", "y_train", "x_test", "y_test")}
    except (OSError, ValueError, KeyError, EOFError, zipfile.BadZipFile):
        return None
    if meta.get("fingerprint") != fingerprint:
        return None
    return ImageDataset(name=name, num_classes=len(meta["class_names"]),
                        class_names=meta["class_names"],
                        image_shape=tuple(arrays["x_train"].shape[1:]), source=meta["source"],
                        fingerprint=fingerprint, **arrays)


def save(path, dataset, channels):
    """Keeps the in-memory ``dataset`` read from the archive ``path``
    (written to a temporary file, then renamed: a reader never sees half an
    entry); nothing is kept for fewer than :data:`MIN_IMAGES` images or
    where the folder cannot be written."""
    if len(dataset.x_train) + len(dataset.x_test) < MIN_IMAGES:
        return
    target = entry_path(path, dataset.name, channels, dataset.fingerprint)
    meta = json.dumps({"fingerprint": dataset.fingerprint, "source": dataset.source,
                       "class_names": list(dataset.class_names)})
    try:
        os.makedirs(os.path.dirname(target), exist_ok=True)
        handle, temporary = tempfile.mkstemp(dir=os.path.dirname(target), suffix=".partial")
        try:
            with os.fdopen(handle, "wb") as f:
                np.savez(f, meta=np.array(meta), x_train=dataset.x_train,
                         y_train=dataset.y_train, x_test=dataset.x_test, y_test=dataset.y_test)
            os.replace(temporary, target)
        finally:
            if os.path.exists(temporary):
                os.remove(temporary)
    except OSError:
        pass

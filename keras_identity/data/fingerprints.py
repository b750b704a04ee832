"""What a dataset was read from, for a run's identity
(:attr:`~keras_identity.data.image_dataset.ImageDataset.fingerprint`): a
digest of a file's bytes, or of an image-folder tree's listing."""

import hashlib
import os


def _walk(top, depth=0):
    """``os.walk(top)`` (top-down, sorted), following the links to folders
    that the listing of an image-folder tree follows
    (:mod:`~keras_identity.data.image_folders`: split and class folders,
    ``depth`` 0 and 1) and no others."""
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


def file_sha256(path):
    """The SHA-256 of the bytes of the local file ``path``, in hex."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def bytes_fingerprint(data):
    """The digest of the bytes ``data`` as :func:`fingerprint` gives a
    file's (an archive read into memory once, then decoded)."""
    return f"sha256:{hashlib.sha256(data).hexdigest()}"


def fingerprint(path):
    """A digest of the data at ``path``: SHA-256 of a file's bytes, or of a
    folder's relative paths, sizes and modification times (a changed, added
    or removed image changes it; images in a linked class folder too)."""
    if os.path.isfile(path):
        return f"sha256:{file_sha256(path)}"
    digest = hashlib.sha256()
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

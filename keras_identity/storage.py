"""Where a run's files live: a local folder or a bucket (``gs://``, ``s3://``).

Every file a run, a search or an export writes and reads (the lock, the run's identity
and settings, checkpoints and their state, the history and its curves, TensorBoard logs,
``model.keras``, the tuner's files, a SavedModel) goes through this module, so that
``--model_dir=gs://BUCKET/run`` keeps all of them in the bucket, on either Keras
backend, with or without TensorFlow.

Object stores are reached through fsspec (gcsfs for ``gs://``, s3fs for ``s3://`` where
it is installed), the maintained layer of the Python data libraries, on either backend
and without TensorFlow (whose own file system reaches a bucket only where TensorFlow is
installed, with an emulator setting of its own).  The stores' transient errors are
retried by gcsfs/s3fs, not here.  Only calls that take a path literally are used (never
fsspec's globbing ``mv``/``rm``/``copy``: a run named ``exp[12]`` must not touch
``exp1``).  Local paths stay on the operating system's calls, because there links, FIFOs
and atomic renames matter (a run refuses a linked checkpoint folder; a file appears
whole by ``os.replace``); an object store has none of these, and an object appears whole
when its upload ends.

The clients that reach the stores, the GCS emulator's settings and the bound on a store
that stops answering are :mod:`keras_identity.store_clients`'s; here a call that passed
its bound is one :class:`StorageError` line naming the path (:func:`stalled`: a run's
checkpoint then fails in one line, and the run exits).

One module, one concept, past 600 lines: the file layer is a flat list of short calls
(exists, read, write, rename, remove, upload, ...) that each pair a local branch with a
bucket branch over the same error wording; split by call they would share this module's
private state (the error translation) instead of public functions.
"""

import asyncio
import contextlib
import errno
import json
import math
import os
import posixpath
import re
import shutil
import stat
import tempfile
import unicodedata

from keras_identity import store_clients

class StorageError(OSError):
    """A file of a run could not be read or written; the message is one line
    naming the path and what failed (``str()`` is that line)."""

    def __str__(self):
        return str(self.strerror)


def is_stalled(path):
    """Whether a call of ``path``'s store timed out in this process."""
    return is_remote(path) and store_clients.has_stalled(bucket_of(path))


def stalled(path, doing, waited):
    """The :class:`StorageError` of ``doing`` (``"writing"``, ...) ``path``,
    which the store left unanswered for ``waited`` seconds; later calls of
    that store in this process wait less (``store_clients.call_deadline``).
    For the other layers that reach a store (Orbax's TensorStore) too."""
    if is_remote(path):
        store_clients.note_stall(bucket_of(path))
    return StorageError(
        errno.ETIMEDOUT, f"{doing} {path} failed: the store did not answer in {waited:g} s "
                         f"({store_clients.STORE_TIMEOUT_VARIABLE}="
                         f"{store_clients.store_timeout():g} s a request, retried); check "
                         f"that the bucket answers")


def scheme(path):
    """``'gs'``, ``'s3'``, ... for a URL; None for a local path."""
    path = os.fspath(path)
    head, sep, _ = path.partition("://")
    if not sep or not head.isalnum() or head == "file":
        return None
    return head.lower()


def is_remote(path):
    """Whether ``path`` is in an object store (``gs://``, ``s3://``)."""
    return scheme(path) is not None


def check_path(path, name="model_dir"):
    """Refuses (``ValueError``, one line naming ``name``) a URL of a store
    this package cannot reach, or one whose client is not installed; a
    store's name mistyped so that it would be a local folder (``gs:/b/x``,
    ``gs:b/x``); and a bucket path that other spellings also name: an
    upper-case scheme, empty, ``.`` or ``..`` parts (``gs://b//x``,
    ``gs://b/./x``, ``gs://b/a/../x``), which the stores take literally as
    object names while :func:`normalize` folds them; and a path with a
    control character (a newline pasted into a flag), on a disk or in a
    bucket: files named with it break every line that names them."""
    path = os.fspath(path)
    control = next((i for i, c in enumerate(path)
                    if unicodedata.category(c) in ("Cc", "Zl", "Zp")), None)
    if control is not None:
        raise ValueError(f"{name}={path!r} holds a control character ({path[control]!r} at "
                         f"position {control}); expected a path without control characters")
    typo = re.match(r"([A-Za-z][A-Za-z0-9]*):(?!//)", path)
    if typo and typo.group(1).lower() in store_clients.PACKAGES:
        meant = f"{typo.group(1).lower()}://{path[typo.end():].lstrip('/')}"
        raise ValueError(f"{name}={path!r} is not a bucket URL ({typo.group(0)} takes "
                         f"'//') and would be a local folder {path.split('/', 1)[0]!r}; "
                         f"expected {meant} (a local folder of that name: ./{path})")
    found = scheme(path)
    if found is None:
        return
    if found not in store_clients.PACKAGES:
        raise ValueError(f"{name}={path!r}: {found}:// is not a store this package writes to; "
                         f"expected a local path, gs://BUCKET/... or s3://BUCKET/...")
    head, rest = path.split("://", 1)
    if head != found:
        raise ValueError(f"{name}={path!r}: a bucket URL's scheme is in lower case; expected "
                         f"{found}://{rest}")
    bucket, _, objects = rest.partition("/")
    if not bucket:
        raise ValueError(f"{name}={path!r} names no bucket; expected {found}://BUCKET/path")
    parts = objects[:-1].split("/") if objects.endswith("/") else objects.split("/")
    if objects and any(part in ("", ".", "..") for part in parts):
        meant = normalize(path)
        if bucket_of(meant) != bucket_of(path):   # above the bucket
            meant = f"{found}://{bucket}/<path> without them"
        raise ValueError(f"{name}={path!r}: a bucket path has no empty, '.' or '..' parts "
                         f"(the store would take them as object names); expected {meant}")
    if found == "gs" and not (
            re.fullmatch(r"[a-z0-9][a-z0-9._-]{1,220}[a-z0-9]", bucket)
            and ("." in bucket or len(bucket) <= 63)
            and all(0 < len(part) <= 63 for part in bucket.split("."))):
        raise ValueError(f"{name}={path!r}: {bucket!r} is not a GCS bucket name; expected 3 "
                         f"to 63 lowercase letters, digits, dashes, underscores or dots (up "
                         f"to 222 with dots, 63 between two), starting and ending with a "
                         f"letter or digit")
    store_clients.filesystem(found, name)


# The longest object name each store takes, in UTF-8 bytes (GCS's and S3's
# documented limits), and the store's name for messages.
MAX_OBJECT_NAME_BYTES = {"gs": (1024, "GCS"), "s3": (1024, "S3")}


def check_object_names(path, relative_names, name="model_dir"):
    """Refuses (``ValueError``, one line naming ``name``, the store's limit
    and the longest name) a folder ``path`` in a bucket where one of the
    ``relative_names`` a run writes under it would pass the store's limit
    on an object's name; a store would refuse that file only when it is
    written, after the run trained for it.  Local paths pass."""
    found = scheme(path)
    if found not in MAX_OBJECT_NAME_BYTES:
        return
    limit, store = MAX_OBJECT_NAME_BYTES[found]
    prefix = os.fspath(path).split("://", 1)[1].partition("/")[2].rstrip("/")
    relative = max(relative_names, key=lambda relative: len(relative.encode()))
    size = len(posixpath.join(prefix, relative).encode())
    if size > limit:
        raise ValueError(f"{name}={path!r} is too long for {store}: the run's file {relative!r} "
                         f"there would be an object named with {size:,} bytes, past {store}'s "
                         f"limit of {limit:,}; expected a {name} whose path in the bucket "
                         f"takes at most {limit - len(relative.encode()) - 1:,} bytes")


def join(base, *parts):
    if is_remote(base):
        return posixpath.join(base, *parts)
    return os.path.join(base, *parts)


def basename(path):
    return posixpath.basename(path.rstrip("/")) if is_remote(path) else os.path.basename(path)


def dirname(path):
    return posixpath.dirname(path.rstrip("/")) if is_remote(path) else os.path.dirname(path)


def normalize(path):
    """A path's canonical spelling (for comparing and digesting)."""
    if is_remote(path):
        head, rest = path.split("://", 1)
        return f"{head.lower()}://{posixpath.normpath(rest)}"
    return os.path.normpath(path)


def call_deadline(path):
    """The seconds one call of this module on ``path`` (in a bucket) may
    wait (``store_clients.call_deadline``)."""
    return store_clients.call_deadline(bucket_of(path))


def _fs(path):
    return store_clients.bounded(scheme(path), bucket_of(path))


def describe(error):
    """What went wrong, in a few words, for a one-line message."""
    text = " ".join(str(getattr(error, "strerror", None) or error).split())
    name = type(error).__name__
    lowered = (text + " " + name).lower()
    if "defaultcredentials" in lowered or "could not automatically determine credentials" \
            in lowered:
        return "no Google Cloud credentials were found (gcloud auth application-default login)"
    if "401" in text or "unauthorized" in lowered or "anonymous caller" in lowered:
        return "not signed in, or the credentials are not accepted (401)"
    if "403" in text or "forbidden" in lowered or "permission" in lowered:
        return f"no permission ({text[:160]})"
    if "cannot connect" in lowered or "connection refused" in lowered or "name or service" \
            in lowered or "clientconnector" in lowered or "timeout" in lowered:
        return f"the store cannot be reached ({text[:160]})"
    return (text or name)[:200]


def bucket_of(path):
    head, rest = path.split("://", 1)
    return f"{head}://{rest.split('/', 1)[0]}"


@contextlib.contextmanager
def remote_errors(path, doing):
    """Turns a store's exceptions raised within into one :class:`StorageError`
    line naming ``doing`` (``"listing"``, ...) and ``path``: for this module's
    calls, and for another layer's calls of the same store (Orbax's listing
    through etils.epath, whose timeout is fsspec's ``FSTimeoutError``, with
    no message of its own)."""
    try:
        yield
    except StorageError:
        raise
    except FileNotFoundError as error:
        if _bucket_missing(path):
            raise StorageError(errno.ENOENT, f"the bucket {bucket_of(path)} does not exist (or "
                                             f"this account cannot see it); {doing} {path} "
                                             f"failed") from None
        raise FileNotFoundError(errno.ENOENT, f"{path} does not exist") from error
    except asyncio.TimeoutError:  # fsspec's FSTimeoutError: the call's deadline passed
        raise stalled(path, doing, call_deadline(path)) from None
    except Exception as error:  # gcsfs/aiohttp/google.auth errors
        raise StorageError(errno.EIO, f"{doing} {path} failed: {describe(error)}") from None


def _bucket_missing(path):
    try:
        return not _fs(path).exists(bucket_of(path))
    except Exception:  # noqa: BLE001 - an unreachable store: not "missing"
        return False


def exists(path):
    if not is_remote(path):
        return os.path.lexists(path)
    with remote_errors(path, "looking up"):
        return _fs(path).exists(path)


def _remote_type(path):
    """``"file"``, ``"directory"`` or None (missing) for a path in a store;
    an unreachable store raises (fsspec's ``isfile``/``isdir`` would answer
    False, and a run would take its checkpoints for missing)."""
    with remote_errors(path, "looking up"):
        try:
            return _fs(path).info(path.rstrip("/")).get("type")
        except FileNotFoundError:
            return None


def isdir(path):
    if not is_remote(path):
        return os.path.isdir(path)
    return _remote_type(path) == "directory"


def isfile(path):
    """Whether ``path`` is a regular file (locally, itself: not a link, FIFO
    or folder)."""
    if not is_remote(path):
        try:
            return stat.S_ISREG(os.lstat(path).st_mode)
        except OSError:
            return False
    return _remote_type(path) == "file"


def islink(path):
    return not is_remote(path) and os.path.islink(path)


def kind(path):
    """What ``path`` is, in words, for a message."""
    if is_remote(path):
        return {"file": "a file", "directory": "a folder"}.get(_remote_type(path), "missing")
    try:
        mode = os.lstat(path).st_mode
    except OSError:
        return "missing"
    if stat.S_ISLNK(mode):
        target = os.readlink(path)
        return (f"a symbolic link to {target}" if os.path.exists(path) else
                f"a symbolic link to {target}, which does not exist")
    for test, words in ((stat.S_ISDIR, "a folder"), (stat.S_ISFIFO, "a FIFO"),
                        (stat.S_ISSOCK, "a socket"), (stat.S_ISCHR, "a device"),
                        (stat.S_ISBLK, "a device"), (stat.S_ISREG, "a file")):
        if test(mode):
            return words
    return "not a regular file"


def makedirs(path):
    """Creates a local folder (with its parents); nothing in an object store,
    where folders are only the names' prefixes."""
    if not is_remote(path):
        os.makedirs(path, exist_ok=True)


def listdir(path):
    """The names in folder ``path`` (sorted; empty when it does not exist)."""
    if not is_remote(path):
        try:
            return sorted(os.listdir(path))
        except FileNotFoundError:
            return []
    with remote_errors(path, "listing"):
        try:
            entries = _fs(path).ls(path.rstrip("/"), detail=False, refresh=True)
        except FileNotFoundError:
            if _bucket_missing(path):
                raise
            return []
    return sorted({posixpath.basename(e.rstrip("/")) for e in entries} - {""})


def read_bytes(path):
    if not is_remote(path):
        with open(path, "rb") as f:
            return f.read()
    with remote_errors(path, "reading"):
        return _fs(path).cat_file(path)


def read_text(path):
    return read_bytes(path).decode("utf-8")


def read_json(path):
    return json.loads(read_text(path))


def write_bytes(path, data):
    """Writes ``data`` to ``path`` all at once: a reader never sees half a
    file, and a failed write leaves the previous file (locally through a
    temporary file renamed over ``path``; an object appears when its upload
    ends)."""
    if is_remote(path):
        with remote_errors(path, "writing"):
            _fs(path).pipe_file(path, bytes(data))
        return
    temporary = f"{path}.partial"
    try:
        with open(temporary, "wb") as f:
            f.write(data)
        os.replace(temporary, path)
    except BaseException:
        if os.path.lexists(temporary):
            os.remove(temporary)
        raise


def write_text(path, text):
    write_bytes(path, text.encode("utf-8"))


def _finite(value):
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(v) for v in value]
    return value


def write_json(path, value, indent=1):
    """Writes ``value`` to ``path`` as JSON all at once (:func:`write_bytes`).
    NaN and infinities become ``null`` (JSON has no such numbers)."""
    write_text(path, json.dumps(_finite(value), indent=indent, allow_nan=False))


def create_new(path, data):
    """Writes ``data`` to ``path`` only if nothing is there; returns whether it
    did.  Atomic against another process doing the same: ``O_EXCL`` on a
    local disk, the store's create-if-absent precondition in a bucket (GCS:
    generation match 0)."""
    if not is_remote(path):
        try:
            descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        except FileExistsError:
            return False
        with os.fdopen(descriptor, "wb") as f:
            f.write(data)
        return True
    with remote_errors(path, "creating"):
        try:
            _fs(path).pipe_file(path, bytes(data), mode="create")
        except FileExistsError:
            return False
        except OSError as error:
            if "412" in str(error) or "precondition" in str(error).lower():
                return False
            raise
    return True


def generation(path):
    """The store's version of object ``path`` (GCS's generation; a local
    file's modification time in nanoseconds and its inode: a file system's
    clock may tick once in a few milliseconds, and a rewrite by
    :func:`write_bytes` within one tick is known by its new inode), or None
    when it is missing.  For comparing for equality only."""
    if not is_remote(path):
        try:
            found = os.stat(path)
        except FileNotFoundError:
            return None
        return f"{found.st_mtime_ns}.{found.st_ino}"
    with remote_errors(path, "looking up"):
        try:
            info = _fs(path).info(path, refresh=True)
        except FileNotFoundError:
            return None
    return info.get("generation") or info.get("ETag") or info.get("mtime")


def remove(path, missing_ok=True):
    if not is_remote(path):
        try:
            os.remove(path)
        except FileNotFoundError:
            if not missing_ok:
                raise
        return
    with remote_errors(path, "removing"):
        try:
            _fs(path).rm_file(path)
        except FileNotFoundError:
            if not missing_ok:
                raise


def remove_if_unchanged(path, version):
    """Removes ``path`` only if its :func:`generation` is still ``version``;
    returns whether it did.  In GCS the delete carries the precondition
    (``ifGenerationMatch``), so of two processes only one removes what both
    read; elsewhere the check and the delete are two steps."""
    if scheme(path) != "gs":
        if generation(path) != version:
            return False
        remove(path)
        return True
    fs = _fs(path)
    bucket, key = path.split("://", 1)[1].split("/", 1)
    with remote_errors(path, "removing"):
        try:
            fs.call("DELETE", "b/{}/o/{}", bucket, key, ifGenerationMatch=str(version))
        except (FileExistsError, FileNotFoundError):  # 412: changed; 404: gone
            return False
        finally:
            fs.invalidate_cache(path)
    return True


def rename(source, target):
    """Moves ``source`` to ``target`` (locally an atomic rename, over
    ``target``; in a store a copy and a delete)."""
    if not is_remote(source):
        os.replace(source, target)
        return
    with remote_errors(source, "moving"):
        fs = _fs(source)
        fs.cp_file(source, target)
        fs.rm_file(source)


def rename_folder(source, target):
    """Moves folder ``source`` to ``target`` (locally an atomic rename; in a
    store each file's copy and delete, names taken literally)."""
    if not is_remote(source):
        os.replace(source, target)
        return
    for relative in list_files(source):
        rename(join(source, relative), join(target, relative))


def rmtree(path):
    """Removes folder ``path`` and everything in it (nothing else: names
    are taken literally)."""
    if not is_remote(path):
        shutil.rmtree(path, ignore_errors=True)
        return
    for relative in list_files(path):
        remove(join(path, relative))


def free_bytes(path):
    """Free space where ``path`` is written (None: not known, an object
    store); the nearest existing folder above ``path`` is asked."""
    if is_remote(path):
        return None
    while path and not os.path.isdir(path):
        parent = os.path.dirname(path)
        if parent == path:
            break
        path = parent
    return shutil.disk_usage(path or ".").free


def upload(local_path, path):
    """Copies the local file ``local_path`` to ``path`` (any store)."""
    if not is_remote(path):
        if os.path.abspath(local_path) != os.path.abspath(path):
            with open(local_path, "rb") as f:
                write_bytes(path, f.read())
        return
    with remote_errors(path, "writing"):
        _fs(path).put_file(local_path, path)


def size(path):
    """The bytes of file ``path`` (any store)."""
    if not is_remote(path):
        return os.path.getsize(path)
    with remote_errors(path, "reading"):
        return int(_fs(path).size(path))


def _stamp(local_path):
    """What tells a local file's versions apart: its size and modification
    time (a rewrite of the same length, as Keras Tuner's JSON files have,
    changes the second)."""
    found = os.stat(local_path)
    return found.st_size, found.st_mtime_ns


def upload_tree(local_dir, path, stamps=None, last=()):
    """Copies the files under ``local_dir`` to ``path`` that are new or have
    changed (:func:`_stamp`) since the last call with the same ``stamps``
    dict (relative path -> stamp), which it returns updated.  The relative
    paths in ``last`` go after the others, in that order (what names the
    other files comes after them)."""
    stamps = {} if stamps is None else stamps
    found = {relative: _stamp(os.path.join(local_dir, *relative.split("/")))
             for relative in list_files(local_dir)}
    changed = sorted((r for r, stamp in found.items() if stamps.get(r) != stamp),
                     key=lambda r: (last.index(r) + 1 if r in last else 0, r))
    for relative in changed:
        upload(os.path.join(local_dir, *relative.split("/")), join(path, relative))
        stamps[relative] = found[relative]
    return stamps


def download_tree(path, local_dir, skip=None):
    """Copies every file under ``path`` (any store) into ``local_dir``, but
    those whose relative path ``skip`` is true for; returns the stamps dict
    :func:`upload_tree` takes, so that what was just downloaded is not
    uploaded back."""
    stamps = {}
    for relative in list_files(path):
        if skip is not None and skip(relative):
            continue
        target = os.path.join(local_dir, *relative.split("/"))
        os.makedirs(os.path.dirname(target), exist_ok=True)
        if not is_remote(path):
            shutil.copyfile(join(path, relative), target)
        else:
            with remote_errors(path, "reading"):
                _fs(path).get_file(join(path, relative), target)
        stamps[relative] = _stamp(target)
    return stamps


def list_files(path):
    """The files under folder ``path`` (any store), as sorted ``/``-separated
    paths relative to it (empty when it does not exist)."""
    if not is_remote(path):
        found = []
        for root, _, names in os.walk(path):
            found += [os.path.relpath(os.path.join(root, n), path).replace(os.sep, "/")
                      for n in names]
        return sorted(found)
    with remote_errors(path, "listing"):
        root = path.split("://", 1)[1].rstrip("/")
        try:
            found = _fs(path).find(root, detail=True)
        except FileNotFoundError:
            return []
    return sorted(name[len(root):].lstrip("/") for name, info in found.items()
                  if info.get("type") != "directory" and name[len(root):].lstrip("/"))


@contextlib.contextmanager
def local_copy(path, suffix=""):
    """Yields a local path holding ``path``, a file or a folder (``path``
    itself when it is local), for libraries that read only local files."""
    if not is_remote(path):
        yield path
        return
    with tempfile.TemporaryDirectory(prefix="keras_identity_") as folder:
        local = os.path.join(folder, basename(path) + suffix)
        if _remote_type(path) == "directory":
            download_tree(path, local)
        else:
            with open(local, "wb") as f:
                f.write(read_bytes(path))
        yield local


@contextlib.contextmanager
def staged(path):
    """Yields a local path to write ``path`` to (``path`` itself when it is
    local); uploaded when the block ends without an error."""
    if not is_remote(path):
        yield path
        return
    with tempfile.TemporaryDirectory(prefix="keras_identity_") as folder:
        local = os.path.join(folder, basename(path))
        yield local
        if os.path.isdir(local):
            upload_tree(local, path)
        else:
            upload(local, path)


def check_writable(directory, name="model_dir"):
    """Creates ``directory`` if needed and writes a file into it; raises
    ``ValueError`` in one line when it cannot (``name``: the flag, or the
    folder's role, the line names): a missing bucket, no credentials or
    permission, a read-only folder."""
    check_path(directory, name)
    probe = join(directory, f".write_test.{os.getpid()}")
    try:
        makedirs(directory)
        # One name per process: two runs starting together never share it.
        write_bytes(probe, b"ok")
        remove(probe)
    except StorageError as error:
        raise ValueError(f"{name}={directory!r} cannot be written: {error.strerror}") from None
    except OSError as error:
        raise ValueError(f"{name}={directory!r} is not a writable directory "
                         f"({error.strerror or type(error).__name__}); the run writes there: "
                         f"make it writable, or use a new --model_dir.") from None

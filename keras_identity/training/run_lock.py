"""One training at a time in a ``model_dir``.

Two trainings writing one directory's checkpoints corrupt each other's runs,
so :func:`keras_identity.training.train` holds a lock on ``<model_dir>/.lock``
while it runs.

On a local disk the lock is the kernel's (``flock``): it ends with the
process that holds it, so a killed run never leaves it behind, and the file
itself only names the last holder.  On systems without ``fcntl`` (Windows)
nothing is locked.

In a bucket there is no such lock, so the lock is the object itself, made
with the store's create-if-absent precondition (:func:`storage.create_new`:
GCS's generation match 0), which exactly one of two runs starting together
wins.  It is a lease: the run renews it every :data:`RENEW_SECONDS` from a
thread and deletes it when it ends (also when a stop signal ends it), and a
lock not renewed for :data:`LEASE_SECONDS` (its machine lost without
warning) is taken over by the next run, which says so: it deletes the lock
it read only if the lock is still that version (GCS: the delete's
generation precondition), so of two runs taking over one, one does.  A
holder renews only a lock that is still its own, and warns once when it
finds it taken.  The renewal times are the holders' clocks.
"""

import json
import os
import socket
import threading
import time
import uuid
import warnings

from keras_identity import storage

try:
    import fcntl
except ImportError:  # pragma: no cover - Windows
    fcntl = None

LOCK_FILE = ".lock"
LEASE_SECONDS = 120.0
RENEW_SECONDS = 30.0


def _holder():
    return f"pid {os.getpid()} on {socket.gethostname()}"


class RunLock:
    """An exclusive lock on a model directory; :meth:`acquire` raises
    ``ValueError`` (naming the directory and the holder) when another
    process holds it."""

    def __init__(self, model_dir):
        self.model_dir = model_dir
        self.path = storage.join(model_dir, LOCK_FILE)
        self._file = None
        self._token = None
        self._stop = None
        self._thread = None

    def acquire(self):
        if storage.is_remote(self.path):
            return self._acquire_lease()
        if fcntl is None or self._file is not None:
            return self
        try:
            handle = open(self.path, "a+")
        except OSError as error:
            kind = "a directory" if os.path.isdir(self.path) else "not a writable file"
            raise ValueError(f"{self.path} is {kind} ({error.strerror or type(error).__name__}"
                             f"); it is the run's lock file: remove it (no training uses it "
                             f"then) or use a new --model_dir.") from None
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            handle.seek(0)
            holder = handle.read().strip() or "another process"
            handle.close()
            raise ValueError(f"model_dir={self.model_dir!r} is in use by another training "
                             f"({holder}); wait for it to end, or use a new --model_dir.") \
                from None
        handle.seek(0)
        handle.truncate()
        handle.write(f"{_holder()}\n")
        handle.flush()
        self._file = handle
        return self

    def _record(self):
        return json.dumps({"holder": _holder(), "token": self._token,
                           "renewed": time.time()}).encode()

    def _acquire_lease(self):
        if self._token is not None:
            return self
        self._token = uuid.uuid4().hex
        for attempt in range(3):
            if storage.create_new(self.path, self._record()):
                break
            version = storage.generation(self.path)
            try:
                held = json.loads(storage.read_bytes(self.path))
                holder, age = held["holder"], time.time() - float(held["renewed"])
            except FileNotFoundError:
                continue  # released meanwhile
            except (ValueError, KeyError, TypeError):  # a local run's lock, copied up
                holder, age = None, None
            if attempt == 2 or (age is not None and age <= LEASE_SECONDS):
                self._token = None
                raise ValueError(
                    f"model_dir={self.model_dir!r} is in use by another training ({holder}, "
                    f"renewed {max(age or 0, 0):.0f} s ago); wait for it to end, or use a new "
                    f"--model_dir (a lock not renewed for {LEASE_SECONDS:.0f} s is taken "
                    f"over).")
            print(f"taking over the lock {self.path}: " + (
                f"{holder} has not renewed it for {age:.0f} s (its machine was lost)"
                if holder else "it is not a lease this package writes (a local run's lock "
                               "copied into the bucket)"))
            storage.remove_if_unchanged(self.path, version)  # another run may be first
        else:
            self._token = None
            raise ValueError(f"model_dir={self.model_dir!r}: the lock {self.path} could not "
                             f"be taken; run the same command again.")
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._renew, args=(self._stop,), daemon=True,
                                        name="keras_identity_run_lock")
        self._thread.start()
        return self

    def _renew(self, stop):
        while not stop.wait(RENEW_SECONDS):
            try:
                held = json.loads(storage.read_bytes(self.path))
                if held.get("token") != self._token:
                    warnings.warn(f"the lock {self.path} was taken over by {held.get('holder')} "
                                  f"(this run did not renew it for {LEASE_SECONDS:.0f} s); two "
                                  f"runs now write {self.model_dir}: stop one.", stacklevel=1)
                    return
                if not stop.is_set():
                    storage.write_bytes(self.path, self._record())
            except (OSError, ValueError, AttributeError):  # the next renewal tries again
                pass

    def release(self):
        if self._stop is not None:
            self._stop.set()
            self._stop = None
            self._thread.join(timeout=60)  # a renewal in flight ends before the delete
            try:
                held = json.loads(storage.read_bytes(self.path))
                if held.get("token") == self._token:
                    storage.remove(self.path)
            except (OSError, ValueError, AttributeError):
                pass
            self._token = None
        if self._file is not None:
            fcntl.flock(self._file, fcntl.LOCK_UN)
            self._file.close()
            self._file = None

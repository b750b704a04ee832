"""One training at a time in a ``model_dir``.

Two trainings writing one directory's checkpoints corrupt each other's runs,
so :func:`keras_identity.training.train` holds an advisory lock on
``<model_dir>/.lock`` while it runs.  The lock is the kernel's (``flock``):
it ends with the process that holds it, so a killed run never leaves it
behind, and the file itself only names the last holder.  On systems without
``fcntl`` (Windows) nothing is locked.
"""

import os
import socket

try:
    import fcntl
except ImportError:  # pragma: no cover - Windows
    fcntl = None

LOCK_FILE = ".lock"


class RunLock:
    """An exclusive lock on a model directory; :meth:`acquire` raises
    ``ValueError`` (naming the directory and the holder) when another
    process holds it."""

    def __init__(self, model_dir):
        self.model_dir = model_dir
        self.path = os.path.join(model_dir, LOCK_FILE)
        self._file = None

    def acquire(self):
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
        handle.write(f"pid {os.getpid()} on {socket.gethostname()}\n")
        handle.flush()
        self._file = handle
        return self

    def release(self):
        if self._file is not None:
            fcntl.flock(self._file, fcntl.LOCK_UN)
            self._file.close()
            self._file = None

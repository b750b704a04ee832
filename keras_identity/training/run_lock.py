"""One training at a time in a ``model_dir``.

Two trainings writing one directory's checkpoints corrupt each other's runs,
so :func:`keras_identity.training.train` holds a lock on ``<model_dir>/.lock``
while it runs.

On a local disk the lock is the kernel's (``flock``): it ends with the
process that holds it, so a killed run never leaves it behind, and the file
itself only names the last holder.  On systems without ``fcntl`` (Windows)
nothing is locked.

In a bucket the lock is the object itself, made with the store's create-if-absent
precondition (:func:`storage.create_new`: GCS's generation match 0), which exactly one
of two runs starting together wins.  It is a lease: the run renews it every
:data:`RENEW_SECONDS` from a thread and deletes it when it ends (a stop signal
included); a lock not renewed for :data:`LEASE_SECONDS` (its machine lost without
warning) is taken over by the next run, which says so and deletes the lock it read
only if it is still that version (the delete's generation precondition), so of two
runs taking over one, one does.  A holder renews only a lock still its own, and warns
once when it finds it taken or gone (and renews it no more).

The renewal times are the holders' clocks.  One ahead of this host's by more than
:data:`CLOCK_TOLERANCE_SECONDS` (another host's fast clock, a hand-edited lock) says
nothing this host can measure, so the run watches the lock's generation for up to
:data:`LEASE_SECONDS` of its own monotonic clock: a live holder renews it within
:data:`RENEW_SECONDS`, and the run is refused; a lock unchanged that long is taken
over, as a lapsed lease is.  (Watching, unlike remembering a first sight across runs,
uses no clock but this host's: a lock ahead by hours delays a run by
:data:`LEASE_SECONDS` at most.)

**Two writers never go on silently.**  Before each checkpoint the run checks that its
lock is still its own (:meth:`RunLock.lost`, through :meth:`RunLock.guard`): in a
bucket, that ``.lock`` still holds this run's token (the renewal thread's finding
too); on a local disk, that ``.lock`` is still the file this run holds the ``flock``
of (a deleted ``.lock`` lets the next run lock a new file).  A lock gone or taken
stops the run before it writes that checkpoint: :class:`LockLost`, a
:class:`~keras_identity.training.preemption.Stopped`, which ``keras-identity-train``
reports in one line with status 75.
"""

import json
import os
import socket
import threading
import time
import uuid
import warnings

from keras_identity import storage
from keras_identity.training import preemption

try:
    import fcntl
except ImportError:  # pragma: no cover - Windows
    fcntl = None

LOCK_FILE = ".lock"
LEASE_SECONDS = 120.0
RENEW_SECONDS = 30.0
# A renewal time ahead of this host's clock by at most this much (clocks a
# little apart) counts as "renewed now"; further ahead, the lock is watched.
CLOCK_TOLERANCE_SECONDS = 5.0
WATCH_SECONDS = 2.0  # how often a watched lock's generation is read


class LockLost(preemption.Stopped):
    """The run's lock is gone or taken by another run: the run stopped
    before writing the checkpoint of ``step`` (another training may be
    writing the directory).  A :class:`~keras_identity.training.preemption.Stopped`
    (``keras-identity-train``: one line, status 75), with its attributes."""

    def __init__(self, what, step, epoch, directory):
        self.signal_name, self.step, self.epoch = None, int(step), int(epoch)
        self.directory, self.saved, self.what = directory, False, what
        BaseException.__init__(self, f"{what}; make sure no other training writes there, "
                                     f"then run the same command to resume")


def _holder():
    return f"pid {os.getpid()} on {socket.gethostname()}"


def held_here(model_dir):
    """Whether this process holds the lock of ``model_dir`` (its
    :data:`LOCK_FILE` names the holder: a line on a disk, a lease's
    ``holder`` in a bucket); False where it cannot be read."""
    try:
        text = storage.read_text(storage.join(model_dir, LOCK_FILE)).strip()
    except (OSError, UnicodeDecodeError):
        return False
    try:
        held = json.loads(text)
    except ValueError:
        holder = text
    else:
        holder = held.get("holder") if isinstance(held, dict) else None
    return holder == _holder()


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
        self._lost = None  # why the renewals found the bucket lock not this run's

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
        self._lost = None
        for attempt in range(3):
            if storage.create_new(self.path, self._record()):
                break
            version = storage.generation(self.path)
            ahead = 0.0
            try:
                held = json.loads(storage.read_bytes(self.path))
                holder, age = held["holder"], time.time() - float(held["renewed"])
            except FileNotFoundError:
                continue  # released meanwhile
            except (ValueError, KeyError, TypeError):  # a local run's lock, copied up
                holder, age = None, None
            if age is not None and age < -CLOCK_TOLERANCE_SECONDS:
                ahead = -age
                age = self._watch(version, holder, ahead)
                if age == "gone":
                    continue  # released meanwhile
            if attempt == 2 or (age is not None and age <= LEASE_SECONDS):
                self._token = None
                skew = (f"; its clock is {ahead:.0f} s ahead of this host's" if ahead else "")
                raise ValueError(
                    f"model_dir={self.model_dir!r} is in use by another training ({holder}, "
                    f"renewed {max(age or 0, 0):.0f} s ago{skew}); wait for it to end, or use "
                    f"a new --model_dir (a lock not renewed for {LEASE_SECONDS:.0f} s is taken "
                    f"over).")
            print(f"taking over the lock {self.path}: " + (
                f"{holder} has not renewed it for {age:.0f} s (its machine was lost)"
                + (f"; the time it records is {ahead:.0f} s ahead of this host's clock"
                   if ahead else "")
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

    def _watch(self, version, holder, ahead):
        """How long (s, this host's monotonic clock) the lock stayed at
        ``version``: more than :data:`LEASE_SECONDS` (lapsed), 0 once it
        changes (renewed: its holder is alive), or ``"gone"``."""
        print(f"the lock {self.path} ({holder}) records a renewal {ahead:.0f} s ahead of this "
              f"host's clock: watching it for up to {LEASE_SECONDS:.0f} s (its holder, if "
              f"alive, renews it every {RENEW_SECONDS:.0f} s)", flush=True)
        started = time.monotonic()
        while True:
            time.sleep(min(WATCH_SECONDS, LEASE_SECONDS))
            try:
                current = storage.generation(self.path)
            except OSError:  # the store did not answer: the next look tries again
                current = version
            if current is None:
                return "gone"
            if current != version:
                return 0.0
            waited = time.monotonic() - started
            if waited > LEASE_SECONDS:
                return waited

    def _renew(self, stop):
        while not stop.wait(RENEW_SECONDS):
            try:
                lost = self._lost_because(self._held())
                if lost:
                    self._lost = lost
                    warnings.warn(f"{lost}: two runs may now write {self.model_dir}; this run "
                                  f"stops at its next checkpoint.", stacklevel=1)
                    return
                if not stop.is_set():
                    storage.write_bytes(self.path, self._record())
            except (OSError, ValueError, AttributeError):  # the next renewal tries again
                pass

    def _held(self):
        """The bucket lock's contents (None: gone)."""
        try:
            return json.loads(storage.read_bytes(self.path))
        except FileNotFoundError:
            return None
        except ValueError:  # not JSON: not this run's lease
            return {"holder": "another writer (not a lease)"}

    def _lost_because(self, held):
        """Why the bucket lock ``held`` (its parsed contents; None: gone) is
        no longer this run's, or None while it is."""
        if held is None:
            return f"the lock {self.path} was deleted while this run held it"
        token = held.get("token") if isinstance(held, dict) else None
        if token != self._token:
            holder = held.get("holder") if isinstance(held, dict) else None
            return (f"the lock {self.path} was taken over by {holder or 'another writer'} "
                    f"(this run did not renew it for {LEASE_SECONDS:.0f} s, or it was "
                    f"replaced)")
        return None

    def lost(self):
        """Why this run's lock is no longer its own (gone, or taken by
        another run), in words; None while it holds it (or when that cannot
        be told now: a store that does not answer, a system without
        ``fcntl``)."""
        if self._token is not None:
            try:
                held = self._held()
            except (OSError, AttributeError):  # unanswered: the renewals' finding
                return self._lost
            return self._lost_because(held) or self._lost
        if self._file is None:
            return None
        try:
            found = os.stat(self.path)
        except FileNotFoundError:
            return f"the lock {self.path} was deleted while this run held it"
        except OSError:
            return None
        mine = os.fstat(self._file.fileno())
        if (found.st_dev, found.st_ino) == (mine.st_dev, mine.st_ino):
            return None
        try:
            with open(self.path) as f:
                holder = f.read().strip()
        except OSError:
            holder = ""
        return (f"the lock {self.path} was replaced (deleted while this run held it) and is "
                f"now {'held by ' + holder if holder else 'another file'}")

    def guard(self, checkpointer):
        """``checkpointer``, whose ``save`` first checks that this lock is
        still this run's, and raises :class:`LockLost` before writing when
        it is not."""
        return _Guarded(self, checkpointer)

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
            self._lost = None
        if self._file is not None:
            fcntl.flock(self._file, fcntl.LOCK_UN)
            self._file.close()
            self._file = None


class _Guarded:
    """A checkpointer whose ``save`` checks the run's lock first (the rest
    is the checkpointer's own)."""

    def __init__(self, lock, checkpointer):
        self._lock, self._checkpointer = lock, checkpointer

    def save(self, model, *, step, epoch, **kwargs):
        lost = self._lock.lost()
        if lost:
            raise LockLost(f"{lost}: this run stopped at step {int(step):,} without writing "
                           f"its checkpoint (another training may be writing "
                           f"{self._lock.model_dir})", step, epoch,
                           getattr(self._checkpointer, "directory", None))
        return self._checkpointer.save(model, step=step, epoch=epoch, **kwargs)

    def __getattr__(self, name):
        return getattr(self._checkpointer, name)

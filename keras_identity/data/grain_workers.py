"""The JAX route's image files decoded in worker processes, by Grain.

Decoding and augmenting a JPEG is Pillow and NumPy work that holds Python's GIL for much
of its time, so the threads of one process
(:class:`keras_identity.data.arrays.TrainBatches` reading in-memory arrays) do not scale
with a machine's cores.  Grain, the JAX ecosystem's loader, runs a dataset's
transformations in worker processes and hands their results back through shared memory
in order (``IterDataset.mp_prefetch``); it is used here for every stream read image by
image (image folders, tensorflow_datasets' random-access sources).

What Grain computes is :meth:`TrainBatches.global_batch
<keras_identity.data.arrays.TrainBatches.global_batch>` (or
``EvalBatches.global_batch``): one element is one batch (this process's rows of global
batch ``k``), a function of the run's seed and of ``k`` alone.  So the stream is the
threads' stream, bit for bit, whatever the number of workers; a resumed run starts a new
iterator at its step instead of restoring Grain's iterator state; and a file refused
inside a worker (:class:`keras_identity.data.errors.DataError`, one line naming the
file) is raised again, with the same type and message, by the call that asked for its
batch.

Each worker process imports keras_identity (and so Keras and its backend) to unpickle
the batch function, a second or two at the start of a stream.

Nothing is left behind (issue 61): a worker exits within a second of the training
process's death, however it died (SIGKILL included: a thread of the worker watches its
parent); the batches taken out of shared memory are unlinked at once, and those still
buffered when a stream is closed (or the program exits without closing it) are unlinked
by the close, so Python's resource tracker finds no "leaked shared_memory objects" at
exit.  A finite stream (``limit``) never lets a worker reach its end: the indices past
it give an empty element (Grain's end of a worker's slice is an exception whose
traceback keeps a batch alive until the garbage collector runs, after the program's
end).
"""

import atexit
import contextlib
import functools
import importlib.util
import os
import re
import threading
import time
import weakref

import numpy as np

# Batches each worker prepares ahead (Grain's per-worker buffer in shared memory).
BUFFER = 2
# How Grain reports a worker process that exited (failed to start, killed).
_WORKER_DIED = "Worker process was terminated unexpectedly with"
# How often a worker checks that the training process is still alive (seconds).
PARENT_CHECK = 0.5
# The streams whose workers are running (closed at the program's exit).
_OPEN = weakref.WeakSet()
_EXIT_HOOK = []


def available():
    """Whether Grain is installed (without importing it)."""
    return importlib.util.find_spec("grain") is not None


def _flags_parsed():
    """Grain 0.2.18 reads one of its absl flags when it starts workers, which
    raises in a program that never parsed absl's flags (a notebook, a script
    without ``absl.app``; google/grain#1355); the flags keep their defaults
    in such a program, so they are marked parsed there."""
    from absl import flags

    if not flags.FLAGS.is_parsed():
        flags.FLAGS.mark_as_parsed()


def _exit_with_parent(parent, worker_index=None, worker_count=None):
    """Grain's worker initialiser: a daemon thread ends this worker (status
    1) as soon as its parent, the training process ``parent``, is gone,
    even killed by SIGKILL.  (A parent-death signal, ``PR_SET_PDEATHSIG``,
    would fire when the *thread* that started the worker ends: Grain starts
    them from its own threads.)"""
    del worker_index, worker_count

    def watch():
        while os.getppid() == parent:
            time.sleep(PARENT_CHECK)
        os._exit(1)

    threading.Thread(target=watch, name="keras_identity_parent_watch", daemon=True).start()


class _Upto:
    """``make(i)`` below ``limit``, an empty element past it: a worker's
    slice of an endless range never ends (see the module's docstring)."""

    def __init__(self, make, limit):
        self.make, self.limit = make, limit

    def __call__(self, index):
        return self.make(index) if self.limit is None or index < self.limit else ()


def _shared_memory_array():
    """Grain's class of the arrays it hands out of shared memory (None when
    this Grain version has none there)."""
    try:
        from grain._src.python.ipc import shared_memory_array
    except ImportError:
        return None
    return getattr(shared_memory_array, "SharedMemoryArray", None)


def _unlink(parts):
    """Unlinks the shared memory of ``parts`` (Grain's arrays, already
    copied out) now: the mapping goes with the arrays, whenever Grain's
    deleting thread gets to them, but the name is gone whatever happens."""
    for part in parts:
        shm = getattr(part, "shm", None)
        if shm is not None and getattr(part, "_unlink_on_del", False):
            part._unlink_on_del = False
            with contextlib.suppress(FileNotFoundError):
                shm.unlink()


@contextlib.contextmanager
def _synchronous_deletes():
    """Grain deletes the shared memory of a dropped array in a thread pool;
    a pool's work still queued at the program's exit is never done (and
    reported as leaked).  Inside this block the arrays dropped (by a close)
    are deleted at once."""
    kind = _shared_memory_array()
    pool = getattr(kind, "_del_thread_pool", None)
    if pool is None:
        yield
        return
    kind._del_thread_pool = None
    try:
        yield
    finally:
        kind._del_thread_pool = pool


def _close_open():
    for prefetcher in list(_OPEN):
        prefetcher.close()


class Prefetcher:
    """``make(i)`` for ``i = index, index + 1, ...``, computed ahead in
    ``workers`` processes, in order.

    ``make`` must pickle (it is sent to each worker).  Asking for an index
    other than the next one starts the workers again there; ``limit``
    (None: endless) is one past the last index.
    """

    def __init__(self, make, workers, limit=None):
        if workers < 1:
            raise ValueError(f"workers={workers!r} is not valid; expected 1 or more.")
        self._make = make
        self._workers = int(workers)
        self._limit = limit
        self._iterator = None
        self._next = None

    def _start(self, index):
        import grain

        _flags_parsed()
        self.close()
        dataset = grain.MapDataset.range(index, 2 ** 62).map(_Upto(self._make, self._limit))
        # One element at a time in each worker: the parallelism is the workers.
        iterable = dataset.to_iter_dataset(grain.ReadOptions(num_threads=0,
                                                             prefetch_buffer_size=0))
        options = grain.MultiprocessingOptions(num_workers=self._workers,
                                               per_worker_buffer_size=BUFFER)
        if not _EXIT_HOOK:  # registered after multiprocessing's exit hook, so run before it
            _EXIT_HOOK.append(atexit.register(_close_open))
        self._iterator = iter(iterable.mp_prefetch(
            options, worker_init_fn=functools.partial(_exit_with_parent, os.getpid())))
        _OPEN.add(self)
        self._next = index

    def get(self, index):
        if self._limit is not None and not 0 <= index < self._limit:
            raise IndexError(f"index {index} is past the stream's end ({self._limit})")
        if self._iterator is None or index != self._next:
            self._start(index)
        try:
            value = next(self._iterator)
        except RuntimeError as error:
            if not str(error).startswith(_WORKER_DIED):
                raise
            self.close()
            code = re.search(r"exit code (-?\d+)", str(error))
            code = code.group(1) if code else "unknown"
            if code == "1":  # what a spawned process that could not start returns
                advice = ("a script that reads image files in worker processes must train "
                          "under `if __name__ == \"__main__\":` (they are started by "
                          "spawning), or read them with threads of this process "
                          "(worker_processes=0, --input_workers=0)")
            else:  # killed: most often for memory
                advice = ("fewer workers (worker_processes=N, --input_workers=N) hold fewer "
                          "batches in memory; 0 reads with threads of this process")
            raise RuntimeError(f"an input worker process stopped (exit code {code}; its error, "
                               f"if any, is printed above): {advice}.") from None
        self._next += 1
        # Out of Grain's shared memory, which is then freed at once (a copy of
        # a few milliseconds): a batch held to the end of the program would
        # otherwise be reported as leaked shared memory when it exits.
        batch = tuple(np.array(part) for part in value)
        _unlink(value)
        return batch

    def close(self):
        """Stops the workers and frees the batches they had prepared."""
        iterator, self._iterator = self._iterator, None
        _OPEN.discard(self)
        if iterator is not None:
            with _synchronous_deletes():
                iterator.close()
                del iterator

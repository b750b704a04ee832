"""The JAX route's image files decoded in worker processes, by Grain.

Decoding and augmenting a JPEG is Pillow and NumPy work that holds Python's
GIL for much of its time, so the threads of one process
(:class:`keras_identity.data.arrays.TrainBatches` reading in-memory arrays)
do not scale with a machine's cores.  Grain, the JAX ecosystem's loader,
runs a dataset's transformations in worker processes and hands their
results back through shared memory in order
(``IterDataset.mp_prefetch``); it is used here for every stream read
image by image (image folders, tensorflow_datasets' random-access sources).

What Grain computes is :meth:`TrainBatches.global_batch
<keras_identity.data.arrays.TrainBatches.global_batch>` (or
``EvalBatches.global_batch``): one element is one batch (this process's
rows of global batch ``k``), a function of the run's seed and of ``k``
alone.  So the stream is the threads' stream, bit for bit, whatever the
number of workers; a resumed run starts a new iterator at its step instead
of restoring Grain's iterator state; and a file refused inside a worker
(:class:`keras_identity.data.errors.DataError`, one line naming the file)
is raised again, with the same type and message, by the call that asked
for its batch.

Each worker process imports keras_identity (and so Keras and its backend)
to unpickle the batch function, a second or two at the start of a stream.
"""

import importlib.util
import re

import numpy as np

# Batches each worker prepares ahead (Grain's per-worker buffer in shared memory).
BUFFER = 2
# How Grain reports a worker process that exited (failed to start, killed).
_WORKER_DIED = "Worker process was terminated unexpectedly with"


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
        stop = self._limit if self._limit is not None else 2 ** 62
        dataset = grain.MapDataset.range(index, max(index, stop)).map(self._make)
        # One element at a time in each worker: the parallelism is the workers.
        iterable = dataset.to_iter_dataset(grain.ReadOptions(num_threads=0,
                                                             prefetch_buffer_size=0))
        options = grain.MultiprocessingOptions(num_workers=self._workers,
                                               per_worker_buffer_size=BUFFER)
        self._iterator = iter(iterable.mp_prefetch(options))
        self._next = index

    def get(self, index):
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
        return tuple(np.array(part) for part in value)

    def close(self):
        """Stops the workers."""
        iterator, self._iterator = self._iterator, None
        if iterator is not None:
            iterator.close()

"""The JAX route's input pipeline: NumPy batches in a ``keras.utils.PyDataset``.

The streams are those of the tf.data pipeline (:mod:`~keras_identity.data.pipeline`),
built without TensorFlow:

* the training stream is the training set shuffled once per pass, the passes following
  each other (tf.data's ``shuffle`` then ``repeat``), cut into global batches: batch
  ``k`` holds the examples ``k * batch_size, ...`` of that stream, so a run resumed at
  step ``k`` (``start_step``) reads what an uninterrupted run would;
* every random choice comes from NumPy's generator seeded with ``(seed, purpose,
  index)``: a pass's permutation by the pass, a CIFAR batch's crop offsets and flips by
  the global batch, an image's ImageNet scale, crop and flip by its position in the
  stream: a function of the run's seed and of the place in the stream, never of the
  number of processes or of what was read before;
* process ``i`` of ``P`` receives rows ``[i * B / P, (i + 1) * B / P)`` of every global
  batch of ``B`` examples; Keras's JAX trainer assembles the global batch from the
  processes' slices (``jax.make_array_from_process_local_data``), so across the
  processes every example of a batch is read once.

In-memory datasets (MNIST, CIFAR) are augmented a whole batch at a time with array
indexing (no Python loop per image), by a pool of threads that prepares the next batches
while the accelerator trains on the current one.  Image files (ImageNet folders,
tensorflow_datasets' random-access sources) are decoded and augmented one image at a
time, in Grain's worker processes (``worker_processes``, by default one per core on a
machine of more than ``THREADS`` cores; :mod:`keras_identity.data.grain_workers`), or in
the threads (on fewer cores, where Grain is not installed, or with
``worker_processes=0``): on 2 cores the threads read a JPEG folder faster, having no
batches to pass between processes (docs/tpu.md), and only processes scale past them.

The numbers drawn differ from TensorFlow's stateless generators: the two pipelines agree
exactly where no randomness is involved (the test set, the normalisation, a crop and
flip given its offsets) and in distribution on the rest (``tests/data/test_arrays.py``).
"""

import concurrent.futures
import threading

import keras
import numpy as np

from keras_identity import _checks
from keras_identity import _cpu_kernels as cpu_kernels
from keras_identity.data import decoding
from keras_identity.data import grain_workers
from keras_identity.data import image_folders
from keras_identity.data.facts import AUGMENTATIONS

# What a generator's draws are for (the second word of its seed).
_SHUFFLE, _CROP, _IMAGE = 0, 1, 2
# Batches prepared ahead of the one asked for, and the threads preparing them.
PREFETCH = 4
THREADS = 2
# The most worker processes per core (each imports Keras and holds its
# batches in shared memory): more only wait for the cores, and a thousand
# on 2 cores trained nothing in minutes.
WORKERS_PER_CORE = 4
# ImageNet's training scale range (He et al. 2015, Sec. 3.4).
IMAGENET_SCALE = (256, 480)


def _generator(seed, purpose, index):
    return np.random.default_rng([int(seed), purpose, int(index)])


def crop_and_flip(images, offsets, flips, pad=4):
    """He et al. (2015), Sec. 4.2, on a batch of normalised images: "4 pixels are padded on
    each side, and a 32x32 crop is randomly sampled from the padded image or its horizontal
    flip".

    Args:
        images: ``(n, height, width, channels)`` normalised images (the zero padding is the
            mean).
        offsets: ``(n, 2)`` integers in ``[0, 2 * pad]``: each crop's top row and left
            column in the padded image.
        flips: ``(n,)`` booleans: which crops are mirrored.
    """
    n, height, width, _ = images.shape
    padded = np.pad(images, ((0, 0), (pad, pad), (pad, pad), (0, 0)))
    rows = offsets[:, :1] + np.arange(height)
    cols = offsets[:, 1:] + np.arange(width)
    cols = np.where(flips[:, None], cols[:, ::-1], cols)
    return padded[np.arange(n)[:, None, None], rows[:, :, None], cols[:, None, :]]


def cifar_draws(seed, step, total, pad=4):
    """The crop offsets ``(total, 2)`` and flips ``(total,)`` of global batch
    ``step`` (every process draws the whole batch's and keeps its rows)."""
    rng = _generator(seed, _CROP, step)
    return rng.integers(0, 2 * pad + 1, size=(total, 2)), rng.random(total) < 0.5


def _resize_shorter_side(image, size):
    from PIL import Image

    height, width = image.shape[:2]
    scale = size / min(height, width)
    new = (max(1, int(round(width * scale))), max(1, int(round(height * scale))))
    channels = image.shape[2]
    picture = Image.fromarray(image[..., 0] if channels == 1 else image)
    resized = np.asarray(picture.resize(new, Image.BILINEAR))
    return resized[..., None] if channels == 1 else resized


def imagenet_train(image, rng, crop=224, scale=IMAGENET_SCALE):
    """Scale augmentation of He et al. (2015), Sec. 3.4, on one uint8 image:
    shorter side resized to s in [256, 480], a random 224x224 crop, a random
    horizontal flip.  Returns float32 in [0, 255]."""
    image = _resize_shorter_side(image, int(rng.integers(scale[0], scale[1] + 1)))
    top = int(rng.integers(0, image.shape[0] - crop + 1))
    left = int(rng.integers(0, image.shape[1] - crop + 1))
    image = image[top:top + crop, left:left + crop]
    if rng.random() < 0.5:
        image = image[:, ::-1]
    return image.astype(np.float32)


def center_crop(image, resize=256, crop=224):
    """Evaluation crop: shorter side to ``resize``, the central ``crop`` square."""
    image = _resize_shorter_side(image, resize)
    top = (image.shape[0] - crop) // 2
    left = (image.shape[1] - crop) // 2
    return image[top:top + crop, left:left + crop].astype(np.float32)


def _model_inputs(images, normalization, raw_pixels):
    """Pixel values as float32, or normalised images."""
    return np.asarray(images, np.float32) if raw_pixels else normalization(images)


def _process_rows(batch_size, process_index, process_count):
    if batch_size % process_count:
        raise ValueError(f"batch_size={batch_size} is not valid with {process_count} "
                         f"processes; expected a multiple.")
    local = batch_size // process_count
    return process_index * local, local


def resolve_worker_processes(workers, data, name="worker_processes"):
    """The processes decoding ``data``'s image files (0: threads of the
    training process): ``workers``, checked (``name``: the argument or flag
    that gave it), or by default one per core where Grain is installed and
    there are more cores than :data:`THREADS`; 0 for data held in memory.
    At most :data:`WORKERS_PER_CORE` per core are accepted."""
    if workers is None:  # the threads use every core of a machine of THREADS cores
        if data.in_memory or cpu_kernels.cores() <= THREADS or not grain_workers.available():
            return 0
        return cpu_kernels.cores()
    _checks.check_positive_int(name, workers, minimum=0)
    if workers and data.in_memory:
        raise ValueError(f"{name}={workers} is not valid for {data.source}, which is held in "
                         f"memory and augmented a batch at a time in the training process; "
                         f"worker processes decode image files (expected 0, or none given).")
    if workers and not grain_workers.available():
        raise ValueError(f"{name}={workers} needs Grain, which is not installed: pip install "
                         f"grain (or keras-identity[jax]); 0 reads with threads.")
    cores = cpu_kernels.cores()
    if workers > WORKERS_PER_CORE * cores:
        raise ValueError(f"{name}={workers} is not valid on this machine of {cores} "
                         f"core{'s' if cores != 1 else ''}; expected at most "
                         f"{WORKERS_PER_CORE * cores} ({WORKERS_PER_CORE} per core: each "
                         f"worker is a process holding its batches in memory).")
    return workers


def _prefetcher(make, workers, limit=None):
    return (grain_workers.Prefetcher(make, workers, limit) if workers
            else _Prefetcher(make, limit))


class _Prefetcher:
    """Computes ``make(i)`` for the indices after the one asked for, in threads."""

    def __init__(self, make, limit=None):
        self._make = make
        self._limit = limit
        self._futures = {}
        self._lock = threading.Lock()
        self._executor = None

    def get(self, index):
        with self._lock:
            if self._executor is None:
                self._executor = concurrent.futures.ThreadPoolExecutor(
                    THREADS, thread_name_prefix="keras_identity_batches")
            for stale in [i for i in self._futures if i < index]:
                self._futures.pop(stale).cancel()
            last = index + PREFETCH if self._limit is None else min(index + PREFETCH,
                                                                      self._limit - 1)
            for ahead in range(index, last + 1):
                if ahead not in self._futures:
                    self._futures[ahead] = self._executor.submit(self._make, ahead)
            future = self._futures.pop(index)
        return future.result()

    def close(self):
        with self._lock:
            for future in self._futures.values():
                future.cancel()
            self._futures.clear()
            if self._executor is not None:
                self._executor.shutdown(wait=False)
                self._executor = None


class _Examples:
    """Random access to one split's images (uint8) and labels."""

    def __init__(self, data, split):
        self.images = self.labels = self.files = self.source = None
        if split == "val":
            if data.x_val is None:
                raise ValueError("split='val' needs a dataset with a validation split.")
            self.images, self.labels = data.x_val, data.y_val
        elif data.in_memory:
            self.images, self.labels = ((data.x_train, data.y_train) if split == "train"
                                        else (data.x_test, data.y_test))
        elif (data.files_train if split == "train" else data.files_test) is not None:
            self.files = data.files_train if split == "train" else data.files_test
        else:
            self.source, _ = data.tfds_train if split == "train" else data.tfds_test
            if not hasattr(self.source, "__getitem__"):
                raise ValueError(f"{data.source} is read as a tf.data stream; the JAX route "
                                 f"reads tensorflow_datasets through its random-access data "
                                 f"source (load_dataset(..., random_access=True)).")
        self.count = (len(self.labels) if self.labels is not None else
                      len(self.files[1]) if self.files is not None else len(self.source))

    def batch(self, index):
        return self.images[index], self.labels[index]

    def one(self, i):
        """``(uint8 image (h, w, c), label)`` of example ``i``."""
        if self.images is not None:
            return self.images[i], self.labels[i]
        if self.files is not None:
            path = self.files[0][i]
            encoded = image_folders.read_file(path)
            return decoding.decode_image(encoded, 3, path), self.files[1][i]
        example = self.source[int(i)]
        image = np.asarray(example["image"], np.uint8)
        return (image[..., None] if image.ndim == 2 else image), example["label"]


class TrainBatches(keras.utils.PyDataset):
    """An endless, shuffled, augmented stream of ``(images, labels)`` batches: item ``i`` is
    global batch ``start_step + i`` (this process's rows).

    The arguments are those of :func:`keras_identity.data.pipeline.train_dataset` (``data``,
    the global ``batch_size``, ``normalization``, ``augmentation``, ``seed``,
    ``start_step``, ``raw_pixels``: the CIFAR augmentation pads the normalised image and
    maps the crop back to pixel values, the authors' order), with ``process_index`` and
    ``process_count`` (this process, and how many read the stream together:
    ``jax.process_index()``, ``jax.process_count()``) in place of a ``tf.distribute`` input
    context; batches are always whole.  ``worker_processes``: the processes decoding image
    files (None: one per core where Grain is installed and the machine has more than
    ``THREADS`` cores; 0: threads of this process; in-memory datasets always use threads);
    the stream is the same for every value.  (Keras's own ``workers``, threads calling
    ``__getitem__``, stay 1: the batches are prepared ahead here.)
    """

    def __init__(self, data, *, batch_size, normalization, augmentation="none", seed=0,
                 start_step=0, process_index=0, process_count=1, raw_pixels=False,
                 worker_processes=None):
        super().__init__()
        if augmentation not in AUGMENTATIONS:
            raise ValueError(f"augmentation={augmentation!r} is not valid; expected one of: "
                             f"{', '.join(repr(a) for a in AUGMENTATIONS)}.")
        self.examples = _Examples(data, "train")
        if augmentation == "cifar" and self.examples.images is None:
            raise ValueError(f"augmentation='cifar' crops whole in-memory batches; "
                             f"{data.source} is read image by image (use 'imagenet' or "
                             f"'none').")
        self.batch_size = int(batch_size)
        self.first, self.local = _process_rows(self.batch_size, process_index, process_count)
        self.normalization = normalization
        self.augmentation = augmentation
        self.seed = int(seed)
        self.start_step = int(start_step)
        self.raw_pixels = raw_pixels
        self.worker_processes = resolve_worker_processes(worker_processes, data)
        self._permutations = {}
        self._permutation_lock = threading.Lock()
        self._prefetcher = _prefetcher(self.global_batch, self.worker_processes)

    def __getstate__(self):  # sent to Grain's workers: the data and the draws, no threads
        state = dict(self.__dict__, _permutations={}, _prefetcher=None)
        del state["_permutation_lock"]
        return state

    def __setstate__(self, state):
        self.__dict__.update(state)
        self._permutation_lock = threading.Lock()

    @property
    def num_batches(self):
        return None  # endless: the run's length is fit's steps

    def __getitem__(self, index):
        return self._prefetcher.get(self.start_step + int(index))

    def _permutation(self, epoch):
        with self._permutation_lock:
            if epoch not in self._permutations:
                if len(self._permutations) > 2:
                    self._permutations.pop(min(self._permutations))
                self._permutations[epoch] = _generator(
                    self.seed, _SHUFFLE, epoch).permutation(self.examples.count)
            return self._permutations[epoch]

    def indices(self, step):
        """The example indices of this process's rows of global batch ``step``."""
        n = self.examples.count
        positions = step * self.batch_size + self.first + np.arange(self.local)
        epochs, within = np.divmod(positions, n)
        index = np.empty(self.local, np.int64)
        for epoch in np.unique(epochs):
            chosen = epochs == epoch
            index[chosen] = self._permutation(int(epoch))[within[chosen]]
        return index

    def global_batch(self, step):
        """This process's rows of global batch ``step``: ``(images, labels)``."""
        index = self.indices(step)
        if self.examples.images is not None:
            images, labels = self.examples.batch(index)
            if self.augmentation == "cifar":
                offsets, flips = cifar_draws(self.seed, step, self.batch_size)
                rows = slice(self.first, self.first + self.local)
                x = crop_and_flip(self.normalization(images), offsets[rows], flips[rows])
                x = self.normalization.invert(x) if self.raw_pixels else x
            else:
                x = _model_inputs(images, self.normalization, self.raw_pixels)
            return x, labels.astype(np.int32)
        pairs = [self._one(step * self.batch_size + self.first + row, i)
                 for row, i in enumerate(index)]
        return np.stack([p[0] for p in pairs]), np.asarray([p[1] for p in pairs], np.int32)

    def _one(self, position, i):
        image, label = self.examples.one(i)
        if self.augmentation == "imagenet":
            image = imagenet_train(image, _generator(self.seed, _IMAGE, position))
        return _model_inputs(image, self.normalization, self.raw_pixels), label

    def close(self):
        """Stops the threads preparing batches."""
        self._prefetcher.close()


class EvalBatches(keras.utils.PyDataset):
    """The test (or validation) set in order, as ``(images, labels)`` batches, or
    ``(images, labels, weights)`` with ``pad_to_batch``.

    Args:
        split: ``"test"`` or ``"val"``.
        pad_to_batch: pad the last global batch with zero-weight examples (several devices
            or processes need equal, full batches).
        eval_resize, eval_crop: ImageNet evaluation crop (256/224, or 320/320).
        process_index, process_count: as in :class:`TrainBatches` (several processes need
            ``pad_to_batch``).
        raw_pixels: pixel values in [0, 255] instead of normalised images.
        worker_processes: as in :class:`TrainBatches`.
    """

    def __init__(self, data, *, batch_size, normalization, split="test", pad_to_batch=False,
                 eval_resize=256, eval_crop=224, process_index=0, process_count=1,
                 raw_pixels=False, worker_processes=None):
        super().__init__()
        if process_count > 1 and not pad_to_batch:
            raise ValueError("several processes read equal, full batches: pass "
                             "pad_to_batch=True.")
        self.examples = _Examples(data, split)
        self.batch_size = int(batch_size)
        self.first, self.local = _process_rows(self.batch_size, process_index, process_count)
        self.normalization = normalization
        self.pad_to_batch = pad_to_batch
        self.eval_resize, self.eval_crop = eval_resize, eval_crop
        self.raw_pixels = raw_pixels
        self.files = self.examples.images is None
        self.worker_processes = resolve_worker_processes(worker_processes, data)
        self._prefetcher = _prefetcher(self.global_batch, self.worker_processes,
                                       limit=self.num_batches)

    def __getstate__(self):  # sent to Grain's workers
        return dict(self.__dict__, _prefetcher=None)

    @property
    def num_batches(self):
        return -(-self.examples.count // self.batch_size)

    def __getitem__(self, index):
        if not 0 <= index < self.num_batches:
            raise IndexError(f"batch {index} of {self.num_batches}")
        return self._prefetcher.get(int(index))

    def global_batch(self, number):
        """This process's rows of batch ``number``."""
        count = self.examples.count
        positions = number * self.batch_size + np.arange(self.batch_size)
        if not self.pad_to_batch:
            positions = positions[positions < count]
        else:
            positions = positions[self.first:self.first + self.local]
        weights = (positions < count).astype(np.float32)
        index = np.where(positions < count, positions, 0)
        if self.files:
            pairs = [self.examples.one(i) for i in index]
            images = np.stack([center_crop(p[0], self.eval_resize, self.eval_crop)
                               for p in pairs])
            labels = np.asarray([p[1] for p in pairs])
        else:
            images, labels = self.examples.batch(index)
        x = _model_inputs(images, self.normalization, self.raw_pixels)
        y = labels.astype(np.int32)
        return (x, y, weights) if self.pad_to_batch else (x, y)

    def close(self):
        self._prefetcher.close()

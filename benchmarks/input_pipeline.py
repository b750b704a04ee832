"""Images/s of the two routes' training input pipelines alone, alternated in
one process so that both see the same machine.

Two workloads (``--workload``):

* ``jpeg_folder`` (default): an ImageNet-style folder of JPEGs
  (``--image_size``, 500x375 by default, made once under ``--folder`` from
  the CIFAR-10 images upscaled, so that the files hold photographs), read
  with the ImageNet training augmentation (shorter side to 256-480, a
  224x224 crop, a flip).  Rows: tf.data (the TensorFlow route) with
  ``--workers`` threads in its pool, the JAX route with ``--workers`` Grain
  worker processes, and the JAX route's threads of one process.
* ``cifar10``: CIFAR-10 in memory with its augmentation (pad-4 crop and
  flip): tf.data against the JAX route's whole-batch NumPy augmentation.

    python -m benchmarks.input_pipeline --data_dir=../shared/data
    python -m benchmarks.input_pipeline --data_dir=../shared/data --workers=2,all
    python -m benchmarks.input_pipeline --workload=cifar10 --data_dir=../shared/data
    python -m benchmarks.input_pipeline --pipelines=grain,threads   # without TensorFlow

Prints a Markdown table naming the machine; without TensorFlow the tf.data
rows are left out.
"""

import os
import shutil
import statistics
import time

from absl import app
from absl import flags

from benchmarks import machine

FLAGS = flags.FLAGS
flags.DEFINE_enum("workload", "jpeg_folder", ["jpeg_folder", "cifar10"], "What is read.")
flags.DEFINE_string("data_dir", None, "CIFAR-10: offline files (e.g. ../shared/data), or "
                    "tensorflow_datasets when empty.")
flags.DEFINE_string("folder", "/tmp/keras_identity_jpeg_folder",
                    "jpeg_folder: where the JPEG folder is made (kept for the next run).")
flags.DEFINE_string("image_size", "500x375", "jpeg_folder: width x height of the JPEGs.")
flags.DEFINE_integer("images", 600, "jpeg_folder: JPEGs in the training split.")
flags.DEFINE_list("pipelines", ["tf.data", "grain", "threads"],
                  "Pipelines measured: tf.data (TensorFlow route), grain (JAX route, worker "
                  "processes), threads (JAX route, threads of this process).")
flags.DEFINE_list("workers", ["2", "all"], "jpeg_folder: tf.data's threads and Grain's "
                  "processes, a row each: numbers, or all (this machine's cores).")
flags.DEFINE_integer("batch_size", None, "Global batch size (default: 32 for jpeg_folder, "
                     "128 for cifar10).")
flags.DEFINE_integer("batches", None, "Batches timed per repetition (default: 15 for "
                     "jpeg_folder, 200 for cifar10).")
flags.DEFINE_integer("warmup", None, "Batches read before timing (worker start-up, tf.data's "
                     "tuning; default: 4 for jpeg_folder, 20 for cifar10).")
flags.DEFINE_integer("repeats", 3, "Repetitions per pipeline, alternated; the median is shown.")

PIPELINES = ("tf.data", "grain", "threads")
_LABELS = {"tf.data": "tf.data (TensorFlow route)", "grain": "Grain processes (JAX route)",
           "threads": "threads of one process (JAX route)"}


def _size():
    try:
        width, height = (int(v) for v in FLAGS.image_size.lower().split("x"))
    except ValueError:
        raise app.UsageError(f"--image_size={FLAGS.image_size!r} is not valid; expected "
                             f"WIDTHxHEIGHT, e.g. 500x375.") from None
    return width, height


def _made_tree(folder, stamp, count):
    """Whether ``folder`` is the tree :func:`make_folder` made with ``stamp``:
    ``train/`` with ``count`` images, ``val/`` and the stamp, nothing else."""
    if sorted(os.listdir(folder)) not in (sorted(["train", "val", stamp]),
                                          sorted(["train", stamp])):   # no val: all trained
        return False
    images = sum(len(files) for _, _, files in os.walk(os.path.join(folder, "train")))
    return images == count


def make_folder(folder, data_dir, count, size):
    """An image folder ``train/<class>/<i>.jpg`` (and a small ``val``) of
    ``count`` CIFAR-10 training images drawn at random (every class)
    upscaled to ``size`` (JPEG quality 90), made once: a tree made before
    with the same count and size is kept (checked, not trusted to its stamp).
    The tree is made in ``<folder>.partial`` and renamed into place whole, so
    an interrupted make leaves no tree behind; a folder holding anything
    else is refused (``app.UsageError``)."""
    import numpy as np
    from PIL import Image

    from keras_identity.data import load_dataset

    stamp = f"made-{count}-{size[0]}x{size[1]}"
    folder = os.path.normpath(folder)
    if os.path.isdir(folder) and os.listdir(folder):
        if _made_tree(folder, stamp, count):
            return folder
        raise app.UsageError(f"--folder={folder} is not the tree this benchmark makes for "
                             f"these flags (other files, another --images/--image_size, or "
                             f"images missing): remove it or give a new --folder; it keeps "
                             f"a folder holding train/ with {count} images, val/ and {stamp} "
                             f"only")
    if os.path.exists(folder) and not os.path.isdir(folder):
        raise app.UsageError(f"--folder={folder} is not a folder; expected a new or empty one")
    cifar = load_dataset("cifar10", data_dir)
    order = np.random.default_rng(0).permutation(cifar.num_train)
    train = order[:count]
    # Validation images of the training classes only (each needs training images).
    val = [i for i in order[count:] if cifar.y_train[i] in set(cifar.y_train[train])][:20]
    partial = folder + ".partial"
    if os.path.lexists(partial):   # what an interrupted make left, nothing else
        if not (os.path.isdir(partial) and set(os.listdir(partial)) <= {"train", "val"}):
            raise app.UsageError(f"{partial} is in the way of the tree this benchmark makes "
                                 f"in it: remove it or give another --folder")
        shutil.rmtree(partial)
    for split, chosen in (("train", train), ("val", val)):
        for i in chosen:
            label = int(cifar.y_train[i])
            path = os.path.join(partial, split, cifar.class_names[label], f"{i}.jpg")
            os.makedirs(os.path.dirname(path), exist_ok=True)
            Image.fromarray(cifar.x_train[i]).resize(size, Image.BICUBIC).save(path,
                                                                              quality=90)
    open(os.path.join(partial, stamp), "w").close()
    if os.path.isdir(folder):
        os.rmdir(folder)   # empty
    os.rename(partial, folder)
    return folder


def _tf_stream(data, normalization, augmentation, workers):
    import tensorflow as tf

    from keras_identity.data import pipeline

    dataset = pipeline.train_dataset(data, batch_size=FLAGS.batch_size,
                                     normalization=normalization, augmentation=augmentation,
                                     raw_pixels=True)
    if workers:
        options = tf.data.Options()
        options.threading.private_threadpool_size = workers
        dataset = dataset.with_options(options)
    iterator = iter(dataset)
    return (lambda: next(iterator)), (lambda: None)


def _jax_stream(data, normalization, augmentation, workers):
    from keras_identity.data import arrays

    stream = arrays.TrainBatches(data, batch_size=FLAGS.batch_size,
                                 normalization=normalization, augmentation=augmentation,
                                 raw_pixels=True, worker_processes=workers)
    index = iter(range(10 ** 9))
    return (lambda: stream[next(index)]), stream.close


def _rate(next_batch):
    for _ in range(FLAGS.warmup):
        next_batch()
    started = time.perf_counter()
    for _ in range(FLAGS.batches):
        next_batch()
    return FLAGS.batches * FLAGS.batch_size / (time.perf_counter() - started)


def _configurations(folder):
    """``[(pipeline, workers), ...]`` measured, in the order of the table."""
    from keras_identity import _tensorflow

    unknown = [p for p in FLAGS.pipelines if p not in PIPELINES]
    if unknown:
        raise app.UsageError(f"--pipelines={','.join(unknown)} is not valid; expected some "
                             f"of: {', '.join(PIPELINES)}.")
    chosen = [p for p in FLAGS.pipelines if p != "tf.data" or _tensorflow.available()]
    if not folder:  # arrays in memory: each route's one way
        return [(p, None) for p in chosen if p != "grain"]
    counts = []
    for value in FLAGS.workers:
        if value == "all":
            count = machine.cores()
        elif value.isdigit() and int(value) > 0:
            count = int(value)
        else:
            raise app.UsageError(f"--workers={value!r} is not valid; expected positive "
                                 f"numbers or all.")
        if count not in counts:
            counts.append(count)
    return ([(p, n) for n in counts for p in chosen if p != "threads"]
            + [("threads", 0)] * ("threads" in chosen))


def main(argv):
    del argv
    from keras_identity.data import Normalization
    from keras_identity.data import arrays
    from keras_identity.data import load_dataset

    folder = FLAGS.workload == "jpeg_folder"
    defaults = (32, 15, 4) if folder else (128, 200, 20)
    for name, value in zip(("batch_size", "batches", "warmup"), defaults):
        if getattr(FLAGS, name) is None:
            setattr(FLAGS, name, value)
    configurations = _configurations(folder)
    if folder:
        size = _size()
        data = load_dataset("imagenet", make_folder(FLAGS.folder, FLAGS.data_dir, FLAGS.images,
                                                    size))
        normalization, augmentation = Normalization.imagenet(), "imagenet"
        what = (f"{data.num_train} JPEGs of {size[0]}x{size[1]} (CIFAR-10 upscaled), ImageNet "
                f"training augmentation (shorter side 256-480, 224x224 crop, flip)")
    else:
        data = load_dataset("cifar10", FLAGS.data_dir)
        normalization = Normalization.from_images("per_pixel_mean", data.x_train)
        augmentation = "cifar"
        what = "CIFAR-10 in memory, its training augmentation (pad-4 crop + flip)"
    makers = {"tf.data": _tf_stream, "grain": _jax_stream, "threads": _jax_stream}
    rates = {c: [] for c in configurations}
    for _ in range(FLAGS.repeats):
        for pipeline, workers in configurations:
            next_batch, close = makers[pipeline](data, normalization, augmentation, workers)
            try:
                rates[(pipeline, workers)].append(_rate(next_batch))
            finally:
                close()
    rows = [{"pipeline": _LABELS[p] if folder or p != "threads" else
             "NumPy whole-batch augmentation (JAX route)",
             "workers": ("-" if workers is None else
                         f"{workers} {'threads' if p == 'tf.data' else 'processes'}"
                         if workers else f"{arrays.THREADS} threads"),
             "median": statistics.median(values),
             "all": ", ".join(f"{v:,.0f}" for v in values)}
            for (p, workers), values in rates.items()]
    print(f"Machine: {machine.describe()}")
    print(f"{what}; float32 pixels out, batch {FLAGS.batch_size}, {FLAGS.batches} batches "
          f"(after {FLAGS.warmup}) x {FLAGS.repeats} alternated")
    print(machine.table(rows, [("pipeline", "pipeline", "{}"),
                               ("workers", "workers", "{}"),
                               ("median", "images/s (median)", "{:,.0f}"),
                               ("all", "each repetition", "{}")]))


def run():
    app.run(main)


if __name__ == "__main__":
    run()

"""Images/s of the two input pipelines alone, on CIFAR-10's training
augmentation (pad-4 crop and flip, pixel values out, as the trainer reads
them): tf.data (the TensorFlow route) and the NumPy ``PyDataset`` (the JAX
route), alternated in one process so that both see the same machine.

    python -m benchmarks.input_pipeline --data_dir=../shared/data
    python -m benchmarks.input_pipeline --pipelines=numpy   # without TensorFlow

Prints a Markdown table naming the machine; without TensorFlow the tf.data
row is left out.
"""

import statistics
import time

from absl import app
from absl import flags

from benchmarks import machine

FLAGS = flags.FLAGS
flags.DEFINE_string("data_dir", None, "CIFAR-10: offline files (e.g. ../shared/data), or "
                    "tensorflow_datasets when empty.")
flags.DEFINE_list("pipelines", ["tf.data", "numpy"], "Pipelines measured: tf.data, numpy.")
flags.DEFINE_integer("batch_size", 128, "Global batch size.")
flags.DEFINE_integer("batches", 200, "Batches timed per repetition (after 20 warm-up ones).")
flags.DEFINE_integer("repeats", 3, "Repetitions per pipeline, alternated; the median is shown.")


def _numpy_stream(data, normalization):
    from keras_identity.data import arrays

    stream = arrays.TrainBatches(data, batch_size=FLAGS.batch_size,
                                 normalization=normalization, augmentation="cifar",
                                 raw_pixels=True)
    index = iter(range(10 ** 9))
    return (lambda: stream[next(index)]), stream.close


def _tf_stream(data, normalization):
    from keras_identity.data import pipeline

    iterator = iter(pipeline.train_dataset(data, batch_size=FLAGS.batch_size,
                                           normalization=normalization,
                                           augmentation="cifar", raw_pixels=True))
    return (lambda: next(iterator)), (lambda: None)


def _rate(next_batch):
    for _ in range(20):
        next_batch()
    started = time.perf_counter()
    for _ in range(FLAGS.batches):
        next_batch()
    return FLAGS.batches * FLAGS.batch_size / (time.perf_counter() - started)


def main(argv):
    del argv
    from keras_identity import _tensorflow
    from keras_identity.data import load_dataset
    from keras_identity.data import Normalization

    makers = {"tf.data": _tf_stream, "numpy": _numpy_stream}
    unknown = [p for p in FLAGS.pipelines if p not in makers]
    if unknown:
        raise app.UsageError(f"--pipelines={','.join(unknown)} is not valid; expected "
                             f"tf.data and/or numpy.")
    chosen = [p for p in FLAGS.pipelines if p != "tf.data" or _tensorflow.available()]
    data = load_dataset("cifar10", FLAGS.data_dir)
    normalization = Normalization.from_images("per_pixel_mean", data.x_train)
    rates = {name: [] for name in chosen}
    for _ in range(FLAGS.repeats):
        for name in chosen:
            next_batch, close = makers[name](data, normalization)
            rates[name].append(_rate(next_batch))
            close()
    rows = [{"pipeline": {"tf.data": "tf.data (TensorFlow route)",
                          "numpy": "NumPy PyDataset (JAX route)"}[name],
             "median": statistics.median(values),
             "all": ", ".join(f"{v:,.0f}" for v in values)} for name, values in rates.items()]
    print(f"CIFAR-10 training augmentation (pad-4 crop + flip, float32 pixels), batch "
          f"{FLAGS.batch_size}, {FLAGS.batches} batches x {FLAGS.repeats} alternated; "
          f"{machine.describe()}")
    print(machine.table(rows, [("pipeline", "pipeline", "{}"),
                               ("median", "images/s (median)", "{:,.0f}"),
                               ("all", "each repetition", "{}")]))


if __name__ == "__main__":
    app.run(main)

"""What a checkpoint costs a training run, in a local folder or a bucket.

    python -m benchmarks.checkpoint_cost                          # ResNet-164 and -1001, local
    python -m benchmarks.checkpoint_cost --model_dir=gs://BUCKET/bench   # in a bucket
    KERAS_BACKEND=jax python -m benchmarks.checkpoint_cost --depths=164

For each depth, in one process: builds the looped pre-activation bottleneck
ResNet for CIFAR with momentum SGD (the recipe's optimizer state: one
momentum per weight), times ``--steps`` training steps (``train_on_batch``,
the median after one warm-up step), then writes ``--saves`` checkpoints
of each format the backend writes (``--formats``; the checkpointers that
training runs use) and removes them:

* ``h5`` (both backends): training waits while the checkpoint is written.
* ``orbax`` (JAX): training waits until the variables are copied off the
  devices, then goes on while the checkpoint is written; the steps taken
  meanwhile are timed too ("step s, checkpoint in flight"), since the write
  shares the machine with them.

A checkpoint's cost to a run, in steps, is the time training waited plus
what the steps in flight lost, over a step's time (medians over the
checkpoints); "written within" is the time from the save until the write was
found finished (checked between steps).  ``STORAGE_EMULATOR_HOST`` points ``gs://`` at a local
emulator.

Prints a Markdown table naming the machine.
"""

import statistics
import sys
import tempfile
import time

from absl import app
from absl import flags

from benchmarks import machine

FLAGS = flags.FLAGS
if __name__ == "__main__":
    flags.DEFINE_list("depths", ["164", "1001"], "Depths of the pre-activation bottleneck "
                      "ResNet (9n+2).")
    flags.DEFINE_integer("batch_size", 16, "Training batch size.")
    flags.DEFINE_integer("steps", 5, "Timed training steps (after one warm-up step).")
    flags.DEFINE_integer("saves", 3, "Timed checkpoints.")
    flags.DEFINE_string("model_dir", None, "Where the checkpoints are written: a local folder "
                        "or gs://BUCKET/path (default: a temporary folder).")
    flags.DEFINE_list("formats", None, "Checkpoint formats (h5, orbax; default: those the "
                      "backend writes: h5 on TensorFlow, both on JAX).")

# The most steps timed while one checkpoint is in flight.
_MOST_STEPS_IN_FLIGHT = 200


def measure(depth, batch_size, steps, saves, directory, formats):
    """Rows, one per format: the median step and checkpoint times of
    ``depth`` and the checkpoint's size; the checkpoints written into
    ``directory`` are removed."""
    import keras
    import numpy as np

    import keras_identity as ki
    from keras_identity import storage

    keras.utils.set_random_seed(0)
    model = ki.models.preact_resnet(depth, block="bottleneck")
    model.compile(keras.optimizers.SGD(0.1, momentum=0.9),
                  loss="sparse_categorical_crossentropy")
    ki.training.build_optimizer(model)
    rng = np.random.default_rng(0)
    x = rng.normal(size=(batch_size, 32, 32, 3)).astype("float32")
    y = rng.integers(0, 10, size=(batch_size,))
    model.train_on_batch(x, y)

    def timed_step():
        start = time.perf_counter()
        model.train_on_batch(x, y)
        return time.perf_counter() - start

    step = statistics.median(timed_step() for _ in range(steps))
    rows = []
    for kind in formats:
        folder = storage.join(directory, f"checkpoint_cost_{depth}_{kind}")
        checkpointer = _checkpointer(kind, folder)
        paused, written, lost, in_flight = [], [], [], []
        try:
            for number in range(1, saves + 1):
                start = time.perf_counter()
                checkpointer.save(model, step=number, epoch=0, history=[])
                paused.append(time.perf_counter() - start)
                flight = []
                while checkpointer.writing() and len(flight) < _MOST_STEPS_IN_FLIGHT:
                    flight.append(timed_step())
                checkpointer.finish()
                written.append(time.perf_counter() - start)
                lost.append(sum(t - step for t in flight))
                in_flight += flight
            size = _size(folder)
        finally:
            checkpointer.close()
            storage.rmtree(folder)
        cost = statistics.median(p + l for p, l in zip(paused, lost))
        rows.append(dict(model=f"preact_resnet{depth}", backend=keras.backend.backend(),
                         format=kind, batch=batch_size, step_s=step, megabytes=size / 2 ** 20,
                         paused_s=statistics.median(paused),
                         written_s=statistics.median(written),
                         in_flight_s=statistics.median(in_flight) if in_flight else None,
                         steps_in_flight=len(in_flight) / saves, steps=cost / step))
    return rows


def _checkpointer(kind, folder):
    if kind == "orbax":
        from keras_identity.training import orbax_checkpoints

        return orbax_checkpoints.OrbaxCheckpointer(folder, keep=1)
    from keras_identity.training import checkpoints

    return checkpoints.Checkpointer(folder, keep=1, owns_directory=True)


def _size(folder):
    """The bytes of the checkpoint left in ``folder`` (keep=1: the last)."""
    from keras_identity import storage

    return sum(storage.size(storage.join(folder, name))
               for name in storage.list_files(folder))


def _check_flags():
    """Each flag checked by the library's own checks: one line naming it."""
    from keras_identity import _checks
    from keras_identity import storage
    from keras_identity.models.resnet import resolve_depth

    try:
        depths = [int(d) for d in FLAGS.depths]
    except ValueError:
        sys.exit(f"benchmarks.checkpoint_cost: --depths={','.join(FLAGS.depths)}: expected "
                 f"whole numbers, e.g. 164,1001")
    checks = [("depths", lambda d=d: resolve_depth(d, "cifar10", "bottleneck")) for d in depths]
    checks += [("batch_size", lambda: _checks.check_positive_int("batch_size", FLAGS.batch_size)),
               ("steps", lambda: _checks.check_positive_int("steps", FLAGS.steps)),
               ("saves", lambda: _checks.check_positive_int("saves", FLAGS.saves)),
               ("model_dir", lambda: FLAGS.model_dir and storage.check_writable(
                   FLAGS.model_dir))]
    checks.append(("formats", lambda: _check_formats(FLAGS.formats)))
    for name, check in checks:
        try:
            check()
        except ValueError as error:
            value = getattr(FLAGS, name)
            value = ",".join(value) if isinstance(value, list) else value
            sys.exit(f"benchmarks.checkpoint_cost: --{name}={value}: {error}")
    return depths, _formats(FLAGS.formats)


def _formats(formats):
    import keras

    from keras_identity.training import orbax_checkpoints

    if formats:
        return list(formats)
    return ["h5", "orbax"] if keras.backend.backend() == "jax" and \
        orbax_checkpoints.available() else ["h5"]


def _check_formats(formats):
    import keras

    from keras_identity.training import orbax_checkpoints

    for kind in formats or []:
        if kind not in ("h5", "orbax"):
            raise ValueError(f"{kind!r} is not a checkpoint format; expected h5 or orbax")
        if kind == "orbax" and (keras.backend.backend() != "jax"
                                or not orbax_checkpoints.available()):
            raise ValueError("orbax checkpoints are written on the JAX backend "
                             "(KERAS_BACKEND=jax) with orbax-checkpoint installed")


def main(argv):
    if len(argv) > 1:
        sys.exit(f"benchmarks.checkpoint_cost: unexpected arguments {argv[1:]}")
    if not FLAGS["verbosity"].present:  # Orbax's INFO logs drown the progress
        from absl import logging

        logging.set_verbosity(logging.WARNING)
    depths, formats = _check_flags()
    with tempfile.TemporaryDirectory(prefix="checkpoint_cost_") as scratch:
        directory = FLAGS.model_dir or scratch
        rows = []
        for depth in depths:
            print(f"preact_resnet{depth}: {FLAGS.steps} steps, {FLAGS.saves} checkpoints into "
                  f"{directory} ...", flush=True)
            rows += measure(depth, FLAGS.batch_size, FLAGS.steps, FLAGS.saves, directory,
                            formats)
    where = FLAGS.model_dir or "a local temporary folder"
    print(f"\nMachine: {machine.describe()}\nCheckpoints written into {where}.\n")
    print(machine.table(rows, [
        ("model", "model", "{}"), ("backend", "backend", "{}"), ("format", "format", "{}"),
        ("batch", "batch", "{}"), ("step_s", "step s", "{:.3f}"),
        ("megabytes", "checkpoint MB", "{:.1f}"), ("paused_s", "training paused s", "{:.3f}"),
        ("written_s", "written within s", "{:.3f}"),
        ("in_flight_s", "step s, checkpoint in flight", "{:.3f}"),
        ("steps_in_flight", "steps in flight", "{:.1f}"),
        ("steps", "checkpoint, in steps", "{:.2f}")]))


if __name__ == "__main__":
    app.run(main)

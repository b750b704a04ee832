"""What a checkpoint costs a training run, in a local folder or a bucket.

    python -m benchmarks.checkpoint_cost                          # ResNet-164 and -1001, local
    python -m benchmarks.checkpoint_cost --model_dir=gs://BUCKET/bench   # in a bucket
    KERAS_BACKEND=jax python -m benchmarks.checkpoint_cost --depths=164

For each depth, in one process: builds the looped pre-activation bottleneck
ResNet for CIFAR with momentum SGD (the recipe's optimizer state: one
momentum per weight), times ``--steps`` training steps (``train_on_batch``,
the median after one warm-up step), then writes ``--saves`` checkpoints
with the :class:`~keras_identity.training.checkpoints.Checkpointer` that
training runs use (the median), and removes them.  A checkpoint is written
while training waits, so its cost to a run is its time, shown also in
steps.  ``STORAGE_EMULATOR_HOST`` points ``gs://`` at a local emulator.

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


def measure(depth, batch_size, steps, saves, directory):
    """A row: the median step and checkpoint times of ``depth`` and the
    checkpoint's size; the checkpoints written into ``directory`` are
    removed."""
    import keras
    import numpy as np

    import keras_identity as ki
    from keras_identity import storage
    from keras_identity.training import checkpoints

    keras.utils.set_random_seed(0)
    model = ki.models.preact_resnet(depth, block="bottleneck")
    model.compile(keras.optimizers.SGD(0.1, momentum=0.9),
                  loss="sparse_categorical_crossentropy")
    ki.training.build_optimizer(model)
    rng = np.random.default_rng(0)
    x = rng.normal(size=(batch_size, 32, 32, 3)).astype("float32")
    y = rng.integers(0, 10, size=(batch_size,))
    model.train_on_batch(x, y)
    step_s = []
    for _ in range(steps):
        start = time.perf_counter()
        model.train_on_batch(x, y)
        step_s.append(time.perf_counter() - start)
    folder = storage.join(directory, f"checkpoint_cost_{depth}")
    checkpointer = checkpoints.Checkpointer(folder, keep=1, owns_directory=True)
    save_s = []
    try:
        for step in range(1, saves + 1):
            start = time.perf_counter()
            checkpointer.save(model, step=step, epoch=0, history=[])
            save_s.append(time.perf_counter() - start)
        size = sum(len(storage.read_bytes(storage.join(folder, name)))
                   for name in storage.list_files(folder) if name.endswith(".weights.h5"))
    finally:
        storage.rmtree(folder)
    step, save = statistics.median(step_s), statistics.median(save_s)
    return dict(model=f"preact_resnet{depth}", batch=batch_size, step_s=step, save_s=save,
                steps=save / step, megabytes=size / 2 ** 20,
                backend=keras.backend.backend())


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
    for name, check in checks:
        try:
            check()
        except ValueError as error:
            value = getattr(FLAGS, name)
            value = ",".join(value) if isinstance(value, list) else value
            sys.exit(f"benchmarks.checkpoint_cost: --{name}={value}: {error}")
    return depths


def main(argv):
    if len(argv) > 1:
        sys.exit(f"benchmarks.checkpoint_cost: unexpected arguments {argv[1:]}")
    depths = _check_flags()
    with tempfile.TemporaryDirectory(prefix="checkpoint_cost_") as scratch:
        directory = FLAGS.model_dir or scratch
        rows = []
        for depth in depths:
            print(f"preact_resnet{depth}: {FLAGS.steps} steps, {FLAGS.saves} checkpoints into "
                  f"{directory} ...", flush=True)
            rows.append(measure(depth, FLAGS.batch_size, FLAGS.steps, FLAGS.saves, directory))
    where = FLAGS.model_dir or "a local temporary folder"
    print(f"\nMachine: {machine.describe()}\nCheckpoints written into {where}.\n")
    print(machine.table(rows, [
        ("model", "model", "{}"), ("backend", "backend", "{}"), ("batch", "batch", "{}"),
        ("step_s", "step s", "{:.3f}"), ("megabytes", "checkpoint MB", "{:.1f}"),
        ("save_s", "checkpoint s", "{:.3f}"), ("steps", "checkpoint, in steps", "{:.2f}")]))


if __name__ == "__main__":
    app.run(main)

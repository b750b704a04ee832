"""Where a training run's first step goes: tracing, graph set-up and fresh memory.

    python -m benchmarks.first_step                            # looped ResNet-164, batch 64
    python -m benchmarks.first_step --recompute=bn_relu
    python -m benchmarks.first_step --pretouch_mb=1900         # fresh memory touched first

In one process it builds the model and its optimizer as ``benchmarks.run``
does, then calls Keras's training function (the one ``fit`` uses) once, and
``--steps`` more times: the first call traces the step, runs Grappler, sets up
the graph and executes it; the later ones only execute.  For every call it
counts the minor page faults, i.e. memory the process touches for the first
time.  Last it traces the same step again without running it (a second trace,
so Python-side caches are warm; the first trace was part of the first call).

With ``--pretouch_mb`` the process first allocates that much memory in
TensorFlow tensors and frees it, so the first step reuses memory TensorFlow's
allocator already holds: the difference to a run without it is what touching
fresh memory costs the first step on this machine.

Prints a Markdown table naming the machine.
"""

import resource
import sys
import time

from absl import app
from absl import flags

from benchmarks import machine
from keras_identity import _checks
from keras_identity.layers.residual import check_recompute
from keras_identity.models.resnet import resolve_depth
from keras_identity.models.stage import check_stage_mode

FLAGS = flags.FLAGS
if __name__ == "__main__":  # its names are other benchmarks' too (loop_gradient)
    flags.DEFINE_integer("depth", 164, "Depth of the pre-activation bottleneck ResNet (9n+2).")
    flags.DEFINE_integer("batch_size", 64, "Training batch size.")
    flags.DEFINE_string("stage_mode", "scan", "Stage mode: scan, unrolled or auto.")
    flags.DEFINE_string("recompute", "none", "Recomputation: none, bn_relu or unit.")
    flags.DEFINE_integer("steps", 3, "Calls after the first (steady steps).")
    flags.DEFINE_integer("pretouch_mb", 0, "Memory to allocate and free in TensorFlow tensors "
                         "before the first step (0: none).")


def _faults():
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt


def _pretouch(megabytes):
    import tensorflow as tf

    chunk = 16  # MB, the size of ResNet-164's largest feature maps at batch 64
    held = [tf.fill([chunk * 2 ** 18], 1.0) for _ in range(-(-megabytes // chunk))]
    del held


def measure(depth, batch_size, stage_mode, recompute, steps, pretouch_mb):
    import numpy as np
    import keras
    import tensorflow as tf

    import keras_identity as ki

    keras.utils.set_random_seed(0)
    model = ki.models.preact_resnet(depth, block="bottleneck", stage_mode=stage_mode,
                                    recompute=recompute)
    model.compile(keras.optimizers.SGD(0.1, momentum=0.9),
                  loss="sparse_categorical_crossentropy")
    ki.training.build_optimizer(model)
    rng = np.random.default_rng(0)
    x = rng.normal(size=(batch_size * (steps + 1), 32, 32, 3)).astype("float32")
    y = rng.integers(0, 10, size=(batch_size * (steps + 1),))
    iterator = iter(tf.data.Dataset.from_tensor_slices((x, y)).batch(batch_size))
    model.make_train_function()
    pretouch_s = 0.0
    if pretouch_mb:
        start = time.perf_counter()
        _pretouch(pretouch_mb)
        pretouch_s = time.perf_counter() - start

    calls = []
    for _ in range(steps + 1):
        faults, start = _faults(), time.perf_counter()
        logs = model.train_function(iterator)
        float(logs["loss"])
        calls.append((time.perf_counter() - start, _faults() - faults))

    start = time.perf_counter()
    tf.function(model.train_step).get_concrete_function(
        (tf.TensorSpec((batch_size, 32, 32, 3)), tf.TensorSpec((batch_size,), tf.int64)))
    trace_s = time.perf_counter() - start
    steady_s = sorted(s for s, _ in calls[1:])[len(calls[1:]) // 2]
    return dict(
        pretouch_mb=pretouch_mb, pretouch_s=pretouch_s, first_s=calls[0][0],
        steady_s=steady_s, excess_s=calls[0][0] - steady_s, trace_s=trace_s,
        first_faults=calls[0][1], steady_faults=max(f for _, f in calls[1:]),
        fresh_mb=calls[0][1] * resource.getpagesize() / 2 ** 20,
        peak_mb=resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0)


def _check_flags():
    """The library's own checks, each reported as a one-line flag error."""
    checks = (
        ("depth", lambda: resolve_depth(FLAGS.depth, "cifar10", "bottleneck")),
        ("recompute", lambda: check_recompute(FLAGS.recompute)),
        ("stage_mode", lambda: check_stage_mode(FLAGS.stage_mode, FLAGS.recompute)),
        ("batch_size", lambda: _checks.check_positive_int("batch_size", FLAGS.batch_size)),
        ("steps", lambda: _checks.check_positive_int("steps", FLAGS.steps)),
        ("pretouch_mb", lambda: _checks.check_range("pretouch_mb", FLAGS.pretouch_mb, low=0)))
    for name, check in checks:
        try:
            check()
        except ValueError as error:
            sys.exit(f"benchmarks.first_step: --{name}={getattr(FLAGS, name)}: {error}")


def main(argv):
    if len(argv) > 1:
        sys.exit(f"benchmarks.first_step: unexpected arguments {argv[1:]}")
    _check_flags()
    import keras

    if keras.backend.backend() != "tensorflow":
        sys.exit(f"benchmarks.first_step: it measures TensorFlow's tracing and graph set-up; "
                 f"the Keras backend is {keras.backend.backend()!r} (run it with "
                 f"KERAS_BACKEND=tensorflow; benchmarks.run measures JAX's first step).")
    row = measure(FLAGS.depth, FLAGS.batch_size, FLAGS.stage_mode, FLAGS.recompute,
                  FLAGS.steps, FLAGS.pretouch_mb)
    row.update(model=f"preact_resnet{FLAGS.depth}", batch=FLAGS.batch_size,
               mode=f"{FLAGS.stage_mode}, recompute={FLAGS.recompute}")
    print(f"\nMachine: {machine.describe()}\n")
    print(machine.table([row], [
        ("model", "model", "{}"), ("mode", "mode", "{}"), ("batch", "batch", "{}"),
        ("pretouch_mb", "pre-touched MB", "{:,}"), ("pretouch_s", "pre-touch s", "{:.1f}"),
        ("first_s", "first step s", "{:.2f}"), ("steady_s", "steady step s", "{:.2f}"),
        ("excess_s", "first - steady s", "{:.2f}"), ("trace_s", "second trace s", "{:.2f}"),
        ("first_faults", "page faults, first step", "{:,}"),
        ("fresh_mb", "fresh MB, first step", "{:,.0f}"),
        ("steady_faults", "page faults, steady step", "{:,}"),
        ("peak_mb", "peak MB", "{:,.0f}")]))


if __name__ == "__main__":
    app.run(main)

"""Where a training step of a CIFAR pre-activation ResNet spends its time.

For one model and batch it measures, in the same run:

* the whole training step (``model.fit``'s, SGD with momentum) of the
  TensorFlow looped net, images/s as :mod:`benchmarks.run` measures it;
* the same work as a ``tf.GradientTape`` step with the optimizer's update
  (what ``fit`` adds: the loss and metric trackers, the data iterator, the
  distribution wrapper), its forward and backward pass without the update,
  the update alone and the forward pass (the parts timed in turn);
* the convolutions alone: every convolution of the net (forward, gradient
  of the input, gradient of the kernel) timed on its own shape and summed
  over the net, on TensorFlow and, in a worker that imports PyTorch alone, on
  PyTorch channels-last;
* with ``--conv_threads``, the same two sums at each number of threads per
  operation, in fresh processes alternated between the frameworks: how far
  each framework's convolution kernels gain from a second core (TensorFlow
  runs oneDNN on its own thread pool, PyTorch on OpenMP).

The difference between the step and the convolutions is what BN, ReLU, the
additions, the loop and the optimizer cost.  The convolutions' two sums say
how far any Keras backend can outrun PyTorch on this machine when both run the
same convolution kernels' work.  Prints a Markdown table naming the machine.

    python -m benchmarks.step_profile --depth=164 --batch=64
    python -m benchmarks.step_profile --nostep --conv_threads=1,2
"""

import json
import os
import statistics
import subprocess
import sys
import time

from absl import app
from absl import flags

from benchmarks import machine

FLAGS = flags.FLAGS


def _define_flags():
    # Defined when run as a program only: benchmarks.run, importable beside
    # this module (conv_shapes), has flags of the same names.
    flags.DEFINE_integer("depth", 164, "Depth of the CIFAR pre-activation ResNet (6n+2 or "
                         "9n+2).")
    flags.DEFINE_integer("batch", 64, "Batch size.")
    flags.DEFINE_integer("repeats", 5, "Timed repetitions of each part (the median is shown).")
    flags.DEFINE_boolean("torch", True, "Also sum the convolutions in PyTorch channels-last.")
    flags.DEFINE_boolean("step", True, "Time the training step and its parts (--nostep: the "
                         "--conv_threads table alone).")
    flags.DEFINE_list("conv_threads", [], "Threads per operation at which to sum the "
                      "convolutions again, each in fresh processes of both frameworks "
                      "(for example 1,2; none by default).")
    flags.DEFINE_integer("rounds", 2, "--conv_threads: alternated rounds of fresh processes "
                         "(the median is shown).")
    flags.DEFINE_string("output_json", None, "Where to write the JSON (optional).")


def check_settings(depth, batch, repeats, step, conv_threads, rounds):
    """The thread counts of ``conv_threads`` as ints, once every setting is
    checked; a ValueError naming the flag otherwise."""
    from keras_identity import _checks
    from keras_identity.models.resnet import resolve_depth

    resolve_depth(depth, "cifar10")
    for name, value in (("batch", batch), ("repeats", repeats), ("rounds", rounds)):
        _checks.check_positive_int(f"--{name}", value)
    threads = []
    for value in conv_threads:
        try:
            count = int(value)
        except ValueError:
            count = 0
        if count < 1 or count in threads:
            raise ValueError(f"--conv_threads={','.join(conv_threads)} is not valid; expected "
                             f"distinct positive integers, such as 1,2.")
        threads.append(count)
    if not step and not threads:
        raise ValueError("--nostep leaves nothing to time; give --conv_threads (such as 1,2) "
                         "or drop --nostep.")
    return threads


def conv_shapes(depth, batch, image=32):
    """``{(n, h, w, cin, cout, k, stride): count}``: every convolution of the
    CIFAR pre-activation ResNet of ``depth``, its input NHWC shape."""
    from keras_identity.models.resnet import resolve_depth

    block, (n, _, _) = resolve_depth(depth, "cifar10")
    shapes = {}

    def add(h, cin, cout, k, stride=1, count=1):
        key = (batch, h, h, cin, cout, k, stride)
        shapes[key] = shapes.get(key, 0) + count

    add(image, 3, 16, 3)
    channels, size = 16, image
    for width, stride in zip((16, 32, 64), (1, 2, 2)):
        out = 4 * width if block == "bottleneck" else width
        inner = size // stride
        if block == "bottleneck":
            add(size, channels, width, 1, stride)
            add(inner, width, width, 3)
            add(inner, width, out, 1)
            add(size, channels, out, 1, stride)
            add(inner, out, width, 1, count=n - 1)
            add(inner, width, width, 3, count=n - 1)
            add(inner, width, out, 1, count=n - 1)
        else:
            add(size, channels, width, 3, stride)
            add(inner, width, width, 3)
            add(inner, width, width, 3, count=2 * (n - 1))
        channels, size = out, inner
    return shapes


def _time(fn, repeats):
    fn()
    fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def _tensorflow_convolutions(shapes, repeats):
    import tensorflow as tf

    total = 0.0
    for (n, h, w, cin, cout, k, stride), count in shapes.items():
        x = tf.random.normal((n, h, w, cin))
        kernel = tf.random.normal((k, k, cin, cout))
        dy = tf.random.normal((n, h // stride, w // stride, cout))

        @tf.function
        def step(x=x, kernel=kernel, dy=dy, stride=stride):
            with tf.GradientTape() as tape:
                tape.watch([x, kernel])
                y = tf.nn.conv2d(x, kernel, stride, "SAME")
            dx, dk = tape.gradient(y, [x, kernel], output_gradients=dy)
            return tf.reduce_sum(y[:1, :1, :1]) + tf.reduce_sum(dx[:1, :1, :1]) + dk[0, 0, 0, 0]

        total += count * _time(lambda: float(step()), repeats)
    return total


def _keras_parts(depth, batch, repeats):
    """Seconds per step of the TensorFlow looped net, the parts timed in turn
    (A B C D A B C D ...; medians): the whole ``fit`` step, the same work in
    a ``tf.GradientTape`` step with the optimizer's update, forward +
    backward without it, the update alone and the forward pass."""
    import keras
    import numpy as np
    import tensorflow as tf

    import keras_identity as ki

    keras.utils.set_random_seed(0)
    model = ki.models.preact_resnet(depth, stage_mode="scan")
    optimizer = keras.optimizers.SGD(0.1, momentum=0.9)
    model.compile(optimizer, loss="sparse_categorical_crossentropy")
    ki.training.build_optimizer(model)
    rng = np.random.default_rng(0)
    x = tf.constant(rng.normal(size=(batch, 32, 32, 3)).astype("float32"))
    y = tf.constant(rng.integers(0, 10, size=(batch,)))
    loss_fn = keras.losses.SparseCategoricalCrossentropy()
    zeros = [tf.zeros_like(v) for v in model.trainable_variables]

    @tf.function
    def forward():
        return loss_fn(y, model(x, training=True))

    @tf.function
    def forward_backward():
        with tf.GradientTape() as tape:
            loss = loss_fn(y, model(x, training=True))
        grads = tape.gradient(loss, model.trainable_variables)
        return loss + tf.add_n([tf.reduce_sum(g[..., :1]) for g in grads])

    @tf.function
    def tape_step():
        with tf.GradientTape() as tape:
            loss = loss_fn(y, model(x, training=True))
        optimizer.apply(tape.gradient(loss, model.trainable_variables),
                        model.trainable_variables)
        return loss

    @tf.function
    def update():
        optimizer.apply(zeros, model.trainable_variables)
        return tf.constant(0.0)

    model.make_train_function()
    data = tf.data.Dataset.from_tensors((x, y)).repeat()
    iterator = iter(data)
    parts = dict(step_s=lambda: float(model.train_function(iterator)["loss"]),
                 tape_step_s=lambda: float(tape_step()),
                 forward_backward_s=lambda: float(forward_backward()),
                 update_s=lambda: float(update()), forward_s=lambda: float(forward()))
    for fn in parts.values():
        fn()
        fn()
    times = {name: [] for name in parts}
    for _ in range(repeats):
        for name, fn in parts.items():
            start = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - start)
    return {name: statistics.median(values) for name, values in times.items()}


def _encoded(shapes):
    """``shapes`` (:func:`conv_shapes`) as JSON, for a worker's program."""
    return json.dumps([[list(k), v] for k, v in shapes.items()])


def _torch_convolutions(shapes, repeats, threads=None):
    """The convolutions' sum in PyTorch channels-last, in a process that
    imports PyTorch alone (``threads`` per operation, or PyTorch's own)."""
    program = f"""
import json, statistics, time, torch
if {threads!r} is not None:
    torch.set_num_threads({threads!r})
shapes, repeats, total = {_encoded(shapes)}, {repeats}, 0.0
for (n, h, w, cin, cout, k, stride), count in shapes:
    layout = torch.channels_last
    x = torch.randn(n, cin, h, w).to(memory_format=layout).requires_grad_()
    conv = torch.nn.Conv2d(cin, cout, k, stride, padding=k // 2, bias=False).to(
        memory_format=layout)
    dy = torch.randn(n, cout, h // stride, w // stride).to(memory_format=layout)
    def step():
        x.grad = None
        conv.weight.grad = None
        conv(x).backward(dy)
    step(); step()
    times = []
    for _ in range(repeats):
        start = time.perf_counter(); step(); times.append(time.perf_counter() - start)
    total += count * statistics.median(times)
print("RESULT " + json.dumps(dict(convolutions_s=total, torch=torch.__version__)))
"""
    done = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True)
    return machine.result(done)


_TF_WORKER = """
import json, sys
sys.path.insert(0, {repo!r})
import keras_identity  # TensorFlow's CPU kernels as the trainer chooses them
import tensorflow as tf
tf.config.threading.set_intra_op_parallelism_threads({threads})
tf.config.threading.set_inter_op_parallelism_threads(1)
from benchmarks import step_profile
shapes = {{tuple(k): v for k, v in {shapes}}}
total = step_profile._tensorflow_convolutions(shapes, {repeats})
print("RESULT " + json.dumps(dict(convolutions_s=total, tensorflow=tf.__version__)))
"""


def thread_sums(shapes, threads, repeats, rounds, torch=True):
    """Rows of the convolutions' sums at each of ``threads`` per operation
    (one operation at a time), TensorFlow and PyTorch channels-last, each a
    fresh process, the two alternated for ``rounds`` rounds; medians, and the
    frameworks' versions."""
    repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    encoded = _encoded(shapes)
    sums = {(t, side): [] for t in threads for side in ("tensorflow", "pytorch")}
    errors, versions = {}, {}
    for _ in range(rounds):
        for t in threads:
            program = _TF_WORKER.format(repo=repo, threads=t, shapes=encoded, repeats=repeats)
            results = [("tensorflow", machine.run_worker(["-c", program], {}, None))]
            if torch:
                results.append(("pytorch", _torch_convolutions(shapes, repeats, t)))
            for side, got in results:
                if "error" in got:
                    errors[(t, side)] = got["error"]
                else:
                    sums[(t, side)].append(got["convolutions_s"])
                    versions[side] = got["tensorflow" if side == "tensorflow" else "torch"]
    rows = []
    for t in threads:
        row = dict(threads=t, tensorflow=versions.get("tensorflow"),
                   torch=versions.get("pytorch"))
        for side in ("tensorflow", "pytorch"):
            values = sums[(t, side)]
            row[f"{side}_ms"] = statistics.median(values) * 1000 if values else None
            row[f"{side}_runs_ms"] = [v * 1000 for v in values]
        row["ratio"] = (row["tensorflow_ms"] / row["pytorch_ms"]
                        if row["tensorflow_ms"] and row["pytorch_ms"] else None)
        row["note"] = "; ".join(f"{side}: {errors[(t, side)]}" for side in
                                ("tensorflow", "pytorch") if (t, side) in errors) or None
        rows.append(row)
    first = rows[0]
    for row in rows:  # what the extra threads gain over the first count
        for side in ("tensorflow", "pytorch"):
            row[f"{side}_gain"] = (first[f"{side}_ms"] / row[f"{side}_ms"]
                                   if first[f"{side}_ms"] and row[f"{side}_ms"] else None)
    return rows


def main(argv):
    del argv
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    os.environ["KERAS_BACKEND"] = "tensorflow"
    import importlib.util

    if importlib.util.find_spec("tensorflow") is None:
        sys.exit("benchmarks.step_profile: TensorFlow is not installed; pip install -e "
                 "\".[cpu]\".")
    try:
        threads = check_settings(FLAGS.depth, FLAGS.batch, FLAGS.repeats, FLAGS.step,
                                 FLAGS.conv_threads, FLAGS.rounds)
    except ValueError as error:
        sys.exit(f"benchmarks.step_profile: {error}")
    description = machine.describe()
    print(f"Step profile on {description}", flush=True)
    shapes = conv_shapes(FLAGS.depth, FLAGS.batch)
    rows, thread_rows, torch_version = [], [], None
    if FLAGS.step:
        rows, torch_version = _step_rows(shapes, description)
    if threads:
        thread_rows = thread_sums(shapes, threads, FLAGS.repeats, FLAGS.rounds, FLAGS.torch)
        torch_version = torch_version or thread_rows[0]["torch"]
        print(f"\nMachine: {description}; the convolutions of preact_resnet{FLAGS.depth}, "
              f"batch {FLAGS.batch}, float32, each timed alone and summed, one operation at "
              f"a time; fresh processes, median of {FLAGS.rounds} alternated rounds\n")
        print(machine.table(thread_rows, [
            ("threads", "threads per operation", "{}"),
            ("tensorflow_ms", "TensorFlow ms", "{:.1f}"),
            ("tensorflow_gain", f"TensorFlow gain over {threads[0]} thread(s)", "{:.2f}"),
            ("pytorch_ms", "PyTorch channels-last ms", "{:.1f}"),
            ("pytorch_gain", f"PyTorch gain over {threads[0]} thread(s)", "{:.2f}"),
            ("ratio", "TensorFlow time / PyTorch's", "{:.2f}"), ("note", "note", "{}")]))
    if FLAGS.output_json:
        with open(FLAGS.output_json, "w") as f:
            json.dump(dict(machine=description, depth=FLAGS.depth, batch=FLAGS.batch,
                           torch=torch_version, rows=rows, conv_threads=thread_rows), f,
                      indent=2)


def _step_rows(shapes, description):
    """The step's parts and the convolutions' sums (rows of the first table),
    printed, and PyTorch's version."""
    parts = _keras_parts(FLAGS.depth, FLAGS.batch, FLAGS.repeats)
    parts["tf_convolutions_s"] = _tensorflow_convolutions(shapes, FLAGS.repeats)
    torch_parts = _torch_convolutions(shapes, FLAGS.repeats) if FLAGS.torch else {}
    step = parts["step_s"]
    rows = [
        dict(part="training step (TensorFlow looped, fit)", s=step),
        dict(part="forward + backward, no update", s=parts["forward_backward_s"]),
        dict(part="forward", s=parts["forward_s"]),
        dict(part="optimizer update alone (SGD with momentum)", s=parts["update_s"]),
        dict(part="GradientTape step: forward + backward + update", s=parts["tape_step_s"]),
        dict(part="fit's own work (step - GradientTape step)",
             s=step - parts["tape_step_s"]),
        dict(part="convolutions alone, TensorFlow", s=parts["tf_convolutions_s"]),
        dict(part="everything else: BN, ReLU, additions, loop, update",
             s=step - parts["tf_convolutions_s"]),
        dict(part="convolutions alone, PyTorch channels-last",
             s=torch_parts.get("convolutions_s"),
             note=torch_parts.get("error")),
    ]
    for row in rows:
        row["ms"] = row["s"] * 1000 if row["s"] is not None else None
        row["share"] = row["s"] / step if row["s"] is not None else None
    print(f"\nMachine: {description}; preact_resnet{FLAGS.depth}, batch {FLAGS.batch}, "
          f"float32, median of {FLAGS.repeats}\n")
    print(machine.table(rows, [("part", "part", "{}"), ("ms", "ms per step", "{:.1f}"),
                               ("share", "of the step", "{:.0%}"), ("note", "note", "{}")]))
    return rows, torch_parts.get("torch")


if __name__ == "__main__":
    _define_flags()
    app.run(main)

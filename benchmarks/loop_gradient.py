"""The TensorFlow loop's written gradient against TensorFlow's own.

    python -m benchmarks.loop_gradient                       # ResNet-164 b64, -1001 b16
    python -m benchmarks.loop_gradient --models=164:64 --recompute=bn_relu --rounds=3

``ResidualStack`` trains on TensorFlow with a backward pass written by hand
(``keras_identity/layers/residual/_tf_loop.py``).  This benchmark runs the
same looped pre-activation bottleneck ResNet with that loop replaced by
:func:`autodiff_train_loop` below: the same ``tf.while_loop`` over the same
stacked weights, the units run by ``orderings.run``'s program, differentiated
by TensorFlow (``recompute="bn_relu"`` as a ``tf.custom_gradient`` that keeps
only each BN's input and recomputes BN, ReLU and the convolution after it).
Both give the same gradients (``tests/benchmarks``).  Each configuration
runs in a fresh process (``benchmarks.first_step``'s measurement: first
step, median steady step, peak resident memory), the two loops alternated,
``--rounds`` times; the table shows each run.
"""

import json
import subprocess
import sys
import types

from absl import app
from absl import flags

from benchmarks import machine

FLAGS = flags.FLAGS
if __name__ == "__main__":
    flags.DEFINE_list("models", ["164:64", "1001:16"], "depth:batch of the pre-activation "
                      "bottleneck ResNets.")
    flags.DEFINE_list("recompute", ["none", "bn_relu"], "Recomputation levels.")
    flags.DEFINE_integer("rounds", 2, "Runs of each configuration (loops alternated).")
    flags.DEFINE_integer("steps", 6, "Steady steps after the first.")
    flags.DEFINE_string("worker", None, "Internal: loop,depth,batch,recompute,steps.")

LOOPS = ("written", "autodiff")


# ------------------------------------------------- the loop left to autodiff
def _conv(x, kernel):
    import tensorflow as tf

    return tf.nn.conv2d(x, kernel, strides=1, padding="SAME")


def _bn_relu_conv(epsilon):
    """``conv(relu(BN(t)))`` keeping only ``t`` for the backward pass."""
    import tensorflow as tf

    from keras_identity.layers.fused_batch_normalization import fused_batch_norm

    @tf.custom_gradient
    def segment(t, gamma, beta, kernel):
        y, (mean, variance) = fused_batch_norm(t, gamma, beta, None, None, epsilon, True)
        out = _conv(tf.nn.relu(y), kernel)

        def grad(dout, unused_dmean, unused_dvariance):
            with tf.control_dependencies([dout]):  # not ahead of the backward loop
                again = tf.identity(t)
            with tf.GradientTape() as tape:
                tape.watch([again, gamma, beta, kernel])
                y2, _ = fused_batch_norm(again, gamma, beta, None, None, epsilon, True)
                out2 = _conv(tf.nn.relu(y2), kernel)
            return tape.gradient(out2, [again, gamma, beta, kernel], output_gradients=dout)

        return (out, mean, variance), grad

    return segment


def _unit(program, epsilon, addition, training, recompute):
    import tensorflow as tf

    from keras_identity.layers.fused_batch_normalization import fused_batch_norm
    from keras_identity.layers.residual import orderings

    def unit(j, x, kernels, biases, bns, addition_weights):
        moments, added = [], []
        t = split = x
        k = 0
        while k < len(program):
            step = program[k]
            if (training and recompute == "bn_relu" and step[0] == "bn"
                    and program[k + 1:k + 2] == [orderings.RELU]
                    and k + 2 < len(program) and program[k + 2][0] == "conv"):
                c = program[k + 2][1]
                t, mean, variance = _bn_relu_conv(epsilon)(t, *bns[step[1]], kernels[c])
                moments.append((tf.stop_gradient(mean), tf.stop_gradient(variance)))
                t = t if biases[c] is None else t + biases[c]
                k += 3
                continue
            if step[0] == "conv":
                t = _conv(t, kernels[step[1]])
                t = t if biases[step[1]] is None else t + biases[step[1]]
            elif step[0] == "bn":
                t, m = fused_batch_norm(t, *bns[step[1]], *((None, None) if training else ()),
                                        epsilon, training)
                if training:
                    moments.append(tuple(tf.stop_gradient(v) for v in m))
            elif step == orderings.RELU:
                t = tf.nn.relu(t)
            elif step == orderings.SPLIT:
                split = t
            elif addition is None:
                t = split + t
            else:
                t, m = addition.apply(j, addition_weights, split, t, training)
                added += [tuple(tf.stop_gradient(v) for v in pair) for pair in m]
            k += 1
        return t, moments + added

    return unit


def _loop(program, inputs, kernels, biases, bns, epsilon, addition, training, recompute):
    import tensorflow as tf

    if recompute == "unit":
        raise ValueError("benchmarks.loop_gradient compares recompute='none' and 'bn_relu'.")
    num_units = kernels[0].shape[0]
    stacked = (list(kernels) + [b for b in biases if b is not None]
               + [w for ws in bns for w in ws] + (list(addition.weights) if addition else []))
    arrays = [tf.TensorArray(w.dtype, size=num_units, element_shape=w.shape[1:],
                             clear_after_read=False).unstack(w) for w in stacked]
    unit = _unit(program, epsilon, addition, training, recompute)
    num_moments = len(bns) + (addition.num_moments if addition and training else 0)
    stats = tuple(tf.TensorArray(tf.float32, size=num_units)
                  for _ in range(2 * num_moments)) if training else ()

    def body(j, x, stats):
        values = iter([a.read(j) for a in arrays])
        unit_kernels = [next(values) for _ in kernels]
        unit_biases = [None if b is None else next(values) for b in biases]
        unit_bns = [tuple(next(values) for _ in ws) for ws in bns]
        y, moments = unit(j, x, unit_kernels, unit_biases, unit_bns, list(values))
        flat = [m for pair in moments for m in pair]
        return j + 1, y, tuple(a.write(j, m) for a, m in zip(stats, flat))

    _, y, stats = tf.while_loop(lambda j, *_: j < num_units, body,
                                (tf.constant(0), inputs, stats),
                                maximum_iterations=num_units)
    stats = [a.stack() for a in stats]
    return y, [tuple(stats[2 * i:2 * i + 2]) for i in range(num_moments)]


def autodiff_train_loop(program, inputs, kernels, biases, bns, epsilon, recompute="none",
                        addition=None):
    """``_tf_loop.train_loop``'s contract, differentiated by TensorFlow."""
    return _loop(program, inputs, kernels, biases, bns, epsilon, addition, True, recompute)


def autodiff_inference_loop(program, inputs, kernels, biases, bns, epsilon, addition=None):
    y, _ = _loop(program, inputs, kernels, biases, bns, epsilon, addition, False, "none")
    return y


AUTODIFF_LOOP = types.SimpleNamespace(
    WRITES_GATE_GRADIENT=False, conv=_conv, train_loop=autodiff_train_loop,
    inference_loop=autodiff_inference_loop)


def use_autodiff_loop():
    """Makes every ResidualStack of this process train through the autodiff loop."""
    from keras_identity.layers.residual import stack

    stack._loop = lambda: AUTODIFF_LOOP


# ----------------------------------------------------------------- the run
def _work(spec):
    loop, depth, batch, recompute, steps = spec.split(",")
    from benchmarks import first_step

    if loop == "autodiff":
        use_autodiff_loop()
    row = first_step.measure(int(depth), int(batch), "scan", recompute, int(steps), 0)
    print("RESULT " + json.dumps(row), flush=True)


def main(argv):
    if len(argv) > 1:
        sys.exit(f"benchmarks.loop_gradient: unexpected arguments {argv[1:]}")
    if FLAGS.worker:
        return _work(FLAGS.worker)
    for name in FLAGS.recompute:
        if name not in ("none", "bn_relu"):
            sys.exit(f"benchmarks.loop_gradient: --recompute={name} is not valid; expected "
                     f"none or bn_relu.")
    rows = []
    for round_ in range(FLAGS.rounds):
        for model in FLAGS.models:
            depth, _, batch = model.partition(":")
            for recompute in FLAGS.recompute:
                for loop in (LOOPS if round_ % 2 == 0 else LOOPS[::-1]):
                    spec = f"{loop},{depth},{batch},{recompute},{FLAGS.steps}"
                    done = subprocess.run(
                        [sys.executable, "-m", "benchmarks.loop_gradient", f"--worker={spec}"],
                        capture_output=True, text=True)
                    row = machine.result(done)
                    row.update(model=f"preact_resnet{depth}", batch=int(batch), loop=loop,
                               recompute=recompute, round=round_ + 1)
                    if "steady_s" in row:
                        row["images_s"] = int(batch) / row["steady_s"]
                    rows.append(row)
                    print(f"{spec}: {row}", file=sys.stderr, flush=True)
    rows.sort(key=lambda r: (int(r["model"][13:]), r["recompute"], r["loop"], r["round"]))
    print(f"\nMachine: {machine.describe()}\n")
    print(machine.table(rows, [
        ("model", "model", "{}"), ("batch", "batch", "{}"), ("recompute", "recompute", "{}"),
        ("loop", "gradient", "{}"), ("round", "run", "{}"), ("first_s", "first step s", "{:.1f}"),
        ("images_s", "images/s", "{:.1f}"), ("peak_mb", "peak MB", "{:,.0f}"),
        ("error", "error", "{}")]))


if __name__ == "__main__":
    app.run(main)

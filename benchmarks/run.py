"""Training speed, start-up time and memory of deep pre-activation ResNets.

For each model, shortcut and stage mode it measures, each in a fresh process
(so peak memory and start-up are those of that configuration alone): the time
to build the Keras model, the time from the ``model.fit`` call to the end of
its first step (tracing, and compiling where XLA is on), steady-state
training images/s over later steps of the same call, and the process's peak
resident memory; then the same for a PyTorch rebuild of the identity-shortcut
network (same parameter count, checked) in the same run, and the ratio.  The
gated (Fig. 2(c), b_g = -6) and 1x1-shortcut (Fig. 2(e)) rows compare their
first step with the identity net's looped one.  The run also measures the
machine's float32 matrix-multiply peak (TensorFlow, square matmuls), so each
row's model FLOP utilisation (training FLOPs per image x images/s / peak) is
a column.  Prints a Markdown table naming the machine and writes JSON.

    python -m benchmarks.run                                  # docs/performance.md table
    python -m benchmarks.run --models=preact_resnet164 --modes=unrolled,scan
    python -m benchmarks.run --mixed_precision --jit_compile   # on a GPU

PyTorch comes with the optional extra: ``pip install -e ".[bench]"``; without
it (or with ``--notorch``) the reference columns are left empty.
"""

import json
import os
import subprocess
import sys
import time

from absl import app
from absl import flags

from benchmarks import machine

FLAGS = flags.FLAGS
flags.DEFINE_list("models", ["preact_resnet164", "preact_resnet1001"],
                  "CIFAR bottleneck pre-activation ResNets: named models of "
                  "keras_identity.models.list_models() or preact_resnet<9n+2>.")
flags.DEFINE_list("shortcuts", ["identity", "exclusive_gating", "conv1x1"],
                  "Shortcuts (Fig. 2); the identity runs --modes, the others "
                  "--shortcut_modes.")
flags.DEFINE_list("shortcut_modes", ["scan"], "Modes of the non-identity shortcuts.")
flags.DEFINE_list("modes", ["unrolled", "scan", "scan_bn_relu", "scan_recompute"],
                  "Keras stage modes: unrolled, scan, scan_bn_relu (scan with the BN-ReLU "
                  "outputs recomputed in the backward pass), scan_recompute (scan with the "
                  "units' activations recomputed in the backward pass).")
flags.DEFINE_list("batch_sizes", ["preact_resnet164:64", "preact_resnet1001:16"],
                  "Training batch size per model, model:batch (default 32).")
flags.DEFINE_list("backends", ["tensorflow", "jax"], "Keras backends measured (each in its "
                  "own process; JAX always compiles the step with XLA).")
flags.DEFINE_list("jax_modes", ["scan", "scan_bn_relu", "scan_recompute"],
                  "Modes measured on JAX (identity shortcut).")
flags.DEFINE_integer("steps", 6, "Steady-state training steps timed (after the warm-up).")
flags.DEFINE_integer("warmup", 2, "Training steps after the first, not timed.")
flags.DEFINE_boolean("torch", True, "Also measure the PyTorch rebuild.")
flags.DEFINE_boolean("jit_compile", False, "Compile the Keras train step with XLA.")
flags.DEFINE_boolean("mixed_precision", False,
                     "mixed_bfloat16 (TPU/CPU) or mixed_float16 (GPU) for Keras, autocast "
                     "for PyTorch.")
flags.DEFINE_float("peak_tflops", None, "Peak TFLOP/s of the device for model FLOP "
                   "utilisation (default: measured float32 matmul peak; the tensor-core "
                   "peak of a known GPU with --mixed_precision).")
flags.DEFINE_boolean("build_optimizer", True,
                     "Create the optimizer's variables before the first step, as "
                     "keras_identity's trainer does (--nobuild_optimizer: plain compile + fit).")
flags.DEFINE_integer("timeout_s", 1800, "Time limit of one measurement.")
flags.DEFINE_string("output_json", "benchmarks/results/latest.json", "Where to write JSON.")
flags.DEFINE_string("worker", None, "Internal: run one measurement, "
                    "framework:model:shortcut:mode:batch:params, or 'peak'.")

# Dense bf16/fp16 tensor-core peaks (TFLOP/s) for model FLOP utilisation.
_KNOWN_PEAKS = {"H100": 989.0, "H200": 989.0, "A100": 312.0, "V100": 125.0, "T4": 65.0,
                "L4": 121.0}
# Benchmark mode: (stage_mode, recompute) of the builder.
MODES = {"unrolled": ("unrolled", "none"), "scan": ("scan", "none"),
         "scan_bn_relu": ("scan", "bn_relu"), "scan_recompute": ("scan", "unit")}
# Builder arguments of each shortcut's rows (Table 1's best gate bias).
SHORTCUT_ARGS = {"identity": {}, "exclusive_gating": {"gate_bias_init": -6.0},
                 "shortcut_only_gating": {"gate_bias_init": -6.0}, "conv1x1": {},
                 "constant_scaling": {}, "dropout": {}}
_MATMUL_SIZE = 2048


def _depth(model):
    """The depth of a CIFAR-10 bottleneck pre-activation ResNet named ``model``
    (a registry name, or preact_resnet<depth>)."""
    from keras_identity.models import registry
    from keras_identity.models.resnet import resolve_depth

    prefix = "preact_resnet"
    if model in registry.NAMED_MODELS:
        builder, arguments = registry.resolve(model)
        depth = arguments["depth"] if builder.name == prefix and arguments.get(
            "dataset", "cifar10") == "cifar10" and "block" not in arguments else None
    else:
        digits = model[len(prefix):]
        depth = int(digits) if model.startswith(prefix) and digits.isdigit() else None
    if depth is None:
        raise ValueError(f"--models: {model!r} is not valid; expected a CIFAR-10 "
                         f"preact_resnet<depth> with depth = 9n+2 (e.g. preact_resnet164).")
    try:
        block, _ = resolve_depth(depth, "cifar10", "bottleneck")
    except ValueError:
        raise ValueError(f"--models: {model!r} is not valid; the bottleneck CIFAR nets need "
                         f"depth = 9n+2 (e.g. 164, 1001).") from None
    return depth


def forward_flops(depth, image=32, shortcut="identity"):
    """Multiply-adds x 2 of one forward pass of the CIFAR bottleneck net (a
    gated shortcut adds a 1x1 gate convolution to every unit, a conv1x1
    shortcut a 1x1 projection to every unit)."""
    n = (depth - 2) // 9
    macs = image * image * 9 * 3 * 16
    channels, size = 16, image
    gated = shortcut in ("exclusive_gating", "shortcut_only_gating")
    for width, stride in zip((16, 32, 64), (1, 2, 2)):
        size //= stride
        area = size * size
        macs += area * (channels * width + 9 * width * width + width * 4 * width)
        macs += area * channels * 4 * width  # the first unit's projection
        macs += (n - 1) * area * (4 * width * width + 9 * width * width + width * 4 * width)
        if gated:
            macs += area * channels * 4 * width + (n - 1) * area * 16 * width * width
        if shortcut == "conv1x1":
            macs += (n - 1) * area * 16 * width * width
        channels = 4 * width
    return 2 * (macs + channels * 10)


def _measure_peak():
    """float32 matmul TFLOP/s of this machine (best of 5): TensorFlow's where
    it is installed, else JAX's (a machine with JAX and no TensorFlow)."""
    import importlib.util

    n = _MATMUL_SIZE
    if importlib.util.find_spec("tensorflow") is not None:
        import tensorflow as tf

        a = tf.random.normal((n, n))
        b = tf.random.normal((n, n))
        matmul = tf.function(lambda a, b: tf.reduce_sum(tf.matmul(a, b)))
    else:
        import jax
        import jax.numpy as jnp

        a = jax.random.normal(jax.random.key(0), (n, n))
        b = jax.random.normal(jax.random.key(1), (n, n))
        matmul = jax.jit(lambda a, b: jnp.sum(a @ b))
    float(matmul(a, b))  # traced and compiled: not timed
    best = float("inf")
    for _ in range(5):
        start = time.perf_counter()
        float(matmul(a, b))
        best = min(best, time.perf_counter() - start)
    return dict(tflops=2 * n ** 3 / best / 1e12)


def _peak_rss_mb():
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


# --------------------------------------------------------------- measurement
def _measure_keras(depth, shortcut, mode, batch, steps, warmup):
    import numpy as np
    import keras

    import keras_identity as ki

    if FLAGS.mixed_precision:
        gpu = any(d.startswith("gpu") for d in keras.distribution.list_devices())
        keras.mixed_precision.set_global_policy("mixed_float16" if gpu else "mixed_bfloat16")
    keras.utils.set_random_seed(0)
    start = time.perf_counter()
    stage_mode, recompute = MODES[mode]
    model = ki.models.preact_resnet(depth, stage_mode=stage_mode, recompute=recompute,
                                    shortcut=shortcut, **SHORTCUT_ARGS[shortcut])
    build_s = time.perf_counter() - start
    params = sum(int(np.prod(w.shape)) for w in model.trainable_weights)
    model.compile(keras.optimizers.SGD(0.1, momentum=0.9),
                  loss="sparse_categorical_crossentropy",
                  jit_compile=FLAGS.jit_compile or keras.backend.backend() == "jax")
    if FLAGS.build_optimizer:
        ki.training.build_optimizer(model)  # as the trainer does: one trace, not two
    rng = np.random.default_rng(0)
    total = steps + warmup + 1
    x = rng.normal(size=(batch * total, 32, 32, 3)).astype("float32")
    y = rng.integers(0, 10, size=(batch * total,))

    ends = []

    class Clock(keras.callbacks.Callback):
        def on_train_batch_end(self, batch_index, logs=None):
            ends.append(time.perf_counter())

    # One fit call: the first step is timed from the call to the end of the
    # first batch.  (Timing a separate one-step fit would also count its end,
    # where deleting Keras's input iterator waits for tf.data's autotuning
    # thread, up to seconds.)
    start = time.perf_counter()
    model.fit(x, y, batch_size=batch, epochs=1, verbose=0, callbacks=[Clock()])
    first_step_s = ends[0] - start
    timed = ends[warmup:]
    images_per_s = batch * (len(timed) - 1) / (timed[-1] - timed[0])
    return dict(params=params, build_s=build_s, first_step_s=first_step_s,
                images_per_s=images_per_s)


def _measure_torch(depth, batch, steps, warmup, expected_parameters):
    import torch

    from benchmarks import torch_resnet

    torch.manual_seed(0)
    start = time.perf_counter()
    model = torch_resnet.build(depth, expected_parameters=expected_parameters)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    model.to(device).train()
    build_s = time.perf_counter() - start
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    loss_fn = torch.nn.CrossEntropyLoss()
    x = torch.randn(batch, 3, 32, 32, device=device)
    y = torch.randint(0, 10, (batch,), device=device)

    def step():
        optimizer.zero_grad(set_to_none=True)
        with torch.autocast(device, dtype=torch.float16 if device == "cuda" else torch.bfloat16,
                            enabled=FLAGS.mixed_precision):
            loss = loss_fn(model(x), y)
        loss.backward()
        optimizer.step()
        if device == "cuda":
            torch.cuda.synchronize()

    start = time.perf_counter()
    step()
    first_step_s = time.perf_counter() - start
    for _ in range(warmup):
        step()
    start = time.perf_counter()
    for _ in range(steps):
        step()
    images_per_s = batch * steps / (time.perf_counter() - start)
    return dict(params=torch_resnet.count_parameters(model), build_s=build_s,
                first_step_s=first_step_s, images_per_s=images_per_s)


def _worker(spec):
    if spec == "peak":
        print("RESULT " + json.dumps(_measure_peak()), flush=True)
        return
    framework, model, shortcut, mode, batch, params = spec.split(":")
    depth, batch = _depth(model), int(batch)
    if framework in ("keras", "tensorflow", "jax"):
        result = _measure_keras(depth, shortcut, mode, batch, FLAGS.steps, FLAGS.warmup)
    else:
        result = _measure_torch(depth, batch, FLAGS.steps, FLAGS.warmup,
                                int(params) if params else None)
    result["peak_memory_mb"] = _peak_rss_mb()
    print("RESULT " + json.dumps(result), flush=True)


def _run_worker(framework, model, shortcut, mode, batch, params=None):
    spec = "peak" if framework == "peak" else \
        f"{framework}:{model}:{shortcut}:{mode}:{batch}:{params or ''}"
    args = [sys.executable, "-m", "benchmarks.run", f"--worker={spec}",
            f"--steps={FLAGS.steps}", f"--warmup={FLAGS.warmup}",
            f"--{'' if FLAGS.jit_compile else 'no'}jit_compile",
            f"--{'' if FLAGS.mixed_precision else 'no'}mixed_precision",
            f"--{'' if FLAGS.build_optimizer else 'no'}build_optimizer"]
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")
    if framework in ("tensorflow", "jax"):
        env["KERAS_BACKEND"] = framework
    print(f"  {spec} ...", flush=True)
    try:
        done = subprocess.run(args, capture_output=True, text=True, env=env,
                              timeout=FLAGS.timeout_s)
    except subprocess.TimeoutExpired:
        return dict(error=f"over --timeout_s={FLAGS.timeout_s}")
    for line in done.stdout.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[len("RESULT "):])
    tail = (done.stderr.strip().splitlines() or ["no output"])[-1]
    return dict(error=f"exit {done.returncode}: {tail[:200]}")


def _batch_sizes():
    sizes = {}
    for item in FLAGS.batch_sizes:
        model, _, batch = item.partition(":")
        if not batch.isdigit() or int(batch) < 1:
            raise ValueError(f"--batch_sizes: {item!r} is not valid; expected model:batch "
                             f"with a positive batch (e.g. preact_resnet164:64).")
        sizes[model] = int(batch)
    return sizes


def _peak_tflops(description, measured):
    """``(peak TFLOP/s, where it comes from)`` for the MFU column."""
    if FLAGS.peak_tflops:
        return FLAGS.peak_tflops, "--peak_tflops"
    for name, peak in _KNOWN_PEAKS.items():
        if FLAGS.mixed_precision and f" {name}" in description and "GPU" in description:
            return peak, f"{name} dense 16-bit tensor-core peak"
    if measured:
        return measured, (f"measured float32 matmul peak ({_MATMUL_SIZE}x{_MATMUL_SIZE}, "
                          f"{'TensorFlow' if ', TensorFlow ' in description else 'JAX'})")
    return None, "none"


def main(argv):
    del argv
    if FLAGS.worker:
        _worker(FLAGS.worker)
        return
    try:
        depths = {model: _depth(model) for model in FLAGS.models}
        batches = _batch_sizes()
        for name, modes in (("modes", FLAGS.modes), ("shortcut_modes", FLAGS.shortcut_modes)):
            for mode in modes:
                if mode not in MODES:
                    raise ValueError(f"--{name}: {mode!r} is not valid; expected some of "
                                     f"{', '.join(MODES)}.")
        for backend in FLAGS.backends:
            if backend not in ("tensorflow", "jax"):
                raise ValueError(f"--backends: {backend!r} is not valid; expected some of "
                                 f"tensorflow, jax.")
        for mode in FLAGS.jax_modes:
            if mode not in MODES:
                raise ValueError(f"--jax_modes: {mode!r} is not valid; expected some of "
                                 f"{', '.join(MODES)}.")
        for shortcut in FLAGS.shortcuts:
            if shortcut not in SHORTCUT_ARGS:
                raise ValueError(f"--shortcuts: {shortcut!r} is not valid; expected some of "
                                 f"{', '.join(SHORTCUT_ARGS)}.")
        if FLAGS.steps < 2:
            raise ValueError(f"--steps={FLAGS.steps} is not valid; expected at least 2.")
    except ValueError as error:
        sys.exit(f"benchmarks.run: {error}")
    if FLAGS.torch:
        try:
            import torch  # noqa: F401
        except ImportError:
            sys.exit("benchmarks.run: PyTorch is not installed; pip install -e \".[bench]\" "
                     "or pass --notorch.")
    if "tensorflow" in FLAGS.backends:
        import importlib.util

        if importlib.util.find_spec("tensorflow") is None:
            sys.exit("benchmarks.run: TensorFlow is not installed; pip install -e \".[cpu]\" "
                     "or pass --backends=jax.")
    if "jax" in FLAGS.backends:
        try:
            import jax  # noqa: F401
        except ImportError:
            sys.exit("benchmarks.run: JAX is not installed; pip install -e \".[jax]\" or pass "
                     "--backends=tensorflow.")
    description = machine.describe()
    print(f"Benchmark on {description}", flush=True)
    measured = _run_worker("peak", None, None, None, None).get("tflops")
    peak, peak_source = _peak_tflops(description, measured)
    rows = []
    for model, depth in depths.items():
        batch = batches.get(model, 32)
        keras_rows = []
        if "tensorflow" in FLAGS.backends:
            for shortcut in FLAGS.shortcuts:
                for mode in FLAGS.modes if shortcut == "identity" else FLAGS.shortcut_modes:
                    result = _run_worker("tensorflow", model, shortcut, mode, batch)
                    keras_rows.append(dict(model=model, backend="tensorflow",
                                           shortcut=shortcut, mode=mode, batch=batch, **result))
        if "jax" in FLAGS.backends and "identity" in FLAGS.shortcuts:
            for mode in FLAGS.jax_modes:
                result = _run_worker("jax", model, "identity", mode, batch)
                keras_rows.append(dict(model=model, backend="jax", shortcut="identity",
                                       mode=mode, batch=batch, **result))
        reference = None
        if FLAGS.torch and "identity" in FLAGS.shortcuts:
            params = next((r["params"] for r in keras_rows
                           if "params" in r and r["shortcut"] == "identity"), None)
            reference = _run_worker("torch", model, "identity", "eager", batch, params)
            reference.update(model=model, backend="pytorch", shortcut="identity",
                             mode="eager", batch=batch)
        identity_scan = next((r for r in keras_rows if r["shortcut"] == "identity"
                              and r["backend"] == "tensorflow"
                              and r["mode"] == "scan" and "first_step_s" in r), None)
        for row in keras_rows + ([reference] if reference else []):
            flops = 3 * forward_flops(depth, shortcut=row["shortcut"])  # forward + backward
            speed = row.get("images_per_s")
            row["tflops_per_s"] = speed * flops / 1e12 if speed else None
            row["mfu"] = row["tflops_per_s"] / peak if speed and peak else None
            ref = reference.get("images_per_s") if reference else None
            same_net = row["shortcut"] == "identity"
            row["vs_pytorch"] = speed / ref if speed and ref and same_net else None
            if "build_s" in row and "first_step_s" in row:
                row["start_s"] = row["build_s"] + row["first_step_s"]
            if identity_scan and "first_step_s" in row and row is not reference:
                row["first_step_vs_identity_scan"] = (row["first_step_s"]
                                                      / identity_scan["first_step_s"])
            rows.append(row)

    columns = [("model", "model", "{}"), ("backend", "backend", "{}"),
               ("shortcut", "shortcut", "{}"),
               ("mode", "mode", "{}"), ("batch", "batch", "{}"),
               ("params", "params", "{:,d}"), ("build_s", "build (s)", "{:.1f}"),
               ("first_step_s", "first step (s)", "{:.1f}"),
               ("first_step_vs_identity_scan", "first step / TF identity scan", "{:.2f}"),
               ("images_per_s", "img/s", "{:.1f}"), ("vs_pytorch", "x PyTorch", "{:.2f}"),
               ("peak_memory_mb", "peak memory (MB)", "{:,.0f}"),
               ("tflops_per_s", "TFLOP/s", "{:.3f}"), ("mfu", "MFU", "{:.1%}")]
    shown = [dict(row, build_s=f"failed: {row['error']}") if "error" in row else row
             for row in rows]
    settings = (f"steps {FLAGS.steps} after {FLAGS.warmup} warm-up, XLA on TensorFlow "
                f"{'on' if FLAGS.jit_compile else 'off'} (always on JAX), mixed precision "
                f"{'on' if FLAGS.mixed_precision else 'off'}, optimizer built "
                f"{'before fit' if FLAGS.build_optimizer else 'in the first step'}")
    peak_text = f"{peak:.3f} TFLOP/s ({peak_source})" if peak else "unknown"
    print(f"\nMachine: {description}; {settings}; MFU peak {peak_text}\n")
    print(machine.table(shown, columns), flush=True)
    if FLAGS.output_json:
        os.makedirs(os.path.dirname(FLAGS.output_json) or ".", exist_ok=True)
        with open(FLAGS.output_json, "w") as f:
            json.dump(dict(machine=description, settings=settings, peak_tflops=peak,
                           peak_source=peak_source, date=time.strftime("%Y-%m-%d"),
                           rows=rows), f, indent=2)
        print(f"\nWrote {FLAGS.output_json}")


if __name__ == "__main__":
    app.run(main)

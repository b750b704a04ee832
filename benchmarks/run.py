"""Training speed, start-up time and memory of deep pre-activation ResNets.

For each model, backend, shortcut, stage mode and precision it measures, each
in a fresh process (so peak memory and start-up are those of that
configuration alone): the time to build the Keras model, the time from the
``model.fit`` call to the end of its first step (tracing, and compiling where
XLA is on), steady-state training images/s over later steps of the same
call, and the process's peak resident memory; then the same for the PyTorch
rebuild of the identity-shortcut network (same parameter count, checked) in
its fastest mode on the device (``--torch_mode=auto``: channels-last eager on
a CPU, ``torch.compile`` on a GPU), in a worker that imports PyTorch alone.
Every configuration runs ``--repeats`` times, the configurations of a model
alternated (A B C A B C ...), and the table shows the median of each, with
``x PyTorch`` against the PyTorch row of the same model and precision.  The
gated (Fig. 2(c), b_g = -6) and 1x1-shortcut (Fig. 2(e)) rows compare their
first step with the identity net's looped one.  The run also measures the
machine's float32 matrix-multiply peak, so each row's model FLOP utilisation
(training FLOPs per image x images/s / peak) is a column.  Prints a Markdown
table naming the machine and writes JSON.

    python -m benchmarks.run                                  # docs/performance.md table
    python -m benchmarks.run --models=preact_resnet110 --batch_sizes=preact_resnet110:32 \
        --backends=jax --jax_modes=unrolled,scan --precisions=float32
    python -m benchmarks.run --backends=jax --jit_compile     # a GPU or TPU machine, no TF

PyTorch comes with the optional extra: ``pip install -e ".[bench]"``; without
it (or with ``--notorch``) the reference columns are left empty.
"""

import json
import os
import statistics
import sys
import time

from absl import app
from absl import flags

from benchmarks import machine
from keras_identity_cli._preload import cpu_kernels

FLAGS = flags.FLAGS
flags.DEFINE_list("models", ["preact_resnet164", "preact_resnet1001"],
                  "CIFAR-10 pre-activation ResNets (preact_resnet<depth>: 6n+2 basic below "
                  "164 layers, 9n+2 bottleneck from 164 on).")
flags.DEFINE_list("shortcuts", ["identity"],
                  "Fig. 2 shortcuts measured on TensorFlow (identity, exclusive_gating, "
                  "conv1x1, ...).")
flags.DEFINE_list("shortcut_modes", ["scan"], "Modes of the non-identity shortcuts.")
flags.DEFINE_list("modes", ["scan"],
                  "TensorFlow stage modes: unrolled, scan, scan_bn_relu (recompute='bn_relu'), "
                  "scan_recompute (recompute='unit').")
flags.DEFINE_list("batch_sizes", ["preact_resnet164:64", "preact_resnet1001:16"],
                  "model:batch pairs (default batch 32).")
flags.DEFINE_list("backends", ["tensorflow", "jax"], "Keras backends measured (each in its "
                  "own process).")
flags.DEFINE_list("jax_modes", ["unrolled", "scan"], "Stage modes measured on JAX.")
flags.DEFINE_list("tf_kernels", ["default"],
                  "TensorFlow's CPU kernels, a row each: default (keras_identity's training "
                  "choice, or TF_ENABLE_ONEDNN_OPTS where you set it), onednn, eigen.")
flags.DEFINE_list("tf_threads", ["auto"],
                  "TensorFlow's CPU thread pools, a row each: auto (the trainer's choice for "
                  "the batch: keras_identity.training.cpu_threads), tensorflow (TensorFlow's "
                  "own split), or a number of threads per operation.")
flags.DEFINE_list("tf_imports", ["program"],
                  "How a TensorFlow worker loads the library, a row each: program (as "
                  "keras-identity-train: keras_identity's kernel choice and thread pools), "
                  "quickstart (the README's order, keras_identity then Keras, and model.fit "
                  "with TensorFlow's own pools), keras_first (Keras, and so TensorFlow, "
                  "imported before keras_identity: TensorFlow's own kernels and pools). "
                  "--tf_kernels and --tf_threads apply to program rows only.")
flags.DEFINE_list("precisions", ["float32", "bfloat16"],
                  "float32, and bfloat16 (Keras mixed_bfloat16, PyTorch autocast; float16 "
                  "on a GPU).")
flags.DEFINE_integer("repeats", 3, "Measurements of each configuration, alternated; the "
                     "table shows their median.")
flags.DEFINE_enum("torch_mode", "auto", ["auto", "eager", "channels_last", "compile"],
                  "PyTorch reference mode: auto is channels_last eager on a CPU and "
                  "torch.compile on a GPU.")
flags.DEFINE_integer("steps", 6, "Steady-state training steps timed (after the warm-up).")
flags.DEFINE_integer("warmup", 2, "Training steps after the first, not timed.")
flags.DEFINE_boolean("torch", True, "Also measure the PyTorch rebuild.")
flags.DEFINE_boolean("jit_compile", False, "Compile the TensorFlow train step with XLA "
                     "(always on for JAX).")
flags.DEFINE_float("peak_tflops", None, "Peak TFLOP/s of the device for model FLOP "
                   "utilisation (default: measured float32 matmul peak, or the dense 16-bit "
                   "peak of a known GPU for bfloat16 rows).")
flags.DEFINE_boolean("build_optimizer", True,
                     "Build the optimizer before fit, as the trainer does.")
flags.DEFINE_integer("timeout_s", 1800, "Time limit of one measurement.")
flags.DEFINE_string("output_json", "benchmarks/results/latest.json", "Where to write JSON.")
flags.DEFINE_string("worker", None, "Internal: run one measurement, "
                    "model:shortcut:mode:batch:precision:tf_threads:tf_imports, or 'peak'.")

# Dense bf16/fp16 peaks (TFLOP/s) of one device, for the 16-bit rows' model
# FLOP utilisation: GPU tensor cores, and TPU chips by JAX's device_kind.
_KNOWN_PEAKS = {"GPU": {"H100": 989.0, "H200": 989.0, "A100": 312.0, "V100": 125.0,
                        "T4": 65.0, "L4": 121.0},
                "TPU": {"TPU v6 lite": 918.0, "TPU v5 lite": 197.0, "TPU v5": 459.0,
                        "TPU v4": 275.0}}
# Benchmark mode: (stage_mode, recompute) of the builder.
MODES = {"unrolled": ("unrolled", "none"), "scan": ("scan", "none"),
         "scan_bn_relu": ("scan", "bn_relu"), "scan_recompute": ("scan", "unit")}
# Builder arguments of each shortcut's rows (Table 1's best gate bias).
SHORTCUT_ARGS = {"identity": {}, "exclusive_gating": {"gate_bias_init": -6.0},
                 "shortcut_only_gating": {"gate_bias_init": -6.0}, "conv1x1": {},
                 "constant_scaling": {}, "dropout": {}}
PRECISIONS = ("float32", "bfloat16")
# --tf_kernels: the TF_ENABLE_ONEDNN_OPTS of a TensorFlow worker (None: inherited).
TF_KERNELS = {"default": None, "onednn": "1", "eigen": "0"}
# --tf_imports: how a TensorFlow worker loads the library (see the flag).
TF_IMPORTS = ("program", "quickstart", "keras_first")
_MATMUL_SIZE = 2048


def _depth(model):
    """The depth of a CIFAR-10 pre-activation ResNet named ``model`` (a
    registry name, or preact_resnet<depth>)."""
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
                         f"preact_resnet<depth> (e.g. preact_resnet110, preact_resnet164).")
    try:
        resolve_depth(depth, "cifar10")
    except ValueError:
        raise ValueError(f"--models: {model!r} is not valid; the CIFAR nets need depth = "
                         f"6n+2 (basic, e.g. 110) or 9n+2 (bottleneck, e.g. 164, "
                         f"1001).") from None
    return depth


def forward_flops(depth, image=32, shortcut="identity"):
    """Multiply-adds x 2 of one forward pass of the CIFAR pre-activation net
    (a gated shortcut adds a 1x1 gate convolution to every unit, a conv1x1
    shortcut a 1x1 projection to every unit)."""
    from keras_identity.models.resnet import resolve_depth

    block, (n, _, _) = resolve_depth(depth, "cifar10")
    macs = image * image * 9 * 3 * 16
    channels, size = 16, image
    gated = shortcut in ("exclusive_gating", "shortcut_only_gating")
    for width, stride in zip((16, 32, 64), (1, 2, 2)):
        size //= stride
        area = size * size
        out = 4 * width if block == "bottleneck" else width
        if block == "bottleneck":
            macs += area * (channels * width + 9 * width * width + width * 4 * width)
            macs += area * channels * 4 * width  # the first unit's projection
            macs += (n - 1) * area * (4 * width * width + 9 * width * width
                                      + width * 4 * width)
        else:  # option A shortcuts: no projection
            macs += area * (9 * channels * width + 9 * width * width)
            macs += (n - 1) * area * 18 * width * width
        if gated:
            macs += area * channels * out + (n - 1) * area * out * out
        if shortcut == "conv1x1":
            macs += (n - 1) * area * out * out
        channels = out
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
def _tf_threads(value, batch):
    """Sets TensorFlow's pools for a ``--tf_threads`` value, before its
    runtime starts, as the trainer does; the pools' sizes as a cell."""
    import tensorflow as tf

    from keras_identity.training import cpu_threads

    named = {"auto": None, "tensorflow": 0}
    cpu_threads.configure(named[value] if value in named else int(value), batch)
    sizes = (tf.config.threading.get_intra_op_parallelism_threads(),
             tf.config.threading.get_inter_op_parallelism_threads())
    return "TF's own" if sizes == (0, 0) else f"{sizes[0]} x {sizes[1]} ops"


def _measure_keras(depth, shortcut, mode, batch, precision, steps, warmup, threads,
                   imports="program"):
    import numpy as np

    if imports == "quickstart":  # the README's order: TensorFlow's kernels chosen first
        import keras_identity as ki
        import keras
    else:  # a program's worker gets the choice from its parent (see main)
        import keras

        import keras_identity as ki

    tensorflow = keras.backend.backend() == "tensorflow"
    if tensorflow and imports == "program":
        threads_cell = _tf_threads(threads, batch)
    else:
        threads_cell = "TF's own" if tensorflow else None

    if precision == "bfloat16":
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
    result = dict(params=params, build_s=build_s, first_step_s=first_step_s,
                  images_per_s=images_per_s, peak_memory_mb=_peak_rss_mb())
    if keras.backend.backend() == "tensorflow":  # the kernels its CPU ops ran
        result["cpu_kernels"] = cpu_kernels.kernels()
        result["tf_threads_used"] = threads_cell
    return result


def _worker(spec):
    if spec == "peak":
        print("RESULT " + json.dumps(_measure_peak()), flush=True)
        return
    model, shortcut, mode, batch, precision, threads, imports = spec.split(":")
    result = _measure_keras(_depth(model), shortcut, mode, int(batch), precision, FLAGS.steps,
                            FLAGS.warmup, threads, imports)
    print("RESULT " + json.dumps(result), flush=True)


def _run(label, args, env):
    """Runs one measurement process; its ``RESULT`` line, or an error."""
    print(f"  {label}: {' '.join(args[2:])}", flush=True)
    result = machine.run_worker(args, env, FLAGS.timeout_s)
    # Each measurement's line as it ends: a run cut off before its table keeps them.
    print(f"    -> {_result_line(result)}", flush=True)
    return result


def _result_line(result):
    """One measurement's numbers, in a line (``failed: ...`` for an error)."""
    if "error" in result:
        return f"failed: {result['error']}"
    parts = [f"{result['images_per_s']:,.1f} img/s" if "images_per_s" in result else None,
             f"first step {result['first_step_s']:.1f} s" if "first_step_s" in result else None,
             f"peak {result['peak_memory_mb']:,.0f} MB" if "peak_memory_mb" in result else None,
             f"{result['tflops']:.3f} TFLOP/s" if "tflops" in result else None]
    return ", ".join(p for p in parts if p) or "done"


def _measure(config):
    """One measurement of ``config`` (a row's settings) in a fresh process."""
    if config["backend"] == "pytorch":
        return _run("pytorch", ["-m", "benchmarks.torch_resnet", f"--depth={config['depth']}",
                     f"--batch={config['batch']}", f"--steps={FLAGS.steps}",
                     f"--warmup={FLAGS.warmup}", f"--mode={FLAGS.torch_mode}",
                     f"--precision={config['precision']}"]
                    + ([f"--expected_parameters={config['expected_params']}"]
                       if config.get("expected_params") else []), {})
    spec = ":".join([config["model"], config["shortcut"], config["mode"], str(config["batch"]),
                     config["precision"], config.get("threads", "auto"),
                     config.get("imports", "program")])
    env = {"KERAS_BACKEND": config["backend"]}
    if TF_KERNELS.get(config.get("kernels")) is not None:
        env[cpu_kernels.VARIABLE] = TF_KERNELS[config["kernels"]]
    if config.get("imports", "program") != "program" and not cpu_kernels.user_set():
        # A library user's process: no choice of ours inherited (main's is for programs).
        env.update({cpu_kernels.VARIABLE: None, cpu_kernels.MARK: None})
    return _run(config["backend"], ["-m", "benchmarks.run", f"--worker={spec}", f"--steps={FLAGS.steps}",
                 f"--warmup={FLAGS.warmup}",
                 f"--{'' if FLAGS.jit_compile else 'no'}jit_compile",
                 f"--{'' if FLAGS.build_optimizer else 'no'}build_optimizer"], env)


def _median(results):
    """The median of each number over the repeats that succeeded (an error
    when none did)."""
    good = [r for r in results if "error" not in r]
    if not good:
        return dict(error=results[-1]["error"])
    merged = {key: statistics.median(r[key] for r in good) for key in good[0]
              if isinstance(good[0][key], (int, float))}
    merged.update({key: good[0][key] for key in good[0] if key not in merged})
    merged["params"] = good[0].get("params")
    merged["repeats"] = len(good)
    return merged


def _batch_sizes():
    sizes = {}
    for item in FLAGS.batch_sizes:
        model, _, batch = item.partition(":")
        if not batch.isdigit() or int(batch) < 1:
            raise ValueError(f"--batch_sizes: {item!r} is not valid; expected model:batch "
                             f"with a positive batch (e.g. preact_resnet164:64).")
        sizes[model] = int(batch)
    return sizes


def _peak_tflops(description, measured, precision):
    """``(peak TFLOP/s, where it comes from)`` for the MFU column."""
    if FLAGS.peak_tflops:
        return FLAGS.peak_tflops, "--peak_tflops"
    for kind, peaks in _KNOWN_PEAKS.items():
        for name, peak in peaks.items():
            if precision != "float32" and f", {kind} " in description and f" {name}" in \
                    description:
                return peak, f"{name} dense 16-bit peak of one device"
    if measured:
        return measured, (f"measured float32 matmul peak ({_MATMUL_SIZE}x{_MATMUL_SIZE}, "
                          f"{'TensorFlow' if ', TensorFlow ' in description else 'JAX'})")
    return None, "none"


def _check_flags():
    def check(name, values, allowed):
        for value in values:
            if value not in allowed:
                raise ValueError(f"--{name}: {value!r} is not valid; expected some of "
                                 f"{', '.join(allowed)}.")

    depths = {model: _depth(model) for model in FLAGS.models}
    batches = _batch_sizes()
    check("modes", FLAGS.modes, MODES)
    check("shortcut_modes", FLAGS.shortcut_modes, MODES)
    check("jax_modes", FLAGS.jax_modes, MODES)
    check("backends", FLAGS.backends, ("tensorflow", "jax"))
    check("shortcuts", FLAGS.shortcuts, SHORTCUT_ARGS)
    check("precisions", FLAGS.precisions, PRECISIONS)
    check("tf_kernels", FLAGS.tf_kernels, TF_KERNELS)
    check("tf_imports", FLAGS.tf_imports, TF_IMPORTS)
    for value in FLAGS.tf_threads:
        if value not in ("auto", "tensorflow") and not (value.isdigit() and int(value) > 0):
            raise ValueError(f"--tf_threads: {value!r} is not valid; expected auto, tensorflow "
                             f"or a positive number of threads per operation.")
    if FLAGS.steps < 2:
        raise ValueError(f"--steps={FLAGS.steps} is not valid; expected at least 2.")
    if FLAGS.repeats < 1:
        raise ValueError(f"--repeats={FLAGS.repeats} is not valid; expected at least 1.")
    return depths, batches


def _configs(model, depth, batch):
    """The rows of one model, in the order they are measured and shown."""
    rows = []
    for precision in FLAGS.precisions:
        common = dict(model=model, depth=depth, batch=batch, precision=precision)
        if "tensorflow" in FLAGS.backends:
            for shortcut in FLAGS.shortcuts:
                for mode in FLAGS.modes if shortcut == "identity" else FLAGS.shortcut_modes:
                    for imports in FLAGS.tf_imports:
                        if imports != "program":  # the library's own kernels and pools
                            rows.append(dict(common, backend="tensorflow", shortcut=shortcut,
                                             mode=mode, imports=imports))
                            continue
                        for kernels in FLAGS.tf_kernels:
                            for threads in FLAGS.tf_threads:
                                rows.append(dict(common, backend="tensorflow",
                                                 shortcut=shortcut, mode=mode, kernels=kernels,
                                                 threads=threads, imports=imports))
        if "jax" in FLAGS.backends and "identity" in FLAGS.shortcuts:
            for mode in FLAGS.jax_modes:
                rows.append(dict(common, backend="jax", shortcut="identity", mode=mode))
        if FLAGS.torch and "identity" in FLAGS.shortcuts:
            rows.append(dict(common, backend="pytorch", shortcut="identity",
                             mode=FLAGS.torch_mode))
    return rows


def _measure_model(model, depth, batch):
    """Every row of ``model``, each measured ``--repeats`` times with the
    rows alternated; the medians."""
    configs = _configs(model, depth, batch)
    results = [[] for _ in configs]
    for _ in range(FLAGS.repeats):
        for config, measured in zip(configs, results):
            if config["backend"] == "pytorch":
                # The Keras net's parameter count, checked by the PyTorch worker.
                config["expected_params"] = next(
                    (r[0]["params"] for c, r in zip(configs, results)
                     if r and "params" in r[0] and c["shortcut"] == "identity"), None)
            measured.append(_measure(config))
    return [dict(config, **_median(measured)) for config, measured in zip(configs, results)]


def _annotate(rows, depth, peaks):
    """Adds the derived columns: TFLOP/s, MFU, x PyTorch (same precision),
    start-up, first step against TensorFlow's identity loop."""
    for row in rows:
        row.pop("expected_params", None)
        same = [r for r in rows if r["precision"] == row["precision"]]
        reference = next((r for r in same if r["backend"] == "pytorch"), None)
        identity_scan = next((r for r in same if r["shortcut"] == "identity"
                              and r["backend"] == "tensorflow" and r["mode"] == "scan"
                              and row.get("kernels") in (None, r.get("kernels"))
                              and row.get("threads") in (None, r.get("threads"))
                              and row.get("imports") in (None, r.get("imports"))
                              and "first_step_s" in r), None)
        flops = 3 * forward_flops(depth, shortcut=row["shortcut"])  # forward + backward
        speed = row.get("images_per_s")
        peak = peaks[row["precision"]][0]
        row["tflops_per_s"] = speed * flops / 1e12 if speed else None
        row["mfu"] = row["tflops_per_s"] / peak if speed and peak else None
        ref = reference.get("images_per_s") if reference else None
        same_net = row["shortcut"] == "identity"
        row["vs_pytorch"] = speed / ref if speed and ref and same_net else None
        if "build_s" in row and "first_step_s" in row:
            row["start_s"] = row["build_s"] + row["first_step_s"]
        if identity_scan and "first_step_s" in row and row["backend"] != "pytorch":
            row["first_step_vs_identity_scan"] = (row["first_step_s"]
                                                  / identity_scan["first_step_s"])
    return rows


def main(argv):
    del argv
    if FLAGS.worker:
        _worker(FLAGS.worker)
        return
    try:
        depths, batches = _check_flags()
    except ValueError as error:
        sys.exit(f"benchmarks.run: {error}")
    import importlib.util

    if FLAGS.torch and importlib.util.find_spec("torch") is None:
        sys.exit("benchmarks.run: PyTorch is not installed; pip install -e \".[bench]\" "
                 "or pass --notorch.")
    if "tensorflow" in FLAGS.backends and importlib.util.find_spec("tensorflow") is None:
        sys.exit("benchmarks.run: TensorFlow is not installed; pip install -e \".[cpu]\" "
                 "or pass --backends=jax.")
    if "jax" in FLAGS.backends and importlib.util.find_spec("jax") is None:
        sys.exit("benchmarks.run: JAX is not installed; pip install -e \".[jax]\" or pass "
                 "--backends=tensorflow.")
    # The workers inherit it: they import Keras, and so TensorFlow, first.
    cpu_kernels.choose("training")
    description = machine.describe()
    print(f"Benchmark on {description}", flush=True)
    measured = _run("peak", ["-m", "benchmarks.run", "--worker=peak"], {}).get("tflops")
    peaks = {p: _peak_tflops(description, measured, p) for p in FLAGS.precisions}
    rows = []
    for model, depth in depths.items():
        rows += _annotate(_measure_model(model, depth, batches.get(model, 32)), depth, peaks)

    columns = [("model", "model", "{}"), ("backend", "backend", "{}"),
               ("shortcut", "shortcut", "{}"), ("mode", "mode", "{}"),
               ("imports", "imported as", "{}"),
               ("cpu_kernels", "TF kernels", "{}"),
               ("tf_threads_used", "TF threads per op x ops", "{}"),
               ("precision", "precision", "{}"),
               ("batch", "batch", "{}"),
               ("params", "params", "{:,d}"), ("build_s", "build (s)", "{:.1f}"),
               ("first_step_s", "first step (s)", "{:.1f}"),
               ("first_step_vs_identity_scan", "first step / TF identity scan", "{:.2f}"),
               ("images_per_s", "img/s", "{:.1f}"), ("vs_pytorch", "x PyTorch", "{:.2f}"),
               ("peak_memory_mb", "peak memory (MB)", "{:,.0f}"),
               ("tflops_per_s", "TFLOP/s", "{:.3f}"), ("mfu", "MFU", "{:.1%}")]
    if "tensorflow" not in FLAGS.backends:
        columns = [column for column in columns
                   if column[0] not in ("cpu_kernels", "tf_threads_used", "imports")]
    elif FLAGS.tf_imports == ["program"]:
        columns = [column for column in columns if column[0] != "imports"]
    shown = [dict(row, build_s=f"failed: {row['error']}") if "error" in row else row
             for row in rows]
    torch_version = next((r["torch"] for r in rows if "torch" in r), None)
    settings = (f"median of {FLAGS.repeats} alternated runs of {FLAGS.steps} steps after "
                f"{FLAGS.warmup} warm-up, XLA on TensorFlow "
                f"{'on' if FLAGS.jit_compile else 'off'} (always on JAX), optimizer built "
                f"{'before fit' if FLAGS.build_optimizer else 'in the first step'}"
                + (f", PyTorch {torch_version}" if torch_version else ""))
    peak_text = "; ".join(f"{p}: {peaks[p][0]:.3f} TFLOP/s ({peaks[p][1]})" if peaks[p][0]
                          else f"{p}: unknown" for p in FLAGS.precisions)
    print(f"\nMachine: {description}; {settings}; MFU peak {peak_text}\n")
    print(machine.table(shown, columns), flush=True)
    if FLAGS.output_json:
        os.makedirs(os.path.dirname(FLAGS.output_json) or ".", exist_ok=True)
        with open(FLAGS.output_json, "w") as f:
            json.dump(dict(machine=description, settings=settings,
                           peaks={p: dict(tflops=v[0], source=v[1]) for p, v in peaks.items()},
                           date=time.strftime("%Y-%m-%d"), rows=rows), f, indent=2)
        print(f"\nWrote {FLAGS.output_json}")


def run():
    app.run(main)


if __name__ == "__main__":
    run()

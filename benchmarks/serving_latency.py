r"""Latency of an exported model, against the Keras model it came from, ONNX
Runtime and PyTorch.

    python -m benchmarks.serving_latency --export_dir=serving/pre164 \
        --model_path=runs/pre164/model.keras

Times, at each of --batch_sizes (default 1 and 32):

* the SavedModel's ``serving_default`` signature run the way TF Serving runs
  it (a TF1 session, keras_identity.serving.emulator);
* with --model_path: the same model exported with ``jit_compile=True``
  (``keras-identity-export --jit_compile``, into a temporary folder), its
  ``serving_default`` in a TF1 session with XLA on, as TF Serving started
  with ``--xla_cpu_compilation_enabled=true`` runs it (--jit_compile_export);
* the same signature through ``tf.saved_model.load``;
* with --model_path: the Keras model called in a ``tf.function`` (the
  reference);
* ONNX Runtime (CPUExecutionProvider, its default graph optimisations,
  intra-op threads = the cores) on Keras's own ONNX export of the .keras
  model (``model.export(path, format="onnx")``; on TensorFlow it needs
  ``tf2onnx``);
* PyTorch inference (``torch.inference_mode``, channels-last, ``eval()``) of
  the rebuild of :mod:`benchmarks.torch_resnet`, for a CIFAR pre-activation
  ResNet (its depth from the model's name, ``preact_resnet<depth>``, or
  --torch_depth), with random weights: the latency needs the same
  architecture and parameter count (checked), not the trained values.

Each path runs in a worker process of its own (PyTorch and ONNX Runtime
without TensorFlow beside them), the paths alternated over --repeats rounds
(A B C D E A B C D E ..., fresh processes each round); a row is the median of
the rounds' p50 and p90 latencies (each over --iterations timed calls after 5
warm-up calls).  The serving paths are fed pixel values in [0, 255]; the
Keras model, ONNX Runtime and PyTorch the inputs the Keras model takes (the
same pixels for a model that includes its preprocessing, else the run's
normalisation of them from ``preprocessing.json`` beside the model, when there
is one).  The image size is --image_size, else the model's input size, else
the one the export's ``serving_default`` checks, else ``preprocessing.json``'s
``image_shape``, else that of the export's warm-up requests.  Prints a
Markdown table naming the machine (its vector units and whether TensorFlow's
oneDNN kernels are on) and writes --out (JSON).  Run with
``KERAS_BACKEND=tensorflow`` (the default; set here).

ONNX Runtime and PyTorch come with the optional extra: ``pip install -e
".[bench]"``; without them their rows say why they are empty.
"""

import json
import os
import re
import shutil
import statistics
import sys
import tempfile
import time
import warnings

from absl import app
from absl import flags

from benchmarks import machine
from keras_identity_cli import _common
from keras_identity_cli._preload import cpu_kernels

FLAGS = flags.FLAGS
flags.DEFINE_string("export_dir", None, "Version directory, or the base (latest version).")
flags.DEFINE_string("model_path", None, "The .keras model: the reference, ONNX Runtime and "
                    "PyTorch rows.")
flags.DEFINE_list("batch_sizes", ["1", "32"], "Batch sizes.")
flags.DEFINE_integer("iterations", 50, "Timed calls per batch size and round (after 5 "
                     "warm-up calls).")
flags.DEFINE_integer("repeats", 3, "Rounds, the paths alternated in fresh worker processes; "
                     "the table shows the median of the rounds.")
flags.DEFINE_integer("image_size", None, "Height = width of the images fed (default: the "
                     "model's, the export's or preprocessing.json's).")
flags.DEFINE_integer("torch_depth", None, "Depth of the CIFAR pre-activation ResNet that "
                     "PyTorch rebuilds (default: from the model's name, preact_resnet<depth>).")
flags.DEFINE_boolean("onnxruntime", True, "Measure ONNX Runtime on Keras's ONNX export.")
flags.DEFINE_boolean("torch", True, "Measure the PyTorch rebuild.")
flags.DEFINE_boolean("jit_compile_export", True, "With --model_path: also export the model "
                     "with jit_compile=True (keras-identity-export --jit_compile) into a "
                     "temporary folder and time its serving_default in a TF1 session with XLA "
                     "on, as TF Serving started with --xla_cpu_compilation_enabled=true runs "
                     "it.")
flags.DEFINE_enum("onednn", "auto", ["auto", "on", "off"],
                  "TensorFlow's oneDNN kernels in every TensorFlow path: auto is "
                  "TF_ENABLE_ONEDNN_OPTS where it is set, else keras-identity-serve's choice "
                  "(TensorFlow's own for this CPU: Eigen on AVX2).")
flags.DEFINE_integer("timeout_s", 1800, "Time limit of one worker process.")
flags.DEFINE_string("out", None, "JSON output (default: <export_dir>/latency.json).")
flags.DEFINE_string("worker", None, "Internal: measure one path, with the settings in "
                    "--work_dir.")
flags.DEFINE_string("work_dir", None, "Internal: the worker's settings and inputs.")

WARMUP_CALLS = 5
# (key, row name) in the order measured and shown.
PATHS = (("emulator", "SavedModel in a TF1 session (as TF Serving)"),
         ("emulator_xla", "SavedModel --jit_compile in a TF1 session (TF Serving "
                          "--xla_cpu_compilation_enabled=true)"),
         ("saved_model", "SavedModel via tf.saved_model.load"),
         ("keras", "Keras model in a tf.function (reference)"),
         ("onnxruntime", "ONNX Runtime on Keras's ONNX export"),
         ("pytorch", "PyTorch rebuild, random weights"))
NAMES = dict(PATHS)
# serving_default's size check (keras_identity.serving.signatures._shape_check),
# a string constant of the exported graph.
_SHAPE_CHECK = re.compile(rb"images must have shape \(batch, (\d+), (\d+), (\d+)\)")


def _time(fn, iterations):
    """``(p50, p90)`` in milliseconds of ``iterations`` calls after the
    warm-up calls."""
    for _ in range(WARMUP_CALLS):
        fn()
    times = []
    for _ in range(iterations):
        start = time.perf_counter()
        fn()
        times.append((time.perf_counter() - start) * 1000.0)
    times.sort()
    return times[len(times) // 2], times[int(len(times) * 0.9)]


# ------------------------------------------------------------------ workers
def _load_inputs(work_dir, setup, kind):
    import numpy as np

    return {batch: np.load(os.path.join(work_dir, f"{kind}_{batch}.npy"))
            for batch in setup["batch_sizes"]}


def _measure_tensorflow(path, setup, work_dir):
    import tensorflow as tf

    info = {}
    if path in ("emulator", "emulator_xla"):
        from keras_identity.serving.emulator import ServingEmulator

        # XLA on, as TF Serving with --xla_cpu_compilation_enabled=true: the
        # --jit_compile export needs it, and so does a JAX-backend export.
        emulator = ServingEmulator(setup["xla_version_dir" if path == "emulator_xla"
                                         else "version_dir"],
                                   xla_cpu_compilation_enabled=True)
        info["needs_xla"] = sorted(emulator.needs_xla)
        calls = {batch: (lambda images=images: emulator.run("serving_default",
                                                            {"images": images}))
                 for batch, images in _load_inputs(work_dir, setup, "pixels").items()}
    elif path == "saved_model":
        serve = tf.saved_model.load(setup["version_dir"]).signatures["serving_default"]
        calls = {batch: (lambda tensor=tf.constant(images): serve(images=tensor))
                 for batch, images in _load_inputs(work_dir, setup, "pixels").items()}
    else:
        import keras

        import keras_identity  # noqa: F401  (registers the model's layers)

        model = keras.models.load_model(setup["model_path"])
        compiled = tf.function(lambda x: model(x, training=False))
        calls = {batch: (lambda tensor=tf.constant(inputs): compiled(tensor))
                 for batch, inputs in _load_inputs(work_dir, setup, "model_inputs").items()}
    return info, calls


def _measure_onnxruntime(setup, work_dir):
    import numpy as np
    import onnxruntime as ort

    options = ort.SessionOptions()  # default graph optimisations (ORT_ENABLE_ALL)
    options.intra_op_num_threads = machine.cores()
    session = ort.InferenceSession(os.path.join(work_dir, "model.onnx"), options,
                                   providers=["CPUExecutionProvider"])
    name = session.get_inputs()[0].name
    inputs = _load_inputs(work_dir, setup, "model_inputs")
    first = setup["batch_sizes"][0]
    expected = np.load(os.path.join(work_dir, f"keras_outputs_{first}.npy"))
    got = session.run(None, {name: inputs[first]})[0]
    info = dict(onnxruntime=ort.__version__, threads=machine.cores(),
                max_abs_diff=float(np.max(np.abs(got - expected))))
    return info, {batch: (lambda x=x: session.run(None, {name: x}))
                  for batch, x in inputs.items()}


def _measure_pytorch(setup, work_dir):
    import torch

    from benchmarks import torch_resnet

    torch.set_num_threads(machine.cores())
    torch.manual_seed(0)
    model = torch_resnet.build(setup["torch_depth"], setup["num_classes"],
                               expected_parameters=setup["params"])
    model = model.eval().to(memory_format=torch.channels_last)
    calls = {}
    for batch, x in _load_inputs(work_dir, setup, "model_inputs").items():
        tensor = torch.from_numpy(x).permute(0, 3, 1, 2).contiguous(
            memory_format=torch.channels_last)

        def call(tensor=tensor):
            with torch.inference_mode():
                return model(tensor)

        calls[batch] = call
    info = dict(torch=torch.__version__, threads=torch.get_num_threads(),
                params=torch_resnet.count_parameters(model),
                cpu_capability=torch.backends.cpu.get_cpu_capability())
    return info, calls


def _worker(path, work_dir):
    """Times one path at every batch size; prints ``RESULT {json}``."""
    with open(os.path.join(work_dir, "setup.json")) as f:
        setup = json.load(f)
    if path == "onnxruntime":
        info, calls = _measure_onnxruntime(setup, work_dir)
    elif path == "pytorch":
        info, calls = _measure_pytorch(setup, work_dir)
    else:
        info, calls = _measure_tensorflow(path, setup, work_dir)
    times = {str(batch): _time(call, setup["iterations"]) for batch, call in calls.items()}
    imported = sorted({m.split(".")[0] for m in sys.modules}
                      & {"tensorflow", "keras", "jax", "torch", "onnxruntime"})
    if "tensorflow" in imported:  # the kernels this worker's TensorFlow runs
        info["onednn"] = cpu_kernels.onednn_enabled()
    print("RESULT " + json.dumps(dict(info, times=times, imported=imported)), flush=True)


# ------------------------------------------------------------------- set-up
def _version_dir(export_dir):
    """The SavedModel version of --export_dir (a version, or the base: its
    latest version); a one-line error otherwise."""
    if os.path.exists(os.path.join(export_dir, "saved_model.pb")):
        return export_dir
    if not os.path.isdir(export_dir):
        _common.fail(f"--export_dir={export_dir!r} does not exist", 2)
    versions = [int(n) for n in os.listdir(export_dir) if re.fullmatch(r"\d+", n)
                and os.path.exists(os.path.join(export_dir, n, "saved_model.pb"))]
    if not versions:
        _common.fail(f"--export_dir={export_dir!r} is neither a SavedModel version nor a "
                     f"directory of numbered versions", 2)
    return os.path.join(export_dir, str(max(versions)))


def _check_flags():
    try:
        batches = [int(b) for b in FLAGS.batch_sizes]
    except ValueError:
        batches = []
    if not batches or min(batches) < 1:
        _common.fail(f"--batch_sizes={','.join(FLAGS.batch_sizes)!r} is not valid; expected "
                     f"positive integers, e.g. 1,32", 2)
    for name in ("iterations", "repeats", "image_size", "torch_depth"):
        value = FLAGS[name].value
        if value is not None and value < 1:
            _common.fail(f"--{name}={value} is not valid; expected at least 1", 2)
    if FLAGS.model_path and not os.path.isfile(FLAGS.model_path):
        _common.fail(f"--model_path={FLAGS.model_path!r} does not exist", 2)
    return batches


def _export_check_size(version_dir):
    """``(height, width, channels)`` that the export's serving_default
    checks, or None (a model of any input size)."""
    with open(os.path.join(version_dir, "saved_model.pb"), "rb") as f:
        found = _SHAPE_CHECK.search(f.read())
    return tuple(int(found[i]) for i in (1, 2, 3)) if found else None


def _warmup_size(version_dir):
    """``(height, width)`` of the export's serving_default warm-up request,
    or None."""
    try:
        import tensorflow as tf

        from keras_identity.serving import warmup

        for request in warmup.read_warmup(version_dir):
            if request.model_spec.signature_name == "serving_default":
                shape = tf.make_ndarray(request.inputs["images"]).shape
                return shape[1], shape[2]
    except Exception:  # no warm-up file, or no tensorflow-serving-api
        return None
    return None


def _image_size(version_dir, model, preprocessing):
    """``(height, width, channels, where they come from)``."""
    checked = _export_check_size(version_dir)
    if model is not None:
        channels = model.input_shape[-1]
    elif checked:
        channels = checked[2]
    else:  # the channel dimension of the signature is static
        import tensorflow as tf

        serve = tf.saved_model.load(version_dir).signatures["serving_default"]
        channels = serve.structured_input_signature[1]["images"].shape[-1]
    checked = checked and checked[:2]
    if FLAGS.image_size:
        size, source = (FLAGS.image_size, FLAGS.image_size), "--image_size"
        if checked and checked != size:
            _common.fail(f"--image_size={FLAGS.image_size} is not valid: the export's "
                         f"serving_default takes {checked[0]}x{checked[1]} images", 2)
    elif model is not None and None not in model.input_shape[1:3]:
        size, source = tuple(model.input_shape[1:3]), "the model's input"
    elif checked:
        size, source = checked, "the export's serving_default"
    elif (preprocessing or {}).get("image_shape"):
        size, source = tuple(preprocessing["image_shape"][:2]), "preprocessing.json"
    else:
        size, source = _warmup_size(version_dir), "the export's warm-up requests"
        if size is None:
            _common.fail("the export takes images of any size and none was found: give "
                         "--image_size", 2)
    return size[0], size[1], channels, source


def _torch_spec(model):
    """``(depth, reason)``: the CIFAR pre-activation ResNet that PyTorch
    rebuilds, or None and why not."""
    if model is None:
        return None, "needs --model_path"
    if FLAGS.torch_depth:
        return FLAGS.torch_depth, None
    found = re.fullmatch(r"preact_resnet(\d+)(_cifar10|_cifar100)?", model.name)
    if not found:
        return None, (f"the model {model.name!r} is not a CIFAR pre-activation ResNet "
                      f"(preact_resnet<depth>); give --torch_depth")
    return int(found[1]), None


def _prepare(work_dir, version_dir, batches):
    """Writes the workers' settings and inputs; returns the settings and
    ``{path: reason}`` of the paths not measured."""
    import numpy as np
    import tensorflow as tf

    model = preprocessing = None
    skipped = {}
    inputs_note = "pixel values in [0, 255] to every path"
    if FLAGS.model_path:
        import keras

        import keras_identity as ki
        from keras_identity.layers.preprocessing import find_preprocessing

        model = keras.models.load_model(FLAGS.model_path)
        json_path = os.path.join(os.path.dirname(FLAGS.model_path), "preprocessing.json")
        if os.path.exists(json_path):
            preprocessing = ki.data.load_preprocessing(json_path)
        if find_preprocessing(model) is None:
            inputs_note = ("pixel values in [0, 255] to the SavedModel, "
                           + ("the run's normalisation of them (preprocessing.json) to the "
                              "others" if preprocessing else
                              "the same pixels to the others (no preprocessing layer and no "
                              "preprocessing.json)"))
    height, width, channels, size_source = _image_size(version_dir, model, preprocessing)
    rng = np.random.default_rng(0)
    for batch in batches:
        pixels = rng.uniform(0, 255, (batch, height, width, channels)).astype(np.float32)
        np.save(os.path.join(work_dir, f"pixels_{batch}.npy"), pixels)
        if model is not None:
            from keras_identity.layers.preprocessing import model_inputs

            normalization = (preprocessing or {}).get("normalization")
            fed = pixels if normalization is None else model_inputs(
                model, tf.constant(pixels), normalization)
            np.save(os.path.join(work_dir, f"model_inputs_{batch}.npy"),
                    np.asarray(fed, dtype=np.float32))
    setup = dict(version_dir=version_dir, model_path=FLAGS.model_path,
                 batch_sizes=batches, iterations=FLAGS.iterations,
                 image=[height, width, channels], image_source=size_source,
                 inputs=inputs_note)
    if model is None:
        for path in ("emulator_xla", "keras", "onnxruntime", "pytorch"):
            skipped[path] = "needs --model_path"
        return setup, skipped
    reason = _export_jit_compiled(model, preprocessing, os.path.join(work_dir, "xla"))
    if reason:
        skipped["emulator_xla"] = reason
    else:
        setup["xla_version_dir"] = os.path.join(work_dir, "xla", "1")
    setup["params"] = sum(int(np.prod(w.shape)) for w in model.trainable_weights)
    setup["num_classes"] = int(model.output_shape[-1])
    setup["model"] = model.name
    first = batches[0]
    np.save(os.path.join(work_dir, f"keras_outputs_{first}.npy"), np.asarray(
        model(np.load(os.path.join(work_dir, f"model_inputs_{first}.npy")), training=False),
        dtype=np.float32))
    reason = _export_onnx(model, os.path.join(work_dir, "model.onnx"))
    if reason:
        skipped["onnxruntime"] = reason
    else:
        setup["onnx_loops"] = _onnx_loops(os.path.join(work_dir, "model.onnx"))
    setup["torch_depth"], reason = _torch_spec(model)
    if not FLAGS.torch:
        skipped["pytorch"] = "--notorch"
    elif reason:
        skipped["pytorch"] = reason
    elif _missing("torch"):
        skipped["pytorch"] = "PyTorch is not installed: pip install torch (the bench extra)"
    return setup, skipped


def _missing(module):
    import importlib.util

    return importlib.util.find_spec(module) is None


def _export_jit_compiled(model, preprocessing, base):
    """Exports ``model`` with ``jit_compile=True`` as version 1 of ``base``;
    None, or why that row is not measured."""
    if not FLAGS.jit_compile_export:
        return "--nojit_compile_export"
    from keras_identity.layers.preprocessing import find_preprocessing
    from keras_identity.serving import export_saved_model

    raw = find_preprocessing(model) is None and not (preprocessing or {}).get("normalization")
    try:
        export_saved_model(model, base, preprocessing, version=1, warmup=False,
                           raw_pixels=raw, jit_compile=True)
    except Exception as error:  # reported in the row
        return f"the jit_compile export failed: {type(error).__name__}: " + " ".join(
            str(error).split())[:200]
    return None


def _export_onnx(model, path):
    """Writes Keras's ONNX export of ``model`` at ``path``; None, or why
    ONNX Runtime cannot be measured."""
    if not FLAGS.onnxruntime:
        return "--noonnxruntime"
    # tf2onnx: Keras's ONNX export on TensorFlow.
    missing = [package for package in ("onnxruntime", "tf2onnx") if _missing(package)]
    if missing:
        return (f"{' and '.join(missing)} not installed: pip install {' '.join(missing)} (the "
                f"bench extra)")
    import contextlib
    import io

    if model.dtype_policy.name != "float32":  # Keras exports float32 models to ONNX
        from keras_identity.models.weights import to_float32

        model = to_float32(model)
    log = io.StringIO()
    try:
        with contextlib.redirect_stdout(log), warnings.catch_warnings():
            warnings.simplefilter("ignore", FutureWarning)  # Keras's tf2onnx patch for NumPy 2
            model.export(path, format="onnx", verbose=False)
    except Exception as error:  # reported in the row
        message = " ".join(str(error).split())[:200]
        return f"the ONNX export failed: {type(error).__name__}: {message}"
    return None


def _onnx_loops(path):
    """The number of ONNX ``Loop`` nodes of the export (a looped stage,
    ``stage_mode="scan"``, exports as one), or None without the onnx package."""
    try:
        import onnx
    except ImportError:
        return None
    return sum(node.op_type in ("Loop", "Scan") for node in onnx.load(path).graph.node)


# ------------------------------------------------------------------ parent
def _choose_kernels():
    """Imports TensorFlow with --onednn's kernels (``auto``: the user's
    ``TF_ENABLE_ONEDNN_OPTS``, else the serving programs' choice,
    :func:`keras_identity._cpu_kernels.choose` ``"inference"``) and sets
    the variable to the state it took, so that every worker's TensorFlow
    runs the same kernels."""
    if FLAGS.onednn != "auto":
        cpu_kernels.set_kernels(FLAGS.onednn == "on")
    cpu_kernels.choose("inference")
    import tensorflow  # noqa: F401  (reads TF_ENABLE_ONEDNN_OPTS once)

    cpu_kernels.set_kernels(cpu_kernels.onednn_enabled())  # the workers' too


def _run_worker(path, work_dir):
    """One round of ``path`` in a fresh process: its ``RESULT``, or an error."""
    args = ["-m", "benchmarks.serving_latency", f"--worker={path}", f"--work_dir={work_dir}"]
    print(f"  {path}", flush=True)
    return machine.run_worker(args, dict(KERAS_BACKEND="tensorflow"), FLAGS.timeout_s)


def _rows(batches, results, skipped):
    """One row per batch size and path (medians over the rounds), with the
    ratios to ONNX Runtime (latency) and PyTorch (throughput)."""
    rows = []
    for batch in batches:
        same = []
        for path, name in PATHS:
            row = dict(path=name, key=path, batch=batch)
            good = [r for r in results.get(path, []) if "error" not in r]
            if path in skipped:
                row["skipped"] = skipped[path]
            elif not good:
                row["skipped"] = f"failed: {results[path][-1]['error']}"
            else:
                p50s = [r["times"][str(batch)][0] for r in good]
                p90s = [r["times"][str(batch)][1] for r in good]
                p50 = statistics.median(p50s)
                row.update(p50_ms=p50, p90_ms=statistics.median(p90s),
                           images_per_sec=batch * 1000.0 / p50, rounds=len(good),
                           p50_ms_rounds=p50s)
                row.update({k: v for k, v in good[0].items() if k not in ("times",)})
                if any(r.get("onednn") != good[0].get("onednn") for r in good):
                    row["onednn"] = "differed between rounds"
            same.append(row)
        ort = next(r for r in same if r["key"] == "onnxruntime").get("p50_ms")
        torch = next(r for r in same if r["key"] == "pytorch").get("images_per_sec")
        for row in same:
            row["vs_onnxruntime"] = row["p50_ms"] / ort if ort and "p50_ms" in row else None
            row["vs_pytorch"] = (row["images_per_sec"] / torch if torch and "p50_ms" in row
                                 else None)
        rows += same
    return rows


def _notes(setup, rows):
    by_key = {row["key"]: row for row in rows}
    kernels = {row.get("onednn") for row in rows if "onednn" in row}
    expected = os.environ[cpu_kernels.VARIABLE] == "1"
    notes = [] if kernels <= {expected} else [
        f"WARNING: the TensorFlow workers' oneDNN kernels were {sorted(map(str, kernels))}, "
        f"not {'on' if expected else 'off'} as in the machine line"]
    notes += [f"median over {FLAGS.repeats} alternated rounds (fresh worker processes) of "
             f"p50 and p90 of {FLAGS.iterations} timed calls after {WARMUP_CALLS} warm-up",
             f"images {setup['image'][0]}x{setup['image'][1]}x{setup['image'][2]} (size "
             f"from {setup['image_source']}), inputs: {setup['inputs']}",
             "x ONNX Runtime: p50 latency / ONNX Runtime's (above 1: slower); x PyTorch: "
             "images/s / PyTorch's (above 1: faster)"]
    if by_key.get("emulator", {}).get("needs_xla"):
        notes.append(f"the export runs its model through XLA "
                     f"({', '.join(by_key['emulator']['needs_xla'])}): TF Serving serves it "
                     f"only with --xla_cpu_compilation_enabled=true")
    if "needs_xla" in by_key.get("emulator_xla", {}):
        notes.append("--jit_compile: --model_path exported by export_saved_model(..., "
                     "jit_compile=True) with its other options at their defaults (a "
                     "mixed-precision model stays so), its forward pass one XLA computation; "
                     "XLA compiles each batch size on its first call (in the warm-up calls)")
    ort = by_key.get("onnxruntime", {})
    if "onnxruntime" in ort:
        loops = setup.get("onnx_loops")
        notes.append(f"ONNX Runtime {ort['onnxruntime']}: CPUExecutionProvider, default "
                     f"graph optimisations, {ort['threads']} intra-op threads; its outputs "
                     f"differ from Keras's by at most {ort['max_abs_diff']:.1e}"
                     + (f"; the export runs the looped stages as {loops} ONNX Loop(s)"
                        if loops else ""))
    torch = by_key.get("pytorch", {})
    if "torch" in torch:
        notes.append(f"PyTorch {torch['torch']}: the pre-activation ResNet-"
                     f"{setup['torch_depth']} rebuild of benchmarks/torch_resnet.py with "
                     f"random weights (latency needs the same architecture and parameter "
                     f"count, {torch['params']:,}, checked against the Keras model's), "
                     f"eval(), torch.inference_mode, channels_last, {torch['threads']} "
                     f"threads, CPU capability {torch['cpu_capability']}")
    return notes


def main(argv):
    if len(argv) > 1:
        _common.fail(f"unexpected arguments {argv[1:]}", 2)
    if FLAGS.worker:
        _worker(FLAGS.worker, FLAGS.work_dir)
        return
    if not FLAGS.export_dir:
        _common.fail("--export_dir is required", 2)
    batches = _check_flags()
    version_dir = _version_dir(FLAGS.export_dir)
    if _missing("tensorflow"):
        _common.fail("TensorFlow is not installed: pip install -e \".[cpu]\"", 2)
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else 0.0  # before we add to it
    # The reference calls the Keras model in a tf.function, and Keras's ONNX
    # export goes through TensorFlow (tf2onnx).
    os.environ["KERAS_BACKEND"] = "tensorflow"
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    _choose_kernels()
    description = machine.describe()
    print(f"machine: {description}", flush=True)
    work_dir = tempfile.mkdtemp(prefix="serving_latency_")
    try:
        setup, skipped = _prepare(work_dir, version_dir, batches)
        with open(os.path.join(work_dir, "setup.json"), "w") as f:
            json.dump(setup, f)
        paths = [path for path, _ in PATHS if path not in skipped]
        results = {path: [] for path in paths}
        for index in range(FLAGS.repeats):
            print(f"round {index + 1} of {FLAGS.repeats}", flush=True)
            for path in paths:
                if results[path] and all("error" in r for r in results[path]):
                    continue  # failed in the first round: not again
                results[path].append(_run_worker(path, work_dir))
    finally:
        shutil.rmtree(work_dir, ignore_errors=True)
    rows = _rows(batches, results, skipped)
    notes = _notes(setup, rows)
    if load > 0.5:
        notes.insert(0, f"WARNING: the load average was {load:.1f} when the run started: "
                        f"other processes may be running, and the timings are then not "
                        f"reliable (PyTorch's OpenMP threads least of all)")
    shown = [dict(row, p50_ms=f"- ({row['skipped']})") if "skipped" in row else row
             for row in rows]
    print(f"\nmachine: {description}")
    print(f"export: {version_dir}" + (f", model: {FLAGS.model_path}" if FLAGS.model_path
                                      else ""))
    print("; ".join(notes) + "\n")
    print(machine.table(shown, [("path", "path", "{}"), ("batch", "batch", "{}"),
                                ("p50_ms", "p50 ms", "{:.2f}"), ("p90_ms", "p90 ms", "{:.2f}"),
                                ("images_per_sec", "images/s", "{:.0f}"),
                                ("vs_onnxruntime", "x ONNX Runtime", "{:.2f}"),
                                ("vs_pytorch", "x PyTorch", "{:.2f}")]))
    out = FLAGS.out or os.path.join(version_dir, "..", "latency.json")
    with open(out, "w") as f:
        json.dump({"machine": description, "export": version_dir,
                   "model_path": FLAGS.model_path, "notes": notes, "settings": setup,
                   "date": time.strftime("%Y-%m-%d"), "rows": rows}, f, indent=1)
    print(f"\nwrote {out}")


if __name__ == "__main__":
    app.run(main, flags_parser=_common.one_line_flags_parser)

"""Which oneDNN calls a training step makes, and their time, on TensorFlow
and on PyTorch.

Both frameworks run their CPU convolutions (and TensorFlow its batch
normalisation) through oneDNN, which logs every primitive it executes with
``ONEDNN_VERBOSE=profile_exec``: its kind, implementation (``brg_conv_fwd:avx2``,
``gemm:jit``, ...), propagation and time.  For one CIFAR pre-activation ResNet
and batch this runs, each in a fresh process with that log on:

* TensorFlow's looped training step as ``keras-identity-train`` runs it
  (keras_identity's kernel choice and thread pools, ``train_on_batch``);
* PyTorch channels-last eager, the reference of :mod:`benchmarks.run`, in a
  worker that imports PyTorch alone;

and sums the calls of the timed steps (after the warm-up) by kind,
propagation and implementation, per step: calls, milliseconds of calls (core
time: calls that run at once on different cores both count) and the step's
wall time.  A kind or implementation that one framework calls and the other
does not, or one whose time differs, is where the two steps differ in
oneDNN's part; the rest of a step (Eigen's element-wise kernels, the
framework) is the wall time the calls do not explain.

    python -m benchmarks.onednn_calls --depth=1001 --batch=16
    ONEDNN_MAX_CPU_ISA=AVX2 python -m benchmarks.onednn_calls   # the AVX2 class's kernels

oneDNN writes its log with C's stdio, so each worker runs under ``stdbuf
-oL`` (coreutils), whose line buffering keeps the log in order with the
worker's step markers.
"""

import collections
import json
import os
import shutil
import subprocess
import sys
import time

from absl import app
from absl import flags

from benchmarks import machine

FLAGS = flags.FLAGS


def _define_flags():
    # Defined when run as a program only: benchmarks.run and the programs,
    # importable beside this module (parse), have flags of the same names.
    flags.DEFINE_integer("depth", 1001, "Depth of the CIFAR pre-activation ResNet (6n+2 or 9n+2).")
    flags.DEFINE_integer("batch", 16, "Batch size.")
    flags.DEFINE_integer("steps", 3, "Training steps logged and summed (after the warm-up).")
    flags.DEFINE_integer("warmup", 2, "Training steps before them, not counted.")
    flags.DEFINE_boolean("torch", True, "Also profile PyTorch channels-last.")
    flags.DEFINE_integer("top", 12, "Rows shown: the kinds and implementations with the most "
                         "time.")
    flags.DEFINE_integer("timeout_s", 1800, "Time limit of one worker.")
    flags.DEFINE_string("output_json", None, "Where to write the JSON (optional).")
    flags.DEFINE_string("worker", None, "Internal: tensorflow or pytorch.")


BEGIN, END = "KI_STEPS_BEGIN", "KI_STEPS_END"


def parse(lines):
    """``{(kind, propagation, implementation): [calls, ms]}`` of the oneDNN
    ``exec`` lines in ``lines`` (oneDNN 3's ``onednn_verbose,v1,primitive,exec,
    cpu,<kind>,<impl>,<prop>,...,<ms>`` and the older form without
    ``v1,primitive``)."""
    calls = collections.defaultdict(lambda: [0, 0.0])
    for line in lines:
        if not line.startswith("onednn_verbose,"):
            continue
        fields = line.rstrip().split(",")
        try:
            at = fields.index("exec")
            kind, impl, prop = fields[at + 2], fields[at + 3], fields[at + 4]
            ms = float(fields[-1])
        except (ValueError, IndexError):
            continue
        entry = calls[(kind, prop, impl)]
        entry[0] += 1
        entry[1] += ms
    return calls


def _tensorflow_steps(depth, batch):
    import numpy as np

    import keras_identity as ki
    import keras
    from keras_identity.training import cpu_threads

    cpu_threads.configure(None, batch)  # as the trainer: before the runtime starts
    model = ki.models.preact_resnet(depth, stage_mode="scan")
    model.compile(keras.optimizers.SGD(0.1, momentum=0.9),
                  loss="sparse_categorical_crossentropy")
    rng = np.random.default_rng(0)
    x = rng.normal(size=(batch, 32, 32, 3)).astype("float32")
    y = rng.integers(0, 10, size=(batch,))
    return lambda: model.train_on_batch(x, y)


def _pytorch_steps(depth, batch):
    import torch

    from benchmarks import torch_resnet

    torch.manual_seed(0)
    model = torch_resnet.build(depth).train().to(memory_format=torch.channels_last)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    loss_fn = torch.nn.CrossEntropyLoss()
    x = torch.randn(batch, 3, 32, 32).to(memory_format=torch.channels_last)
    y = torch.randint(0, 10, (batch,))

    def step():
        optimizer.zero_grad(set_to_none=True)
        loss_fn(model(x), y).backward()
        optimizer.step()

    return step


def _worker(framework):
    make = _tensorflow_steps if framework == "tensorflow" else _pytorch_steps
    step = make(FLAGS.depth, FLAGS.batch)
    for _ in range(1 + FLAGS.warmup):
        step()
    print(BEGIN, flush=True)
    start = time.perf_counter()
    for _ in range(FLAGS.steps):
        step()
    wall = time.perf_counter() - start
    print(END, flush=True)
    print("RESULT " + json.dumps(dict(step_ms=1000 * wall / FLAGS.steps)), flush=True)


def _profile(framework):
    """Runs a worker with oneDNN's log on; ``(result, calls per step)``."""
    args = [sys.executable, "-m", "benchmarks.onednn_calls", f"--worker={framework}",
            f"--depth={FLAGS.depth}", f"--batch={FLAGS.batch}", f"--steps={FLAGS.steps}",
            f"--warmup={FLAGS.warmup}"]
    env = dict(os.environ, ONEDNN_VERBOSE="profile_exec", TF_CPP_MIN_LOG_LEVEL="2",
               KERAS_BACKEND="tensorflow")
    print(f"  {framework}: {' '.join(args[2:])}", flush=True)
    try:
        done = subprocess.run(["stdbuf", "-oL", *args], capture_output=True, text=True,
                              env=env, timeout=FLAGS.timeout_s)
    except subprocess.TimeoutExpired:
        return dict(error=f"over --timeout_s={FLAGS.timeout_s}"), {}
    result = machine.result(done)
    lines = done.stdout.splitlines()
    if "error" in result or BEGIN not in lines or END not in lines:
        return dict(result, error=result.get("error", "no step markers")), {}
    timed = lines[lines.index(BEGIN) + 1:lines.index(END)]
    calls = {key: (n / FLAGS.steps, ms / FLAGS.steps) for key, (n, ms) in parse(timed).items()}
    print(f"    -> {result['step_ms']:,.0f} ms a step, {sum(ms for _, ms in calls.values()):,.0f} "
          f"ms of oneDNN calls", flush=True)
    return result, calls


def _by_kind(calls):
    kinds = collections.defaultdict(lambda: [0.0, 0.0])
    for (kind, prop, _), (n, ms) in calls.items():
        entry = kinds[(kind, prop)]
        entry[0] += n
        entry[1] += ms
    return kinds


def main(argv):
    del argv
    if FLAGS.worker:
        _worker(FLAGS.worker)
        return
    for name in ("depth", "batch", "steps"):
        if getattr(FLAGS, name) < 1:
            sys.exit(f"benchmarks.onednn_calls: --{name}={getattr(FLAGS, name)} is not valid; "
                     f"expected at least 1.")
    if shutil.which("stdbuf") is None:
        sys.exit("benchmarks.onednn_calls: stdbuf (coreutils) is not on the PATH; it keeps "
                 "oneDNN's log in order with the steps.")
    import importlib.util

    if FLAGS.torch and importlib.util.find_spec("torch") is None:
        sys.exit("benchmarks.onednn_calls: PyTorch is not installed; pip install -e "
                 "\".[bench]\" or pass --notorch.")
    frameworks = ["tensorflow"] + (["pytorch"] if FLAGS.torch else [])
    description = machine.describe()
    print(f"oneDNN calls on {description}", flush=True)
    profiles = {name: _profile(name) for name in frameworks}
    for name, (result, _) in profiles.items():
        if "error" in result:
            sys.exit(f"benchmarks.onednn_calls: the {name} worker failed: {result['error']}")

    print(f"\nMachine: {description}; ResNet-{FLAGS.depth}, batch {FLAGS.batch}, float32, "
          f"{FLAGS.steps} steps after {FLAGS.warmup + 1}; per step\n")
    step = {name: result["step_ms"] for name, (result, _) in profiles.items()}
    kinds = {name: _by_kind(calls) for name, (_, calls) in profiles.items()}
    keys = sorted(set().union(*kinds.values()),
                  key=lambda k: -max(kinds[n].get(k, (0, 0))[1] for n in frameworks))
    rows = [dict(part="step (wall)", **{f"{n}_ms": step[n] for n in frameworks})]
    rows.append(dict(part="oneDNN calls (core time)", **{
        f"{n}_ms": sum(ms for _, ms in kinds[n].values()) for n in frameworks}, **{
        f"{n}_calls": sum(c for c, _ in kinds[n].values()) for n in frameworks}))
    for kind, prop in keys:
        rows.append(dict(part=f"{kind} {prop}", **{
            f"{n}_{what}": kinds[n].get((kind, prop), (None, None))[i]
            for n in frameworks for i, what in ((0, "calls"), (1, "ms"))}))
    columns = [("part", "per step", "{}")]
    for n in frameworks:
        columns += [(f"{n}_calls", f"{n} calls", "{:,.0f}"), (f"{n}_ms", f"{n} ms", "{:,.1f}")]
    print(machine.table(rows, columns), flush=True)

    impl_rows = []
    for name in frameworks:
        calls = profiles[name][1]
        for (kind, prop, impl), (n, ms) in sorted(calls.items(), key=lambda kv: -kv[1][1])[
                :FLAGS.top]:
            impl_rows.append(dict(framework=name, kind=f"{kind} {prop}", impl=impl, calls=n,
                                  ms=ms, per_call=1000 * ms / n if n else None))
    print("\nImplementations with the most time, per step:\n")
    print(machine.table(impl_rows, [("framework", "framework", "{}"), ("kind", "kind", "{}"),
                                    ("impl", "implementation", "{}"),
                                    ("calls", "calls", "{:,.0f}"), ("ms", "ms", "{:,.1f}"),
                                    ("per_call", "µs a call", "{:,.0f}")]), flush=True)
    if FLAGS.output_json:
        os.makedirs(os.path.dirname(FLAGS.output_json) or ".", exist_ok=True)
        with open(FLAGS.output_json, "w") as f:
            json.dump(dict(machine=description, depth=FLAGS.depth, batch=FLAGS.batch,
                           steps=FLAGS.steps, warmup=FLAGS.warmup, step_ms=step,
                           calls={n: [dict(kind=k, prop=p, impl=i, calls=c, ms=ms)
                                      for (k, p, i), (c, ms) in profiles[n][1].items()]
                                  for n in frameworks},
                           date=time.strftime("%Y-%m-%d")), f, indent=2)
        print(f"\nWrote {FLAGS.output_json}")


if __name__ == "__main__":
    _define_flags()
    app.run(main)

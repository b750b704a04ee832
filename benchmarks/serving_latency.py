r"""Latency of an exported model, against the Keras model it came from.

    python -m benchmarks.serving_latency --export_dir=serving/pre164 \
        --model_path=runs/pre164/model.keras

Times, at batch 1 and 32: the SavedModel's serving_default signature run the
way TF Serving runs it (a TF1 session, keras_identity.serving.emulator), the
same signature through tf.saved_model.load, and (reference) the Keras model
called in a tf.function on normalised inputs.  Prints a Markdown table naming the
machine and writes --out (JSON).
"""

import json
import os
import time

from absl import app
from absl import flags

from keras_identity_cli import _common

FLAGS = flags.FLAGS
flags.DEFINE_string("export_dir", None, "Version directory, or the base (latest version).")
flags.DEFINE_string("model_path", None, "The .keras model, for the reference timing.")
flags.DEFINE_list("batch_sizes", ["1", "32"], "Batch sizes.")
flags.DEFINE_integer("iterations", 50, "Timed calls per batch size (after 5 warm-up calls).")
flags.DEFINE_string("out", None, "JSON output (default: <export_dir>/latency.json).")
flags.mark_flag_as_required("export_dir")


def _time(fn, iterations):
    for _ in range(5):
        fn()
    times = []
    for _ in range(iterations):
        start = time.perf_counter()
        fn()
        times.append((time.perf_counter() - start) * 1000.0)
    times.sort()
    return times[len(times) // 2], times[int(len(times) * 0.9)]


def main(argv):
    if len(argv) > 1:
        _common.fail(f"unexpected arguments {argv[1:]}", 2)
    import numpy as np
    import tensorflow as tf

    from benchmarks import machine
    from keras_identity.serving.emulator import ServingEmulator
    from keras_identity.serving.emulator import latest_version

    version_dir = FLAGS.export_dir
    if not os.path.exists(os.path.join(version_dir, "saved_model.pb")):
        if not os.path.isdir(version_dir):
            _common.fail(f"export_dir={version_dir!r} does not exist", 2)
        version_dir = os.path.join(version_dir, str(latest_version(version_dir)))
    emulator = ServingEmulator(version_dir)
    loaded = tf.saved_model.load(version_dir)
    serve = loaded.signatures["serving_default"]
    shape = serve.structured_input_signature[1]["images"].shape
    keras_model = normalization = None
    if FLAGS.model_path:
        import keras

        import keras_identity as ki

        keras_model = keras.models.load_model(FLAGS.model_path)
        prep = ki.data.load_preprocessing(
            os.path.join(os.path.dirname(FLAGS.model_path), "preprocessing.json"))
        normalization = prep["normalization"]
        shape = (None,) + tuple(keras_model.input_shape[1:])
    height, width, channels = shape[1] or 224, shape[2] or 224, shape[3]
    rows = []
    rng = np.random.default_rng(0)
    for batch in (int(b) for b in FLAGS.batch_sizes):
        images = rng.uniform(0, 255, (batch, height, width, channels)).astype(np.float32)
        tensor = tf.constant(images)
        entries = [
            ("SavedModel in a TF1 session (as TF Serving)",
             lambda: emulator.run("serving_default", {"images": images})),
            ("SavedModel via tf.saved_model.load", lambda: serve(images=tensor)),
        ]
        if keras_model is not None:
            normalized = ki.layers.model_inputs(keras_model, tensor, normalization)
            compiled = tf.function(lambda x: keras_model(x, training=False))
            entries.append(("Keras model in a tf.function (reference)",
                            lambda: compiled(normalized)))
        for name, fn in entries:
            p50, p90 = _time(fn, FLAGS.iterations)
            rows.append({"path": name, "batch": batch, "p50_ms": p50, "p90_ms": p90,
                         "images_per_sec": batch * 1000.0 / p50})
    print(f"machine: {machine.describe()}")
    print(f"export: {version_dir}\n")
    print(machine.table(rows, [("path", "path", "{}"), ("batch", "batch", "{}"),
                               ("p50_ms", "p50 ms", "{:.2f}"), ("p90_ms", "p90 ms", "{:.2f}"),
                               ("images_per_sec", "images/s", "{:.0f}")]))
    out = FLAGS.out or os.path.join(version_dir, "..", "latency.json")
    with open(out, "w") as f:
        json.dump({"machine": machine.describe(), "export": version_dir, "rows": rows}, f,
                  indent=1)


if __name__ == "__main__":
    app.run(main, flags_parser=_common.one_line_flags_parser)

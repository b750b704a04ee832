r"""Exports a trained .keras model as a TF Serving SavedModel version.

    keras-identity-export --model_path=runs/pre164/model.keras \
        --export_dir=serving/pre164
    python -m keras_identity_cli.export ...       # the same, as a module

writes serving/pre164/<version>/ (the next free version unless --version),
with the signatures serving_default (float images), serving_bytes (JPEG/PNG
bytes) and serving_uint8, and assets.extra/tf_serving_warmup_requests.  Any
.keras model exports: one that includes its preprocessing (every model
keras-identity-train saves) takes pixel values in [0, 255]; for an older
run's model the preprocessing.json beside it puts the normalisation in the
graph; a model with neither is refused, unless --raw_pixels says it takes
pixel values as they are (the command says which applies, and so does
assets.extra/inputs.txt).  The export is loaded back the
way TF Serving loads it and the warm-up requests are replayed before the
command reports success.

--model_path, --preprocessing and --export_dir may be in a bucket
(gs://BUCKET/...): the model is read from there, and the version is written
locally, uploaded, and loaded back from the bucket.
"""

import os

from absl import flags

from keras_identity_cli import _common as _cli
from keras_identity_cli._preload import cpu_kernels

# Before TensorFlow is imported: oneDNN's BN-fused convolutions are slow at
# small batches on AVX2 CPUs, where TensorFlow's own choice is Eigen.
cpu_kernels.choose("inference")

FLAGS = flags.FLAGS
flags.DEFINE_string("model_path", None, "The .keras model (e.g. runs/pre164/model.keras).")
flags.DEFINE_string("export_dir", None, "TF Serving's --model_base_path; versions go below.")
flags.DEFINE_integer("version", None, "Version number (default: the next free one).")
flags.DEFINE_string("preprocessing", None, "preprocessing.json of the training run (default: "
                    "the one beside --model_path, if any). Models that include their "
                    "preprocessing need none; older runs' models take their normalisation "
                    "from it.")
flags.DEFINE_bool("raw_pixels", False, "The model takes pixel values in [0, 255] as they "
                  "are: export a model with no preprocessing layer and no preprocessing.json "
                  "(refused otherwise: its pixel signatures would feed it unnormalised "
                  "pixels).")
flags.DEFINE_list("class_names", None, "Class names the signatures return, comma-separated "
                  "(default: the preprocessing.json's, else the class indices).")
flags.DEFINE_integer("top_k", 5, "Classes returned per example.")
flags.DEFINE_string("model_name", None, "Model name of the warm-up requests (default: the "
                    "export directory's name).")
flags.DEFINE_bool("float32", False, "Serve a mixed-precision model in float32.")
flags.DEFINE_bool("warmup", True, "Write assets.extra/tf_serving_warmup_requests.")
flags.DEFINE_integer("image_size", None, "Side of the square images served, for a model "
                     "whose input size is not fixed (e.g. input_shape=(None, None, 3)): "
                     "serving_bytes resizes and crops to it (default: the "
                     "preprocessing.json's image_shape).")
flags.DEFINE_integer("eval_resize", None, "serving_bytes resizes an image's shorter side to "
                     "this, then crops the centre to the input size (ImageNet: 256 for 224, "
                     "or 320 at 320; default: the preprocessing.json's, else the input "
                     "height).")
flags.DEFINE_bool("overwrite", False, "Replace an existing version.")
flags.DEFINE_bool("jit_compile", False, "The model's forward pass as one XLA computation "
                  "(TensorFlow backend; a half to two-thirds of the batch-1 CPU latency): TF "
                  "Serving then needs --xla_cpu_compilation_enabled=true.")
flags.DEFINE_integer("max_image_bytes", 20 * 2 ** 20, "serving_bytes refuses an encoded image "
                     "larger than this (InvalidArgument).")
flags.DEFINE_integer("max_image_pixels", 36_000_000, "serving_bytes refuses an image whose "
                     "header declares more pixels (checked before decoding).")
flags.mark_flags_as_required(["model_path", "export_dir"])


def main(argv):
    if len(argv) > 1:
        _cli.fail(f"unexpected arguments {argv[1:]}", 2)
    _cli.require_tensorflow("keras-identity-export (a TensorFlow SavedModel, from either "
                            "backend)")
    from keras_identity import storage

    for name in ("model_path", "preprocessing", "export_dir"):
        try:
            storage.check_path(FLAGS[name].value or "", name)
        except ValueError as error:
            _cli.fail(error, 2)
    if not _exists(FLAGS.model_path, "model_path"):
        _cli.fail(f"model_path={FLAGS.model_path!r} does not exist", 2)
    if _found(storage.isdir, FLAGS.model_path, "model_path"):
        _cli.fail(f"not a readable .keras file: {FLAGS.model_path} (a directory; pass the "
                  f".keras file, e.g. runs/pre164/model.keras)", 2)
    preprocessing_path = FLAGS.preprocessing or storage.join(
        storage.dirname(FLAGS.model_path), "preprocessing.json")
    if FLAGS.preprocessing and not _exists(FLAGS.preprocessing, "preprocessing"):
        _cli.fail(f"preprocessing={FLAGS.preprocessing!r} does not exist", 2)
    if not _exists(preprocessing_path, "preprocessing"):
        preprocessing_path = None
    if FLAGS.top_k < 1:
        _cli.fail(f"top_k={FLAGS.top_k} is not valid; expected an integer >= 1", 2)

    from keras_identity.data import load_preprocessing
    from keras_identity.models import load_model
    from keras_identity.serving import export_saved_model
    from keras_identity.serving.emulator import ServingEmulator
    from keras_identity.serving.emulator import describe_xla
    from keras_identity.serving.signatures import input_description

    try:
        with storage.local_copy(FLAGS.model_path) as local:
            try:
                model = load_model(local)
            except ValueError as error:   # the message names the file given
                raise ValueError(str(error).replace(local, FLAGS.model_path)) from None
    except (ValueError, storage.StorageError) as error:
        _cli.fail(error, 2)
    preprocessing = None
    if preprocessing_path:
        try:
            preprocessing = load_preprocessing(preprocessing_path)
        except (OSError, ValueError, KeyError, TypeError) as error:
            _cli.fail(f"not a readable preprocessing file: {preprocessing_path} "
                      f"({type(error).__name__}: {error})", 2)
    preprocessing = _with_image_size(model, preprocessing)
    name = FLAGS.model_name or storage.basename(storage.normalize(FLAGS.export_dir))
    try:
        version_dir = export_saved_model(
            model, FLAGS.export_dir, preprocessing, class_names=FLAGS.class_names,
            version=FLAGS.version, top_k=FLAGS.top_k, model_name=name,
            warmup=FLAGS.warmup, float32=FLAGS.float32, overwrite=FLAGS.overwrite,
            max_image_bytes=FLAGS.max_image_bytes, max_image_pixels=FLAGS.max_image_pixels,
            raw_pixels=FLAGS.raw_pixels, jit_compile=FLAGS.jit_compile)
    except (ValueError, ImportError) as error:
        _cli.fail(error, 2)
    except storage.StorageError as error:
        _cli.fail(error, 1)
    try:  # what TF Serving would read, from the bucket for a version there
        with storage.local_copy(version_dir) as local:
            emulator = ServingEmulator(local, xla_cpu_compilation_enabled=True)
            replayed = len(emulator.replay_warmup()) if FLAGS.warmup else 0
    except storage.StorageError as error:
        _cli.fail(error, 1)
    print(f"inputs: {input_description(model, preprocessing)}")
    kernels = cpu_kernels.describe()
    if kernels:
        print(kernels)
    print(f"exported {FLAGS.model_path} to {version_dir}: signatures "
          f"{', '.join(sorted(emulator.signature_defs))}; {replayed} warm-up requests "
          f"replayed")
    base = FLAGS.export_dir if storage.is_remote(FLAGS.export_dir) else os.path.abspath(
        FLAGS.export_dir)
    xla = ""
    if emulator.needs_xla:
        print(f"XLA: the model runs through XLA ({describe_xla(emulator.needs_xla)}); TF "
              f"Serving runs it only with --xla_cpu_compilation_enabled=true")
        xla = " --xla_cpu_compilation_enabled=true"
    print(f"serve with: tensorflow_model_server --model_name={name} "
          f"--model_base_path={base} --port=8500 --rest_api_port=8501{xla}")


def _found(test, path, name):
    """``test(path)`` (``storage.exists``, ``storage.isdir``); a store that
    cannot be reached ends the program with one line."""
    from keras_identity import storage

    try:
        return test(path)
    except storage.StorageError as error:
        _cli.fail(f"{name}={path!r} cannot be read: {error.strerror}", 2)


def _exists(path, name):
    from keras_identity import storage

    return _found(storage.exists if storage.is_remote(path) else os.path.exists, path, name)


def _with_image_size(model, preprocessing):
    """``preprocessing`` with the --image_size and --eval_resize given (a
    flag that contradicts the model's input or the preprocessing.json is
    refused)."""
    _, height, width, channels = model.input_shape
    if FLAGS.image_size is None and FLAGS.eval_resize is None:
        if None in (height, width) and not (preprocessing or {}).get("image_shape"):
            _cli.fail(f"the model's input {tuple(model.input_shape[1:])} has no fixed height "
                      f"and width; give the size of the images served with --image_size", 2)
        return preprocessing
    preprocessing = dict(preprocessing or {})
    if FLAGS.image_size is not None:
        size = FLAGS.image_size
        if size < 1:
            _cli.fail(f"--image_size={size} is not valid; expected an integer >= 1", 2)
        if any(fixed is not None and fixed != size for fixed in (height, width)):
            _cli.fail(f"--image_size={size} does not fit the model's input "
                      f"{tuple(model.input_shape[1:])}; it applies to inputs of any size", 2)
        known = preprocessing.get("image_shape")
        if known and tuple(known[:2]) != (size, size):
            _cli.fail(f"--image_size={size} contradicts the preprocessing file's "
                      f"image_shape {tuple(known)}; drop one of them", 2)
        preprocessing["image_shape"] = (size, size, channels)
    elif None not in (height, width) and not preprocessing.get("image_shape"):
        preprocessing["image_shape"] = (height, width, channels)   # the fixed input size
    out_height = height or (preprocessing.get("image_shape") or (None,))[0]
    if FLAGS.eval_resize is not None:
        if out_height is None:
            _cli.fail("--eval_resize needs the served image size: the model's input has "
                      "none; give --image_size too", 2)
        if FLAGS.eval_resize < out_height:
            _cli.fail(f"--eval_resize={FLAGS.eval_resize} is not valid; expected an integer "
                      f">= the served image height {out_height} (the crop is taken from "
                      f"the resized image)", 2)
        known = preprocessing.get("eval_resize")
        if known and known != FLAGS.eval_resize:
            _cli.fail(f"--eval_resize={FLAGS.eval_resize} contradicts the preprocessing "
                      f"file's eval_resize {known}; drop one of them", 2)
        preprocessing["eval_resize"] = FLAGS.eval_resize
    return preprocessing


def run():
    """The console command keras-identity-export."""
    _cli.run_program(main, __name__)


if __name__ == "__main__":
    run()

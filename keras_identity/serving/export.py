"""Exporting a trained model as a TF Serving SavedModel version, into a
local folder or a bucket's (``gs://BUCKET/serving/model``: TF Serving reads
its ``--model_base_path`` there too)."""

import os
import re
import shutil
import tempfile

import keras
import numpy as np
import tensorflow as tf

from keras_identity import storage
from keras_identity.layers.preprocessing import find_preprocessing
from keras_identity.models.weights import to_float32

from keras_identity.serving import signatures as signatures_lib
from keras_identity.serving import warmup as warmup_lib


# What the signatures feed the model (assets.extra/inputs.txt of a version).
INPUTS_FILE = "inputs.txt"
# Uploaded last into a bucket: TF Serving finds a version by its folder, and
# loads it once the SavedModel's graph is there.
_SAVED_MODEL_FILES = ("fingerprint.pb", "saved_model.pb")


def next_version(export_base):
    """The next free version number under ``export_base`` (1 if none)."""
    if not storage.isdir(export_base):
        return 1
    versions = [int(n) for n in storage.listdir(export_base) if re.fullmatch(r"\d+", n)]
    return max(versions, default=0) + 1


def _check_export_base(export_base):
    """``export_base`` must be a directory this process can write, or a path
    it can create; raises ``ValueError`` in one line otherwise (writing
    nothing; in a bucket, a probe object written and removed)."""
    is_file = (f"export_dir={export_base!r} is a file; expected a directory of numbered "
               f"versions (TF Serving's --model_base_path).")
    if storage.is_remote(export_base):
        storage.check_path(export_base, "export_dir")
        try:
            found = storage.isfile(export_base)
        except storage.StorageError as error:
            raise ValueError(f"export_dir={export_base!r} cannot be read: "
                             f"{error.strerror}") from None
        if found:
            raise ValueError(is_file)
        storage.check_writable(export_base, "export_dir")
        return
    if os.path.exists(export_base) and not os.path.isdir(export_base):
        raise ValueError(is_file)
    existing = os.path.abspath(export_base)
    while not os.path.exists(existing):
        existing = os.path.dirname(existing)
    if not os.path.isdir(existing) or not os.access(existing, os.W_OK | os.X_OK):
        raise ValueError(f"export_dir={export_base!r} is not writable ({existing} is not a "
                         f"writable directory).")


def export_saved_model(model, export_base, preprocessing=None, *, class_names=None,
                       version=None, top_k=5,
                       model_name="model", warmup=True, float32=False, overwrite=False,
                       max_image_bytes=signatures_lib.MAX_IMAGE_BYTES,
                       max_image_pixels=signatures_lib.MAX_IMAGE_PIXELS,
                       raw_pixels=False, jit_compile=False):
    """Writes ``<export_base>/<version>/``: a SavedModel with the signatures of
    :mod:`keras_identity.serving.signatures` and TF Serving warm-up requests.

    Args:
        model: a Keras model (e.g. ``keras.models.load_model(".../model.keras")``).
        export_base: TF Serving's ``--model_base_path``: a local folder, or a bucket's
            (``gs://BUCKET/...``; written locally, then uploaded).
        preprocessing: ``None`` (a model built with ``include_preprocessing`` carries its
            normalisation), or the dict of :func:`keras_identity.data.load_preprocessing`:
            class names, ImageNet evaluation resize, and the normalisation the signatures
            apply for a model without its own (runs made before models carried their
            preprocessing).  The version's ``assets.extra/inputs.txt`` says which applies.
        class_names: the names the signatures return (default: the preprocessing's, else the
            class indices).
        version: version number (default: the next free one).
        top_k: classes returned per example.
        model_name: ``model_spec.name`` of the warm-up requests.
        warmup: write ``assets.extra/tf_serving_warmup_requests``.
        float32: serve a mixed-precision model in float32.
        overwrite: replace an existing version.
        max_image_bytes, max_image_pixels: bounds on each image sent to ``serving_bytes``
            (``InvalidArgument`` beyond them, before decoding).
        raw_pixels: the model takes pixel values in [0, 255] as they are.  A model that
            neither normalises its inputs itself nor gets ``preprocessing`` with a
            normalisation is refused without it: its pixel signatures would feed it
            unnormalised pixels (a preset built with the default
            ``include_preprocessing=False`` takes normalised inputs).
        jit_compile: the model's forward pass in every signature as one XLA computation
            (``tf.function(jit_compile=True)``; decoding, checks and top-k stay TensorFlow
            operations), TensorFlow backend only: at batch 1 on a CPU it runs in about half
            the default graph's time on AVX-512 Xeons, two-thirds on AVX2 (docs/serving.md).
            TF Serving runs such a version only when started with
            ``--xla_cpu_compilation_enabled=true`` (off by default;
            :mod:`keras_identity.serving.emulator`), and XLA compiles each new batch size on
            its first request (about a second for ResNet-164).  A JAX-backend export is XLA
            already (``XlaCallModule``) and needs that flag too.

    Returns:
        The version directory (in a bucket for an ``export_base`` there).

    Raises:
        ValueError: a bad argument, or an ``export_base`` that cannot be written (one line).
        storage.StorageError: the bucket failed while the version was uploaded (what was
            uploaded of a new version is removed).
    """
    if keras.backend.backend() not in ("tensorflow", "jax"):
        raise ValueError(f"export_saved_model runs on the TensorFlow and JAX backends; the "
                         f"Keras backend is {keras.backend.backend()!r} (load the .keras file "
                         f"with KERAS_BACKEND=tensorflow to export it).")
    if not isinstance(jit_compile, bool):
        raise ValueError(f"jit_compile={jit_compile!r} is not valid; expected True or False.")
    if jit_compile and keras.backend.backend() == "jax":
        raise ValueError("jit_compile=True applies to the TensorFlow backend's export: a JAX "
                         "backend's runs its model as one XLA computation already "
                         "(XlaCallModule).")
    _check_export_base(export_base)
    version = next_version(export_base) if version is None else int(version)
    if version < 1:
        raise ValueError(f"version={version} is not valid; expected an integer >= 1.")
    if preprocessing is not None:
        check_preprocessing(model, preprocessing)
    signatures_lib.check_inputs(model, preprocessing, raw_pixels)
    if class_names is not None:
        class_names = [str(n) for n in class_names]
        if len(class_names) != model.output_shape[-1]:
            raise ValueError(f"class_names has {len(class_names)} names; the model has "
                             f"{model.output_shape[-1]} outputs.")
        preprocessing = dict(preprocessing or {}, class_names=class_names)
    version_dir = storage.join(export_base, str(version))
    if storage.exists(version_dir) and not overwrite:
        raise ValueError(f"{version_dir} exists; pick another --version or pass "
                         f"--overwrite.")
    if float32 and model.dtype_policy.name != "float32":
        model = to_float32(model)
    arguments = dict(top_k=top_k, model_name=model_name, warmup=warmup,
                     max_image_bytes=max_image_bytes, max_image_pixels=max_image_pixels,
                     raw_pixels=raw_pixels, jit_compile=jit_compile)
    if storage.is_remote(export_base):
        with tempfile.TemporaryDirectory(prefix="keras_identity_export_") as staging:
            local = os.path.join(staging, str(version))
            _write_version(model, local, preprocessing, **arguments)
            _upload_version(local, version_dir)
        return version_dir
    # Written beside the version and renamed when complete: TF Serving never
    # sees a half-written version (it ignores names that are not numbers).
    partial = os.path.join(export_base, f".{version}.partial")
    if os.path.exists(partial):
        shutil.rmtree(partial)
    try:
        _write_version(model, partial, preprocessing, **arguments)
    except BaseException:
        shutil.rmtree(partial, ignore_errors=True)
        raise
    old = None
    if os.path.exists(version_dir):  # --overwrite: moved aside, removed once replaced
        old = os.path.join(export_base, f".{version}.replaced")
        shutil.rmtree(old, ignore_errors=True)
        os.replace(version_dir, old)
    os.replace(partial, version_dir)
    if old:
        shutil.rmtree(old, ignore_errors=True)
    return version_dir


def _write_version(model, partial, preprocessing, *, top_k, model_name, warmup,
                   max_image_bytes, max_image_pixels, raw_pixels, jit_compile):
    """Writes the SavedModel, its inputs.txt and warm-up requests into the
    local folder ``partial``."""
    archive = keras.export.ExportArchive()
    forward = None
    if keras.backend.backend() == "jax":
        from keras_identity.serving import _jax_forward

        forward = _jax_forward.model_forward(model, archive)
    else:
        archive.track(model)
        if jit_compile:
            forward = tf.function(lambda images: model(images, training=False),
                                  jit_compile=True, autograph=False)
    functions = signatures_lib.make_serving_functions(
        model, preprocessing, top_k=top_k, max_image_bytes=max_image_bytes,
        max_image_pixels=max_image_pixels, forward=forward, raw_pixels=raw_pixels)
    for name in signatures_lib.SIGNATURES:
        fn, spec = functions[name]
        # TensorFlow functions on every backend: the signatures decode and
        # normalise with TensorFlow ops (JAX converts only the model).
        endpoint = tf.function(fn, input_signature=spec, autograph=False)
        endpoint.get_concrete_function()
        archive.add_endpoint(name, endpoint)
    archive.write_out(partial, verbose=False)
    os.makedirs(os.path.join(partial, "assets.extra"), exist_ok=True)
    with open(os.path.join(partial, "assets.extra", INPUTS_FILE), "w") as f:
        f.write(signatures_lib.input_description(model, preprocessing) + "\n")
    if warmup:
        _, height, width, channels = model.input_shape
        shape = (preprocessing or {}).get("image_shape") or (224, 224)
        height = height or shape[0]
        width = width or shape[1]
        warmup_lib.write_warmup(partial, warmup_lib.build_requests(
            model_name, height, width, channels))


def _upload_version(local, version_dir):
    """Copies the version written in ``local`` to ``version_dir`` in a
    bucket, the SavedModel's graph last (an object store has no rename:
    TF Serving, which may list the version before its upload ends, retries
    a version it could not load).  Over an existing version (--overwrite)
    the files are replaced, then the old version's other files removed; a
    new version that fails to upload is removed."""
    existed = storage.exists(version_dir)
    before = storage.list_files(version_dir) if existed else []
    try:
        files = storage.upload_tree(local, version_dir, last=_SAVED_MODEL_FILES)
    except BaseException:
        if not existed:
            try:
                storage.rmtree(version_dir)
            except Exception:  # noqa: BLE001 - the upload's error is the one told
                pass
        raise
    for relative in sorted(set(before) - set(files)):
        storage.remove(storage.join(version_dir, relative))


def _same(a, b):
    def close(x, y):
        return (x is None) == (y is None) and (x is None or (
            x.shape == y.shape and np.allclose(x, y, atol=1e-6)))

    return a.mode == b.mode and close(a.mean, b.mean) and close(a.std, b.std)


def check_preprocessing(model, preprocessing):
    """Refuses preprocessing written for other images than the model's input.

    Raises:
        ValueError: naming the preprocessing's dataset and image shape and the
            model's input shape.
    """
    shape = tuple(preprocessing.get("image_shape") or ())
    expected = tuple(model.input_shape[1:])
    normalization = preprocessing.get("normalization")
    mean = getattr(normalization, "mean", None)
    mean_shape = tuple(getattr(mean, "shape", ())) if mean is not None else ()
    problems = []
    if len(shape) != 3 or shape[-1] != expected[-1]:
        problems.append(f"image_shape {shape}")
    elif any(e is not None and e != s for e, s in zip(expected[:2], shape[:2])):
        problems.append(f"image_shape {shape}")
    if mean_shape and mean_shape[-1] not in (1, expected[-1]):
        problems.append(f"a mean of shape {mean_shape}")
    if len(mean_shape) == 3 and any(e is not None and e != m for e, m in
                                    zip(expected[:2], mean_shape[:2])):
        problems.append(f"a mean of shape {mean_shape}")
    if problems:
        raise ValueError(f"the preprocessing (dataset {preprocessing.get('dataset')!r}, "
                         f"{' and '.join(dict.fromkeys(problems))}) does not fit the model's "
                         f"input {expected}; pass the preprocessing.json of this model's "
                         f"training run.")
    layer = find_preprocessing(model)
    if layer is not None and normalization is not None and not _same(layer.normalization,
                                                                     normalization):
        raise ValueError(f"the preprocessing's normalisation ({normalization.mode!r}) is not "
                         f"the one of the model's own preprocessing layer {layer.name!r} "
                         f"({layer.mode!r}, other statistics); the model normalises its "
                         f"inputs itself: pass no preprocessing, or this model's own "
                         f"preprocessing.json.")

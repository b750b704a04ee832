"""Exporting a trained model as a TF Serving SavedModel version."""

import os
import re
import shutil

import keras

from keras_identity.serving import signatures as signatures_lib
from keras_identity.serving import warmup as warmup_lib


def next_version(export_base):
    """The next free version number under ``export_base`` (1 if none)."""
    if not os.path.isdir(export_base):
        return 1
    versions = [int(n) for n in os.listdir(export_base) if re.fullmatch(r"\d+", n)]
    return max(versions, default=0) + 1


def to_float32(model):
    """A float32 copy of a mixed-precision model (same weights)."""
    def clone(layer):
        config = layer.get_config()
        config["dtype"] = "float32"
        return layer.__class__.from_config(config)

    copy = keras.models.clone_model(model, clone_function=clone)
    copy.set_weights(model.get_weights())
    return copy


def export_saved_model(model, export_base, preprocessing, *, version=None, top_k=5,
                       model_name="model", warmup=True, float32=False, overwrite=False):
    """Writes ``<export_base>/<version>/``: a SavedModel with the signatures of
    :mod:`keras_identity.serving.signatures` and TF Serving warm-up requests.

    Args:
        model: a Keras model (e.g. ``keras.models.load_model(".../model.keras")``).
        export_base: TF Serving's ``--model_base_path``.
        preprocessing: dict of :func:`keras_identity.data.load_preprocessing`.
        version: version number (default: the next free one).
        top_k: classes returned per example.
        model_name: ``model_spec.name`` of the warm-up requests.
        warmup: write ``assets.extra/tf_serving_warmup_requests``.
        float32: serve a mixed-precision model in float32.
        overwrite: replace an existing version.

    Returns:
        The version directory.
    """
    version = next_version(export_base) if version is None else int(version)
    if version < 1:
        raise ValueError(f"version={version} is not valid; expected an integer >= 1.")
    version_dir = os.path.join(export_base, str(version))
    if os.path.exists(version_dir):
        if not overwrite:
            raise ValueError(f"{version_dir} exists; pick another --version or pass "
                             f"--overwrite.")
        shutil.rmtree(version_dir)
    if float32 and model.dtype_policy.name != "float32":
        model = to_float32(model)
    archive = keras.export.ExportArchive()
    archive.track(model)
    functions = signatures_lib.make_serving_functions(model, preprocessing, top_k=top_k)
    for name in signatures_lib.SIGNATURES:
        fn, spec = functions[name]
        archive.add_endpoint(name, fn, input_signature=spec)
    archive.write_out(version_dir, verbose=False)
    if warmup:
        _, height, width, channels = model.input_shape
        height = height or preprocessing["image_shape"][0]
        width = width or preprocessing["image_shape"][1]
        warmup_lib.write_warmup(version_dir, warmup_lib.build_requests(
            model_name, height, width, channels))
    return version_dir

"""``weights=``: starting a model from the weights of a trained one."""

import os

import keras

from keras_identity import storage
from keras_identity.layers.preprocessing import find_preprocessing
from keras_identity.models import pretrained
from keras_identity.models.stage import transfer_weights

CLASSIFIER_LAYERS = ("predictions", "classifier_conv")
_SUFFIXES = (".keras", ".weights.h5")


def check_weights_path(weights):
    """Refuses a ``weights`` that is not an existing ``.keras`` or
    ``.weights.h5`` file, local or in a bucket, or a preset's name (checked
    against the builder's arguments by :func:`pretrained.weights_file`), before
    anything is built."""
    if weights is None or pretrained.is_preset_name(weights):
        return
    if not isinstance(weights, (str, os.PathLike)) or not str(weights).endswith(_SUFFIXES):
        raise ValueError(f"weights={weights!r} is not valid; expected None, a preset's name "
                         f"(ki.models.presets()) or the path of a .keras or .weights.h5 "
                         f"file.")
    try:
        found = (storage.isfile(str(weights)) if storage.is_remote(str(weights))
                 else os.path.isfile(weights))
    except OSError as error:  # a bucket that cannot be read
        raise ValueError(f"weights={str(weights)!r}: {error}") from None
    if not found:
        raise ValueError(f"weights={str(weights)!r} does not exist.")


def _h5_shapes(path):
    import h5py

    shapes = {}
    with h5py.File(path, "r") as f:
        f.visititems(lambda name, item: shapes.__setitem__(name, item.shape)
                     if isinstance(item, h5py.Dataset) else None)
    return shapes


def _h5_mismatch(model, path):
    """Why ``path`` is not a weights file of ``model``'s architecture, or
    ``None``.  Keras keys a ``.weights.h5`` by layer class and position and
    skips entries the model lacks, so the file is compared with the one the
    model itself writes: every weight, same place, same shape."""
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        own = os.path.join(tmp, "own.weights.h5")
        model.save_weights(own)
        expected = _h5_shapes(own)
    # The layers' weights only: a file saved from a compiled model, or a
    # training checkpoint, also holds the optimizer's variables.
    expected = {k: v for k, v in expected.items() if k.startswith("layers/")}
    found = {k: v for k, v in _h5_shapes(path).items() if k.startswith("layers/")}
    for key in sorted(set(expected) | set(found)):
        if key not in found:
            return f"the file has no weight {key!r}"
        if key not in expected:
            return f"the model has no place for the file's weight {key!r}"
        if tuple(found[key]) != tuple(expected[key]):
            return f"weight {key!r} has shape {tuple(found[key])} in the file, " \
                   f"{tuple(expected[key])} in the model"
    return None


def load_weights(model, weights):
    """Loads ``weights`` (a ``.keras`` or ``.weights.h5`` path, local or in a bucket) into
    ``model``.

    A ``.keras`` model gives its weights by layer name (and by unit, across
    ``stage_mode``s): the target may leave out the source's classifier
    (``include_top=False``), every other weight must have its place and shape.  If both
    models include their preprocessing, the target takes the source's normalisation
    statistics too (the features were learned on inputs normalised so).  A ``.weights.h5``
    file (also a training checkpoint) must come from this very architecture; it holds no
    normalisation statistics, so a model with its preprocessing still needs them
    (``normalization=`` or ``adapt``).

    Raises:
        ValueError: one line naming the file and the first weight that does not fit.
    """
    if pretrained.is_preset_name(weights):
        raise ValueError(f"weights={weights!r}: load_weights takes a .keras or .weights.h5 "
                         f"file; a preset is given to its builder, e.g. "
                         f"ki.models.highway_net(50, weights={weights!r}) "
                         f"(ki.models.presets()).")
    check_weights_path(weights)
    with storage.local_copy(str(weights)) as local:
        return _load_weights(model, str(weights), local)


def _load_weights(model, path, local):
    """:func:`load_weights` from ``local``, a local copy of ``path``."""
    if path.endswith(".weights.h5"):
        try:
            reason = _h5_mismatch(model, local)
            if reason is None:
                model.load_weights(local)
        except Exception as error:  # Keras raises ValueError or h5py errors
            reason = " ".join(str(error).split())[:300]
        if reason is not None:
            raise ValueError(f"weights={path!r} does not fit {model.name!r} ({reason}); a "
                             f".weights.h5 file loads into the architecture it was saved "
                             f"from only (for a backbone of another model, pass that "
                             f"model's .keras file).")
        return model
    from keras_identity.models.saving import load_model

    try:
        source = load_model(local, compile=False)
    except ValueError as error:
        raise ValueError(f"weights={path!r}: {error}") from None
    names = {layer.name for layer in model.layers}
    ignore = tuple(n for n in CLASSIFIER_LAYERS if n not in names)
    try:
        transfer_weights(source, model, ignore_source_layers=ignore)
    except ValueError as error:
        message = str(error).replace("transfer_weights: ", "")
        hint = (" (a new number of classes: build with include_top=False and add a new "
                "head)" if any(n in message for n in CLASSIFIER_LAYERS) else "")
        raise ValueError(f"weights={path!r}: {message}{hint}") from None
    source_layer, target_layer = find_preprocessing(source), find_preprocessing(model)
    if source_layer is not None and target_layer is not None:
        target_layer.set_normalization(source_layer.normalization)
    return model


def to_float32(model):
    """A float32 copy of a mixed-precision model (the same weights): every
    layer rebuilt with ``dtype="float32"`` (serving on CPUs and GPUs, or a
    reference for a bfloat16 step)."""
    def clone(layer):
        config = layer.get_config()
        config["dtype"] = "float32"
        return layer.__class__.from_config(config)

    copy = keras.models.clone_model(model, clone_function=clone)
    copy.set_weights(model.get_weights())
    return copy

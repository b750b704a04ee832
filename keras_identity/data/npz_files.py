"""Datasets saved as ``.npz`` files (``x_train, y_train, x_test, y_test``,
e.g. the built-in MNIST): read without unpickling anything, float images
converted to uint8 (and said so), and arrays of any other kind refused
naming the file and the array."""

import os

import numpy as np

from keras_identity.data.errors import DataError
from keras_identity.data.errors import first_line
from keras_identity.data.facts import NUM_CLASSES
from keras_identity.data.fingerprints import fingerprint
from keras_identity.data.image_dataset import ImageDataset
from keras_identity.data.image_dataset import expand_gray


def _read_npz(path):
    """The four arrays of a ``.npz`` file; any read error names the file.
    Nothing is unpickled: a file that is not a zip archive of arrays, or
    holds object arrays, is refused."""
    import zipfile

    if os.path.isfile(path) and not zipfile.is_zipfile(path):
        raise DataError(f"cannot read {path}: not a valid .npz file (not a complete zip "
                        f"archive of arrays); expected x_train, y_train, x_test, y_test saved "
                        f"with numpy.savez.")
    try:
        with np.load(path, allow_pickle=False) as data:
            missing = {"x_train", "y_train", "x_test", "y_test"} - set(data.files)
            if missing:
                raise DataError(f"{path} lacks the arrays {sorted(missing)}; expected "
                                f"x_train, y_train, x_test, y_test.")
            return {k: data[k] for k in ("x_train", "y_train", "x_test", "y_test")}
    except DataError:
        raise
    except ValueError as error:
        if "allow_pickle" in str(error):  # numpy's hint to unpickle: never taken here
            raise DataError(f"cannot read {path}: it holds object (pickled) arrays, which are "
                            f"never loaded; expected numeric arrays x_train, y_train, x_test, "
                            f"y_test.") \
                from None
        raise DataError(f"cannot read {path}: ValueError: {first_line(error)}") from None
    except Exception as error:  # zipfile.BadZipFile, EOFError, OSError, ...
        raise DataError(f"cannot read {path}: {type(error).__name__}: "
                        f"{first_line(error)}") from None


def _as_images(path, key, array, notes):
    """``array`` as uint8 images: uint8 as it is; float in [0, 1] or [0, 255]
    converted (and noted); anything else refused naming the file and array."""
    if array.ndim not in (3, 4):
        raise DataError(f"{path}: {key} has shape {array.shape}; expected images "
                        f"(n, height, width) or (n, height, width, channels).")
    if array.dtype == np.uint8:
        return expand_gray(array)
    expected = "expected uint8 images, or float images in [0, 1] or [0, 255]"
    if not (np.issubdtype(array.dtype, np.integer) or np.issubdtype(array.dtype, np.floating)):
        # bool (a mask saved by mistake?), complex, strings, ...: never converted
        raise DataError(f"{path}: {key} has dtype {array.dtype}; {expected}.")
    low = high = None
    if array.size:
        low, high = float(np.min(array)), float(np.max(array))
    if np.issubdtype(array.dtype, np.floating) and low is not None and np.isfinite(
            [low, high]).all() and low >= 0.0 and high <= 255.0:
        scale = 255.0 if high <= 1.0 else 1.0
        notes.append(f"{key}: float in [0, {1 if scale == 255.0 else 255}], "
                     f"{'scaled by 255 and ' if scale == 255.0 else ''}rounded to uint8")
        return expand_gray(np.round(array * scale).astype(np.uint8))
    value_range = "no values" if low is None else f"values in [{low:g}, {high:g}]"
    raise DataError(f"{path}: {key} has dtype {array.dtype} with {value_range}; {expected}.")


def _as_labels(path, key, array, num_images, classes, notes):
    """``array`` as int32 labels in [0, classes) (``classes`` None: any >= 0)."""
    labels = array.reshape(-1)
    if len(labels) != num_images:
        raise DataError(f"{path}: {key} has {len(labels)} labels for {num_images} images "
                        f"in x_{key[2:]}; expected one label per image.")
    if not (np.issubdtype(labels.dtype, np.integer) or (
            np.issubdtype(labels.dtype, np.floating) and np.all(np.isfinite(labels))
            and np.all(labels == np.round(labels)))):
        raise DataError(f"{path}: {key} has dtype {labels.dtype} with non-integer values; "
                        f"expected integer class labels.")
    if labels.size:
        low, high = int(labels.min()), int(labels.max())
        if low < 0 or (classes is not None and high >= classes):
            allowed = f"[0, {classes})" if classes is not None else "[0, classes)"
            raise DataError(f"{path}: {key} has labels in [{low}, {high}]; expected integers "
                            f"in {allowed}.")
    if not np.issubdtype(labels.dtype, np.integer):
        notes.append(f"{key}: integral floats converted to int32")
    return labels.astype(np.int32)


def from_npz(path, name):
    """The in-memory dataset ``name`` of the ``.npz`` file ``path``
    (``x_train, y_train, x_test, y_test``); :class:`DataError` naming the
    file and array for anything it would read wrongly."""
    arrays = _read_npz(path)
    notes = []
    classes = NUM_CLASSES.get(name)
    x_train = _as_images(path, "x_train", arrays["x_train"], notes)
    x_test = _as_images(path, "x_test", arrays["x_test"], notes)
    if x_train.shape[1:] != x_test.shape[1:]:
        raise DataError(f"{path}: x_train images are {x_train.shape[1:]}, x_test images "
                        f"{x_test.shape[1:]}; expected one size.")
    y_train = _as_labels(path, "y_train", arrays["y_train"], len(x_train), classes, notes)
    y_test = _as_labels(path, "y_test", arrays["y_test"], len(x_test), classes, notes)
    num_classes = classes or int(max(y_train.max(initial=0), y_test.max(initial=0))) + 1
    source = path + (f" ({'; '.join(notes)})" if notes else "")
    return ImageDataset(
        name=name, num_classes=num_classes, class_names=[str(i) for i in range(num_classes)],
        image_shape=tuple(x_train.shape[1:]), source=source, x_train=x_train,
        y_train=y_train, x_test=x_test, y_test=y_test, fingerprint=fingerprint(path))

"""Loading ``.keras`` files with errors a user can act on.

``keras.models.load_model`` reports a class it cannot find as a generic
"could not be deserialized properly" around the whole model.
:func:`load_model` names the file and, when that is the cause, every class
the file names that no imported module registers, and what registers it.
"""

import json
import os
import sys
import zipfile

import keras

from keras_identity.version import __version__

PACKAGE = "keras_identity"


def _classes(node, found):
    """Every ``(registered_name or class_name, module)`` a Keras config names."""
    if isinstance(node, dict):
        if "class_name" in node and "config" in node:
            found.add((node.get("registered_name") or node["class_name"], node.get("module")))
        for value in node.values():
            _classes(value, found)
    elif isinstance(node, list):
        for value in node:
            _classes(value, found)
    return found


def unknown_classes(path):
    """The registered names of the classes ``path`` (a ``.keras`` file) names
    that no imported module registers, sorted; ``[]`` when the file cannot
    be read as an archive."""
    import importlib

    try:
        with zipfile.ZipFile(path) as archive:
            config = json.loads(archive.read("config.json"))
    except (OSError, KeyError, ValueError, zipfile.BadZipFile):
        return []
    missing = set()
    for name, module in _classes(config, set()):
        if ">" in name:  # registered with keras.saving.register_keras_serializable
            if keras.saving.get_registered_object(name) is None:
                missing.add(name)
        elif module:
            # Only Keras's own modules are imported to look; a module the file
            # names is otherwise looked up among those already imported (a
            # file never makes this program import code).
            if module == "keras" or module.startswith("keras."):
                try:
                    found = getattr(importlib.import_module(module), name, None)
                except ImportError:
                    found = None
            else:
                found = getattr(sys.modules.get(module), name, None)
            if found is None:
                missing.add(f"{module}.{name}")
    return sorted(missing)


def _neither_zip_nor_hdf5(path):
    """Whether ``path`` is a file that is neither a zip archive (a ``.keras``
    file) nor an HDF5 file (Keras 2's ``.h5``)."""
    try:
        if not os.path.isfile(path):
            return False
        with open(path, "rb") as f:
            head = f.read(8)
        return head != b"\x89HDF\r\n\x1a\n" and not zipfile.is_zipfile(path)
    except OSError:
        return False


def load_model(path, compile=True):
    """``keras.models.load_model(path)`` with this package's classes
    registered (importing this module imports the package, which registers
    them); raises ``ValueError`` in one line naming the file (and the unknown
    classes, when the file names classes no module registers)."""
    if _neither_zip_nor_hdf5(path):   # Keras would say "File not found"
        raise ValueError(f"not a readable .keras file: {path} (not a zip archive, as a "
                         f".keras file is: cut short, overwritten or another kind of file)")
    try:
        return keras.models.load_model(path, compile=compile)
    except Exception as error:  # zipfile, h5py, JSON and Keras errors
        missing = unknown_classes(path)
        if missing:
            ours = [n.split(">", 1)[1] for n in missing if n.startswith(PACKAGE + ">")]
            others = [n for n in missing if not n.startswith(PACKAGE + ">")]
            parts = []
            if ours:
                parts.append(f"keras_identity {__version__} has no class "
                             f"{', '.join(ours)} (the file was saved by another version of "
                             f"keras_identity: load it with that version)")
            if others:
                parts.append(f"{', '.join(others)} {'is' if len(others) == 1 else 'are'} not "
                             f"registered: import the module that defines "
                             f"{'it' if len(others) == 1 else 'them'} (decorated with "
                             f"keras.saving.register_keras_serializable) before loading")
            raise ValueError(f"{path} names classes this program does not know: "
                             f"{'; '.join(parts)}.") from None
        reason = " ".join(str(error).split())[:200] or "no details"
        raise ValueError(f"not a readable .keras file: {path} ({type(error).__name__}: "
                         f"{reason})") from None

"""Trained weights by name, keras.applications' way: ``weights="mnist"``.

A preset is one entry of one registry, ``preset_files/presets.json``: the
name given as ``weights=``, the builder and the arguments the weights fit, the
weights file and its sha256, and the model card of the run that trained them
(:mod:`keras_identity.training.model_card`: data, recipe, exact command,
commit, machine, time, test error beside the paper's).  Every builder takes a
preset name: ``highway_net(50, weights="mnist")``,
``get_model("resnet52_mnist", weights="mnist")``; :func:`presets` lists them.

Files ship in the wheel beside the registry.  An entry may instead give an
``origin`` (a URL, for weights too large for the wheel): the file is then
fetched once into ``~/.keras/keras_identity/`` with ``keras.utils.get_file``,
which checks its sha256, as keras.applications fetches its weights.  Either
way a file whose sha256 is not the registry's is refused.

Arguments that do not change what the weights compute are free: the top
(``include_top``, ``pooling``, ``classifier_activation``; without the top a
convolutional net takes any input size of the preset's channels, a fully
connected one its own size only), ``include_preprocessing``, how stages
are realised (``stage_mode``, ``recompute``), initialisers, seeds and
training-only settings (regularizers, stochastic depth, BN momentum).  Every
other argument must build what the preset's build (defaults resolved by the
builder: ``block=None`` is the depth's block, and so on).
"""

import dataclasses
import hashlib
import inspect
import json
import os
import re

from keras_identity import storage
from keras_identity.data.fingerprints import file_sha256

PRESET_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "preset_files")
REGISTRY_FILE = "presets.json"
FREE_ARGUMENTS = frozenset((
    "weights", "name", "include_top", "pooling", "classifier_activation",
    "include_preprocessing", "stage_mode", "recompute", "seed",
    "kernel_regularizer", "kernel_initializer", "transform_bias_init", "gate_bias_init",
    "stochastic_depth_rate", "bn_momentum", "num_classes"))
# Architectures whose first layer is sized by the input: their presets take
# their own input size only, also without the top.
DENSE = ("fully_connected",)
CACHE_DIR = None  # where fetched files go: keras.utils.get_file's default (~/.keras)
_SUFFIXES = (".keras", ".h5")
_VERIFIED = {}
# What register() takes as a preset's name (it becomes part of file names).
_NAME = re.compile(r"[a-z][a-z0-9_]*")


@dataclasses.dataclass(frozen=True)
class Preset:
    """One registry entry: ``builder(**arguments, weights=weights)`` loads ``file``."""

    weights: str
    builder: str
    arguments: dict
    file: str
    sha256: str
    card: dict
    origin: str = None

    @property
    def call(self):
        """How the preset is built, e.g. ``highway_net(depth=50, dataset='mnist')``."""
        keys = sorted(self.arguments, key=lambda k: (k != "depth", k != "dataset"))
        arguments = ", ".join(f"{k}={self.arguments[k]!r}" for k in keys)
        return f"{self.builder}({arguments}, weights={self.weights!r})"

    @property
    def configuration(self):
        return self.card.get("configuration")

    @property
    def test_error(self):
        return self.card.get("test_error")

    def as_resnet(self):
        """``(builder, arguments)`` with ``preact_resnet`` as :func:`resnet`
        of its unit (the builder that loads every ResNet)."""
        if self.builder == "preact_resnet":
            return "resnet", {**self.arguments, "unit": "full_preactivation"}
        return self.builder, self.arguments


def defaults_of(builder):
    """``{argument: default}`` of the builder function ``builder``."""
    return {n: p.default for n, p in inspect.signature(builder).parameters.items()}


def _directory():
    return PRESET_DIR


def presets(directory=None):
    """Every preset of the registry, as :class:`Preset` s (``directory``: another
    registry's folder; one without a registry file has none).

    Raises:
        ValueError: one line naming ``directory`` when it is not a folder, or
            its ``presets.json`` when that is not a registry.
    """
    if directory is not None:
        _check_directory(directory, must_exist=True)
    path = os.path.join(directory or _directory(), REGISTRY_FILE)
    if not os.path.exists(path):
        return []
    try:
        with open(path) as f:
            entries = json.load(f)
        if not isinstance(entries, list):
            raise TypeError(f"a {type(entries).__name__}, not a list of entries")
        return [Preset(**entry) for entry in entries]
    except (OSError, ValueError, TypeError) as error:  # JSONDecodeError is a ValueError
        raise ValueError(f"{_argument(directory)}: {path} is not a readable registry "
                         f"({type(error).__name__}: {' '.join(str(error).split())[:160]}); "
                         f"restore it, or register its presets again.") from None


def _argument(directory):
    """How messages name the registry folder: the argument, or the package's."""
    return "the package's registry" if directory is None else f"directory={directory!r}"


def _check_directory(directory, must_exist):
    """Refuses a registry folder that is a file, does not exist
    (``must_exist``) or holds a control character, in one line naming ``directory=``."""
    storage.check_path(os.fspath(directory), "directory")
    if storage.is_remote(os.fspath(directory)):
        raise ValueError(f"directory={directory!r} is not valid; a registry is a local folder "
                         f"(the run given to register() may be in a bucket).")
    if os.path.exists(directory) and not os.path.isdir(directory):
        raise ValueError(f"directory={directory!r} is a file; expected the folder of a "
                         f"registry ({REGISTRY_FILE} and the presets' files).")
    if must_exist and not os.path.isdir(directory):
        raise ValueError(f"directory={directory!r} does not exist; expected the folder of a "
                         f"registry ({REGISTRY_FILE} and the presets' files).")


def is_preset_name(weights):
    """Whether ``weights`` is given as a preset name (not a file path)."""
    return (isinstance(weights, str) and weights != "" and "/" not in weights
            and os.sep not in weights and not weights.endswith(_SUFFIXES))


def _comparable(value):
    return list(value) if isinstance(value, tuple) else value


def fits(preset, builder, given, defaults, resolve):
    """Whether ``preset`` fits the call ``builder(**given)`` (``defaults``: the
    builder's; ``resolve``: the builder's resolution of its defaults, a dict
    of the values ``arguments`` build (classes and input shape among them),
    compared instead of the given ones)."""
    name, arguments = preset.as_resnet()
    if name != builder:
        return False
    mine, theirs = {**defaults, **given}, {**defaults, **arguments}
    if mine["dataset"] != theirs["dataset"]:
        return False
    mine.update(resolve(mine))
    theirs.update(resolve(theirs))
    top = mine.get("include_top", True)
    keys = (set(mine) | set(theirs)) - FREE_ARGUMENTS
    for key in keys | {"num_classes"} if top else keys:
        if key not in defaults:
            continue
        a, b = _comparable(mine.get(key)), _comparable(theirs.get(key))
        if key == "input_shape" and not top and theirs.get("architecture") not in DENSE:
            a, b = a[-1:], b[-1:]  # a convolutional backbone takes other sizes
        if a != b:
            return False
    return True


def _listing(directory=None):
    found = presets(directory)
    if not found:
        return "none are installed"
    return "; ".join(p.call for p in found)


def weights_file(builder, weights, given, defaults, resolve, directory=None):
    """The local, verified file of preset ``weights`` for ``builder(**given)``
    (``resolve``: see :func:`fits`); any other ``weights`` is returned as it is.

    Raises:
        ValueError: one line: no preset of that name fits the arguments (the
            presets that exist are listed), or its file's sha256 is not the
            registry's.
    """
    if not is_preset_name(weights):
        return weights
    directory = directory or _directory()
    named = [p for p in presets(directory) if p.weights == weights]
    if not named:
        raise ValueError(f"weights={weights!r} is not valid; expected None, the path of a "
                         f".keras or .weights.h5 file, or a preset (ki.models.presets(): "
                         f"{_listing(directory)}).")
    match = [p for p in named if fits(p, builder, given, defaults, resolve)]
    if not match and given.get("input_shape") is not None:
        _refuse_input_shape(named, builder, given, defaults, resolve)
    if not match:
        if given.get("unit") == "full_preactivation":
            builder, given = "preact_resnet", {k: v for k, v in given.items() if k != "unit"}
        shown = ", ".join(f"{k}={v!r}" for k, v in given.items()
                          if (k not in FREE_ARGUMENTS or k == "num_classes") and k in defaults
                          and v != defaults[k] or k in ("depth", "dataset"))
        raise ValueError(f"weights={weights!r}: no preset fits {builder}({shown}); the "
                         f"presets: {_listing(directory)}.")
    return _verified(match[0], directory)


def _refuse_input_shape(named, builder, given, defaults, resolve):
    """Refuses, naming ``input_shape``, a call that a preset of a fully
    connected net would fit at its own input size."""
    for preset in named:
        name, arguments = preset.as_resnet()
        if name != builder:
            continue
        theirs = resolve({**defaults, **arguments})
        if theirs.get("architecture") in DENSE and fits(
                preset, builder, {**given, "input_shape": None}, defaults, resolve):
            size = tuple(theirs["input_shape"])
            raise ValueError(f"weights={preset.weights!r}: input_shape="
                             f"{tuple(given['input_shape'])} is not valid for the preset "
                             f"{preset.call}; expected input_shape={size} (a fully connected "
                             f"net's first layer is sized by its input, also without the "
                             f"top).")


def _verified(preset, directory):
    path = os.path.join(directory, preset.file)
    if not os.path.exists(path) and preset.origin:
        import keras

        # keras.applications' way: fetched once, its hash checked by get_file.
        try:
            path = keras.utils.get_file(preset.file, preset.origin, file_hash=preset.sha256,
                                        hash_algorithm="sha256", cache_dir=CACHE_DIR,
                                        cache_subdir="keras_identity")
        except Exception as error:  # urllib's or get_file's, one line
            raise ValueError(f"weights={preset.weights!r}: {preset.file} could not be "
                             f"fetched from {preset.origin}: "
                             f"{' '.join(str(error).split())[:200]}") from None
    if not os.path.exists(path):
        raise ValueError(f"weights={preset.weights!r}: {path} is missing (a damaged "
                         f"installation: reinstall keras_identity).")
    stamp = (path, os.path.getmtime(path), os.path.getsize(path))
    if _VERIFIED.get(stamp) != preset.sha256:
        found = file_sha256(path)
        if found != preset.sha256:
            raise ValueError(f"weights={preset.weights!r}: {path} has sha256 {found}, the "
                             f"registry's is {preset.sha256} (a damaged or replaced file: "
                             f"reinstall keras_identity).")
        _VERIFIED[stamp] = found
    return path


def register(run_dir, weights, directory=None):
    """Adds the complete run in ``run_dir`` (local or in a bucket) to the
    registry in ``directory`` (default: the package's) as preset ``weights``
    (a lowercase identifier: letters, digits, ``_``): its ``model.keras``
    without the optimizer's state, the sha256 of that file and the run's
    model card (also kept beside the weights as Markdown).  Replaces a preset
    of the same name and arguments.  Returns the :class:`Preset`.

    Raises:
        ValueError: one line: a name that is not a lowercase identifier; a
            ``directory`` that is a file; a run without a readable card and
            ``run.json``; a card that is not of the run's weights (its sha256
            is not ``model.keras``'s: another run's file, or weights trained
            further than the card) or of another length than ``run.json``'s
            (the card of a shorter run that was then extended).
    """
    from keras_identity.models.saving import load_model

    if not isinstance(weights, str) or not _NAME.fullmatch(weights):
        raise ValueError(f"weights={weights!r} is not valid; expected a name of lowercase "
                         f"letters, digits and '_' starting with a letter (no path, no file "
                         f"suffix), e.g. 'mnist'.")
    storage.check_path(os.fspath(run_dir), "run_dir")
    if directory is not None:
        _check_directory(directory, must_exist=False)
    directory = os.fspath(directory or _directory())
    for file in ("model_card.json", "model_card.md"):  # the run may be in a bucket
        if not storage.exists(storage.join(run_dir, file)):
            raise ValueError(f"run_dir={run_dir!r} has no {file}: run its keras-identity-train "
                             f"command to the end first.")
    card = _read_record(run_dir, "model_card.json", ("model_file", "sha256", "recipe",
                                                     "builder", "arguments"))
    run = _read_record(run_dir, "run.json", ("length",))
    card_steps = (card["recipe"] or {}).get("steps")
    run_steps = (run["length"] or {}).get("total_steps")
    if card_steps != run_steps:
        raise ValueError(f"run_dir={run_dir!r}: its model card is of a run of {card_steps} "
                         f"steps, run.json's is {run_steps} (the run was extended and has "
                         f"not completed since): run its keras-identity-train command to the "
                         f"end, which writes the card anew.")
    model_path = storage.join(run_dir, card["model_file"])
    with storage.local_copy(model_path) as local:
        found = file_sha256(local)
        if found != card["sha256"]:
            raise ValueError(f"run_dir={run_dir!r}: {card['model_file']} has sha256 {found}, "
                             f"its model card's is {card['sha256']} (the card is not of these "
                             f"weights): run the run's keras-identity-train command again, "
                             f"which writes the card of its weights.")
        model = load_model(local, compile=False)
    # A network without a named configuration: its model's name and its arguments' digest.
    name = card.get("configuration") or "{}_{}".format(card.get("model"), hashlib.sha256(
        json.dumps(card["arguments"], sort_keys=True).encode()).hexdigest()[:8])
    stem = name if name.endswith(f"_{weights}") else f"{name}_{weights}"
    file = f"{stem}.keras"
    existing = presets(directory) if os.path.isdir(directory) else []
    os.makedirs(directory, exist_ok=True)
    model.save(os.path.join(directory, file))
    with open(os.path.join(directory, f"{stem}.md"), "w") as f:
        f.write(storage.read_text(storage.join(run_dir, "model_card.md")))
    preset = Preset(weights=weights, builder=card["builder"], arguments=card["arguments"],
                    file=file, sha256=file_sha256(os.path.join(directory, file)), card=card)
    kept = [p for p in existing if p.file != file and (
        p.weights, p.builder, p.arguments) != (weights, preset.builder, preset.arguments)]
    with open(os.path.join(directory, REGISTRY_FILE), "w") as f:
        json.dump([dataclasses.asdict(p) for p in kept + [preset]], f, indent=1)
        f.write("\n")
    return preset


def _read_record(run_dir, name, keys):
    """The JSON object ``name`` of the run in ``run_dir``, with ``keys``;
    refused in one line naming the file otherwise."""
    path = storage.join(run_dir, name)
    try:
        record = storage.read_json(path)
    except FileNotFoundError:
        raise ValueError(f"run_dir={run_dir!r} has no {name}: run its keras-identity-train "
                         f"command to the end first.") from None
    except ValueError as error:  # JSONDecodeError
        raise ValueError(f"run_dir={run_dir!r}: {path} is not readable JSON "
                         f"({' '.join(str(error).split())[:120]}); run its "
                         f"keras-identity-train command again, which writes it anew.") from None
    missing = [k for k in keys if not isinstance(record, dict) or k not in record]
    if missing:
        raise ValueError(f"run_dir={run_dir!r}: {path} lacks {', '.join(missing)}; run its "
                         f"keras-identity-train command again, which writes it anew.")
    return record


def presets_table(directory=None):
    """The presets as a Markdown table: each one's call, test error beside
    the paper's, training and command."""
    rows = ["| network | call | parameters | test error | paper | trained | command |",
            "| --- | --- | ---: | ---: | ---: | --- | --- |"]
    for p in presets(directory):
        card = p.card
        paper = card.get("paper_test_error")
        recipe = card["recipe"]
        rows.append(
            f"| {p.configuration or card['model']} | `{p.call}` | {card['parameters']:,} | {100 * card['test_error']:.2f}% | "
            f"{'-' if paper is None else f'{100 * paper:.2f}%'} | {recipe['name']}, "
            f"{recipe['epochs']} epochs, "
            + ("" if card.get("precision", "float32") == "float32" else f"{card['precision']}, ")
            + f"{card['training_seconds'] / 60:.0f} min on "
            f"{card['backend']} | `{card['command']}` |")
    return "\n".join(rows)

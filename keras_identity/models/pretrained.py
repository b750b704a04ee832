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
(``include_top``, ``pooling``, ``classifier_activation``; without the top any
input size of the preset's channels), ``include_preprocessing``, how stages
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

from keras_identity import storage
from keras_identity.data.fingerprints import file_sha256

PRESET_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "preset_files")
REGISTRY_FILE = "presets.json"
FREE_ARGUMENTS = frozenset((
    "weights", "name", "include_top", "pooling", "classifier_activation",
    "include_preprocessing", "stage_mode", "recompute", "seed",
    "kernel_regularizer", "kernel_initializer", "transform_bias_init", "gate_bias_init",
    "stochastic_depth_rate", "bn_momentum", "num_classes"))
CACHE_DIR = None  # where fetched files go: keras.utils.get_file's default (~/.keras)
_SUFFIXES = (".keras", ".h5")
_VERIFIED = {}


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
    registry's folder)."""
    path = os.path.join(directory or _directory(), REGISTRY_FILE)
    if not os.path.exists(path):
        return []
    with open(path) as f:
        entries = json.load(f)
    return [Preset(**entry) for entry in entries]


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
        if key == "input_shape" and not top:  # a backbone takes other sizes
            a, b = a[-1:], b[-1:]
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
    if not match:
        if given.get("unit") == "full_preactivation":
            builder, given = "preact_resnet", {k: v for k, v in given.items() if k != "unit"}
        shown = ", ".join(f"{k}={v!r}" for k, v in given.items()
                          if (k not in FREE_ARGUMENTS or k == "num_classes") and k in defaults
                          and v != defaults[k] or k in ("depth", "dataset"))
        raise ValueError(f"weights={weights!r}: no preset fits {builder}({shown}); the "
                         f"presets: {_listing(directory)}.")
    return _verified(match[0], directory)


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
    registry in ``directory`` (default: the package's) as preset ``weights``: its ``model.keras``
    without the optimizer's state, the sha256 of that file and the run's
    model card (also kept beside the weights as Markdown).  Replaces a preset
    of the same name and arguments.  Returns
    the :class:`Preset`."""
    from keras_identity.models.saving import load_model

    if not is_preset_name(weights):
        raise ValueError(f"weights={weights!r} is not valid; expected a name (no path, no "
                         f"file suffix), e.g. 'mnist'.")
    directory = directory or _directory()
    for file in ("model_card.json", "model_card.md"):  # the run may be in a bucket
        if not storage.exists(storage.join(run_dir, file)):
            raise ValueError(f"run_dir={run_dir!r} has no {file}: run its keras-identity-train "
                             f"command to the end first.")
    card = storage.read_json(storage.join(run_dir, "model_card.json"))
    # A network without a named configuration: its model's name and its arguments' digest.
    name = card["configuration"] or "{}_{}".format(card["model"], hashlib.sha256(
        json.dumps(card["arguments"], sort_keys=True).encode()).hexdigest()[:8])
    stem = name if name.endswith(f"_{weights}") else f"{name}_{weights}"
    file = f"{stem}.keras"
    os.makedirs(directory, exist_ok=True)
    with storage.local_copy(storage.join(run_dir, card["model_file"])) as local:
        model = load_model(local, compile=False)
    model.save(os.path.join(directory, file))
    with open(os.path.join(directory, f"{stem}.md"), "w") as f:
        f.write(storage.read_text(storage.join(run_dir, "model_card.md")))
    preset = Preset(weights=weights, builder=card["builder"], arguments=card["arguments"],
                    file=file, sha256=file_sha256(os.path.join(directory, file)), card=card)
    kept = [p for p in presets(directory) if p.file != file and (
        p.weights, p.builder, p.arguments) != (weights, preset.builder, preset.arguments)]
    with open(os.path.join(directory, REGISTRY_FILE), "w") as f:
        json.dump([dataclasses.asdict(p) for p in kept + [preset]], f, indent=1)
        f.write("\n")
    return preset


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
            f"{recipe['epochs']} epochs, {card['training_seconds'] / 60:.0f} min on "
            f"{card['backend']} | `{card['command']}` |")
    return "\n".join(rows)

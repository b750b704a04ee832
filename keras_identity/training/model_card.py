"""A trained model's card: what the network is, how it was trained, how well
it does and how to make it again.

``keras-identity-train`` writes ``model_card.json`` and ``model_card.md`` into
the run's ``model_dir`` when the run is complete (also when the same command
runs again on a complete run).  A card names the builder and its arguments,
the data (its fingerprint as the run's identity records it), the recipe and its
plan, the test error beside the paper's number (where the papers give one),
the exact command, the package version and commit, the machine and the
training time.  :mod:`keras_identity.models.pretrained` keeps the cards of
the weights it ships.
"""

import os
import shlex
import subprocess
import sys

from keras_identity import storage
from keras_identity.data.fingerprints import file_sha256 as local_file_sha256
from keras_identity.models import registry
from keras_identity.training.run_files import RUN_FILE
from keras_identity.version import __version__

CARD_FILES = ("model_card.json", "model_card.md")

# Test errors (%) the papers report for a named configuration, with where.
PAPER_ERRORS = {
    "resnet20": (8.75, "He et al. 2015, Table 6"),
    "resnet32": (7.51, "He et al. 2015, Table 6"),
    "resnet44": (7.17, "He et al. 2015, Table 6"),
    "resnet56": (6.97, "He et al. 2015, Table 6"),
    "resnet110": (6.61, "He et al. 2016, Table 3 (6.43 in He et al. 2015)"),
    "resnet1202": (7.93, "He et al. 2015, Table 6"),
    "resnet164": (5.93, "He et al. 2016, Table 3"),
    "resnet1001": (7.61, "He et al. 2016, Table 3"),
    "preact_resnet110": (6.37, "He et al. 2016, Table 3"),
    "preact_resnet164": (5.46, "He et al. 2016, Table 3"),
    "preact_resnet1001": (4.92, "He et al. 2016, Table 3"),
    "preact_resnet164_cifar100": (24.33, "He et al. 2016, Table 3"),
    "preact_resnet1001_cifar100": (22.71, "He et al. 2016, Table 3"),
}
# The shared JPEG copy of CIFAR-10 (quality 75, about 30 dB PSNR against the
# originals; ../shared/data/cifar10-jpg.tar.gz), by its fingerprint.
CIFAR10_JPEG = "sha256:85985c318441591b67723279a6e4b1e1f8abd0f2ca03a27ee9dd80d35f44945c"
# Test errors (%) measured on other data than the papers', by configuration
# and data fingerprint: the reference a card of a run on that data stands beside.
DATA_REFERENCES = {
    ("resnet20", CIFAR10_JPEG): (
        12.63, "the paper's whole schedule (cifar recipe, 64k iterations) on this JPEG copy: "
               "one run on an H200, docs/results/resnet20_cifar10_h200.md; an independent "
               "PyTorch ResNet-20 on the same copy: 12.37%"),
}
# What the sources say where they give no test error, by builder and dataset.
_FIG1 = "Srivastava et al. 2015 report the fully connected MNIST nets' training loss only " \
        "(Fig. 1)"
_NO_ERROR = {
    ("highway_net", "mnist"): _FIG1, ("plain_net", "mnist"): _FIG1,
    ("resnet", "mnist"): "the lecture notes give the MNIST ResNet's architecture, not a test "
                         "error",
}


def file_sha256(path):
    """The sha256 of the file at ``path`` (local or in a bucket), in hex."""
    with storage.local_copy(path) as local:
        return local_file_sha256(local)


def package_commit():
    """The git commit of the package's checkout (``"+modified"`` when tracked
    files differ from it), or ``None`` for an installed wheel."""
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    if not os.path.exists(os.path.join(root, ".git")):
        return None
    try:
        def git(*args):
            return subprocess.run(["git", "-C", root, *args], capture_output=True,
                                  text=True, timeout=10, check=True).stdout.strip()
        commit = git("rev-parse", "HEAD")
        modified = git("status", "--porcelain", "--untracked-files=no", "--", "keras_identity",
                       "keras_identity_cli")
    except (OSError, subprocess.SubprocessError):
        return None
    return commit + ("+modified" if modified else "")


def command_line(argv=None, program="keras-identity-train"):
    """The command that ran: ``program`` and the flags of ``argv``."""
    argv = sys.argv if argv is None else argv
    return " ".join([program, *(shlex.quote(a) for a in argv[1:])])


def paper_error(builder, arguments):
    """``(error in %, source)`` the papers give for this network, else
    ``(None, what the sources give instead)``."""
    name = registry.configuration_name(builder, arguments)
    if name in PAPER_ERRORS:
        return PAPER_ERRORS[name]
    return None, _NO_ERROR.get((builder, arguments.get("dataset")),
                               "the papers report no test error for this network")


def data_reference(builder, arguments, fingerprint):
    """``{"test_error", "source"}`` measured for this network on the data of
    ``fingerprint`` where that is not the papers' (:data:`DATA_REFERENCES`), else None."""
    found = DATA_REFERENCES.get((registry.configuration_name(builder, arguments), fingerprint))
    return None if found is None else {"test_error": found[0] / 100, "source": found[1]}


def make_card(config, result, *, command, machine):
    """The card of the complete run ``result`` (of
    :func:`keras_identity.training.train`) of ``config``."""
    run = storage.read_json(storage.join(config.model_dir, RUN_FILE))
    identity = run["identity"]
    builder = config.family
    arguments = config.identity_arguments()
    history = result["history"]
    last = history[-1]
    error, source = paper_error(builder, arguments)
    model_path = result["model_path"]
    return {
        "model": result["model_name"],
        "configuration": registry.configuration_name(builder, arguments),
        "builder": builder,
        "arguments": arguments,
        "parameters": result["params"],
        "data": {"dataset": config.dataset, "source": result["data_source"],
                 "fingerprint": identity["data_dir"], "train_images": result["num_train"],
                 "test_images": result["num_test"]},
        "recipe": {"name": identity["recipe"], "description": result["recipe_description"],
                   "global_batch": identity["batch_size"],
                   "learning_rate": identity["learning_rate"],
                   "steps": run["length"]["total_steps"], "epochs": run["length"]["epochs"]},
        "test_error": last["test_error"], "test_loss": last["test_loss"],
        "train_loss": last["loss"],
        "paper_test_error": None if error is None else error / 100, "paper_source": source,
        "data_reference": data_reference(builder, arguments, identity["data_dir"]),
        "command": command,
        "package": {"version": __version__, "commit": package_commit()},
        "backend": run.get("backend"), "precision": identity["precision"],
        "machine": machine,
        "training_seconds": round(float(last.get("wall_time", result["seconds"])), 1),
        "model_file": os.path.basename(model_path), "sha256": file_sha256(model_path),
    }


def render(card):
    """The card as Markdown."""
    arguments = ", ".join(f"{k}={v!r}" for k, v in card["arguments"].items())
    data, recipe = card["data"], card["recipe"]
    paper = (f"{100 * card['paper_test_error']:.2f}% ({card['paper_source']})"
             if card["paper_test_error"] is not None else f"none ({card['paper_source']})")
    minutes = card["training_seconds"] / 60
    reference = card.get("data_reference")
    # The named configuration heads the card: a twin (resnet52_mnist_plain)
    # builds a Keras model of its sibling's name.
    name = card["configuration"] or card["model"]
    lines = [
        f"# {name}" + (f" (Keras model `{card['model']}`)" if name != card["model"] else ""),
        "",
        f"`keras_identity.models.{card['builder']}({arguments})`: "
        f"{card['parameters']:,} trainable parameters.",
        "",
        "| | |", "| --- | --- |",
        f"| test error | **{100 * card['test_error']:.2f}%** on the {data['test_images']:,} "
        f"test images (test loss {card['test_loss']:.4f}) |",
        f"| paper | {paper} |",
        *([f"| on this data | {100 * reference['test_error']:.2f}% "
           f"({reference['source']}) |"] if reference else []),
        f"| data | {data['dataset']}: {data['source']} ({data['train_images']:,} train / "
        f"{data['test_images']:,} test images; {data['fingerprint']}) |",
        f"| recipe | {recipe['name']}: {recipe['description']} |",
        f"| this run | global batch {recipe['global_batch']}, lr {recipe['learning_rate']:g}, "
        f"{recipe['steps']:,} steps ({recipe['epochs']} epochs), {card['precision']}, "
        f"Keras backend {card['backend']} |",
        f"| training time | {minutes:.1f} min |",
        f"| machine | {card['machine']} |",
        f"| package | keras_identity {card['package']['version']}"
        + (f", commit {card['package']['commit']}" if card["package"]["commit"] else "") + " |",
        f"| weights | `{card['model_file']}`, sha256 `{card['sha256']}` |",
        "",
        "Made by:", "", "```", card["command"], "```", "",
    ]
    return "\n".join(lines)


def remove_card(model_dir):
    """Removes the card of the run in ``model_dir`` (before its
    ``model.keras`` is replaced: a card never stands beside other weights
    than its own, also when the run is killed before the new card)."""
    for name in CARD_FILES:
        storage.remove(storage.join(model_dir, name))


def certifies(model_dir, steps):
    """Whether ``model_dir``'s card is of its ``model.keras`` as it is, at
    ``steps`` steps (its sha256 is the file's): the same command on a
    complete run then leaves the file alone."""
    try:
        card = storage.read_json(storage.join(model_dir, CARD_FILES[0]))
        path = storage.join(model_dir, card["model_file"])
        return (card["recipe"]["steps"] == steps and storage.exists(path)
                and file_sha256(path) == card["sha256"])
    except (OSError, ValueError, KeyError, TypeError):  # no card, or not a readable one
        return False


def write_card(model_dir, card):
    """Writes ``card`` as ``model_card.json`` and ``model_card.md`` into
    ``model_dir``; returns the Markdown file's path."""
    storage.write_json(storage.join(model_dir, CARD_FILES[0]), card)
    path = storage.join(model_dir, CARD_FILES[1])
    storage.write_text(path, render(card))
    return path

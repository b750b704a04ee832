"""Markdown reports of experiments, under docs/results/."""

import datetime
import os
import shutil
import sys

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RESULTS = os.path.join(REPO, "docs", "results")


def header(title, command=None):
    """Title, the exact command, the machine and the date."""
    from keras_identity_cli import machine

    command = command or "python -m " + " ".join(
        [sys.modules["__main__"].__spec__.name if getattr(sys.modules["__main__"], "__spec__",
                                                           None) else sys.argv[0]]
        + sys.argv[1:])
    return (f"# {title}\n\n"
            f"- command: `{command}`\n"
            f"- machine: {machine.describe()}\n"
            f"- date: {datetime.date.today().isoformat()}\n")


def copy_figure(path, name=None, directory=RESULTS):
    """Copies a PNG next to the reports; returns its Markdown image link."""
    os.makedirs(directory, exist_ok=True)
    name = name or os.path.basename(path)
    shutil.copyfile(path, os.path.join(directory, name))
    return f"![{name}]({name})"


def write(name, text, directory=RESULTS):
    os.makedirs(directory, exist_ok=True)
    path = os.path.join(directory, name)
    with open(path, "w") as f:
        f.write(text.rstrip() + "\n")
    return path

"""Markdown reports of experiments, under docs/results/."""

import datetime
import os
import shutil
import sys

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RESULTS = os.path.join(REPO, "docs", "results")


# Set by experiments.reproduce for the program it runs: the report names the
# reproduction command that made it.
COMMAND_VARIABLE = "KERAS_IDENTITY_REPORT_COMMAND"


def header(title, command=None, summary=None):
    """Title, the exact command, the machine, the date and (for the results
    page, docs/results/README.md) a one-line summary of our result."""
    from keras_identity_cli import machine

    command = command or os.environ.get(COMMAND_VARIABLE) or "python -m " + " ".join(
        [sys.modules["__main__"].__spec__.name if getattr(sys.modules["__main__"], "__spec__",
                                                           None) else sys.argv[0]]
        + sys.argv[1:])
    return (f"# {title}\n\n"
            f"- command: `{command}`\n"
            f"- machine: {machine.describe()}\n"
            f"- date: {datetime.date.today().isoformat()}\n"
            + (f"- summary: {summary}\n" if summary else ""))


def read_header(path):
    """``{"command": ..., "machine": ..., "date": ..., "summary": ...}`` of a
    report written by :func:`header` (the keys it has)."""
    fields = {}
    with open(path) as f:
        for line in f:
            if line.startswith("- ") and ": " in line:
                key, value = line[2:].rstrip("\n").split(": ", 1)
                if key in ("command", "machine", "date", "summary"):
                    fields[key] = value.strip("`") if key == "command" else value
            elif fields and not line.strip():
                break
    return fields


def copy_figure(path, name=None, directory=RESULTS):
    """Copies a PNG next to the reports; returns its Markdown image link."""
    os.makedirs(directory, exist_ok=True)
    name = name or os.path.basename(path)
    target = os.path.join(directory, name)
    if os.path.abspath(path) != os.path.abspath(target):  # the run dir may be the report's
        shutil.copyfile(path, target)
    return f"![{name}]({name})"


def write(name, text, directory=RESULTS):
    os.makedirs(directory, exist_ok=True)
    path = os.path.join(directory, name)
    with open(path, "w") as f:
        f.write(text.rstrip() + "\n")
    return path

"""Names the machine a benchmark ran on, reads its worker processes'
results, and writes its Markdown tables."""

import json
import os
import subprocess
import sys

from keras_identity_cli.machine import cores
from keras_identity_cli.machine import describe

__all__ = ["cores", "describe", "result", "run_worker", "table"]


def run_worker(args, env, timeout_s):
    """Runs ``python *args`` in a fresh process (``env`` added to this one's,
    a None value removing the variable; TensorFlow's C++ logs quiet); its
    ``RESULT``, or an error."""
    environ = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", **env)
    environ = {name: value for name, value in environ.items() if value is not None}
    try:
        done = subprocess.run([sys.executable, *args], capture_output=True, text=True,
                              env=environ, timeout=timeout_s)
    except subprocess.TimeoutExpired:
        return dict(error=f"over --timeout_s={timeout_s}")
    return result(done)


def result(done):
    """The ``RESULT {json}`` line a benchmark worker printed, as a dict, or
    ``{"error": ...}`` with its exit status and last line of stderr
    (``done``: a finished ``subprocess.CompletedProcess``)."""
    for line in done.stdout.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[len("RESULT "):])
    tail = (done.stderr.strip().splitlines() or ["no output"])[-1]
    return dict(error=f"exit {done.returncode}: {tail[:200]}")


def _cell(value, fmt):
    if value is None:
        return "-"
    return value if isinstance(value, str) else fmt.format(value)


def table(rows, columns):
    """A Markdown table of ``rows`` (dicts) with ``columns`` [(key, title, fmt)].

    A missing or ``None`` value is shown as ``-`` and a string as it is.
    """
    lines = ["| " + " | ".join(title for _, title, _ in columns) + " |",
             "|" + "|".join(" --- " for _ in columns) + "|"]
    for row in rows:
        lines.append("| " + " | ".join(_cell(row.get(key), fmt) for key, _, fmt in columns)
                     + " |")
    return "\n".join(lines)

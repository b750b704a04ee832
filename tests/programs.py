"""Runs a command-line program's refusals as a user meets them, many in one
process: the program's ``run()`` (the console command; or the module run as
``python -m`` runs it, where its flags are defined under its ``__main__``
guard) is called once per argument list, its flags reset to their defaults between calls (absl re-parses
them on each run), and each call's exit code and standard error are kept.
One interpreter start (TensorFlow or JAX imported once) instead of one per
case; what each case prints and how it exits are the program's own.
:func:`run_programs` runs a guide's commands so, one after the other: the
runs of one program in a row share a process (two programs may define the
same flags, so each has its own), or, for refusals, all of them one process."""

import itertools
import json
import os
import re
import subprocess
import sys

# Not tests.conftest's REPO: the programs' processes import this module
# (forget_programs), and conftest imports Keras, which must come after a
# program's own choices (keras_identity_cli._preload).
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

_DRIVER = r"""
import contextlib, importlib, io, json, runpy, sys
from absl import flags
from tests.programs import forget_programs, remove_flags
before = set(sys.modules)
results = []
previous = None
for name, args in json.loads(sys.argv[1]):
    if previous not in (None, name):
        forget_programs(before)
    previous = name
    sys.argv = [sys.argv[0]] + args  # a program may read them as it is imported
    stdout, stderr = io.StringIO(), io.StringIO()
    code = 0
    with contextlib.redirect_stderr(stderr), contextlib.redirect_stdout(stdout):
        try:
            module = importlib.import_module(name)
            if hasattr(module, "run"):
                entry = module.run
            else:  # a program whose flags are defined under its __main__ guard
                sys.modules.pop(name)  # runpy runs it afresh (and would warn: imported)
                entry = lambda: runpy.run_module(name, run_name="__main__")
            flags.FLAGS.unparse_flags()
            entry()
        except SystemExit as exit:
            code = exit.code if isinstance(exit.code, int) else int(exit.code is not None)
            if exit.code is not None and not isinstance(exit.code, int):
                print(exit.code, file=sys.stderr)  # as the interpreter prints sys.exit("...")
    # The flags its __main__ defined (absl files them under sys.argv[0]): the
    # next run defines them again.
    remove_flags(flags.FLAGS.flags_by_module_dict().get(sys.argv[0], []))
    results.append([code, stderr.getvalue(), stdout.getvalue()])
print("\nRESULTS " + json.dumps(results))
"""


PROGRAM_PACKAGES = ("benchmarks", "experiments", "keras_identity_cli")


def remove_flags(defined):
    """Removes the absl flags ``defined`` (and their short names) from
    ``flags.FLAGS``, so that a program may define them again."""
    from absl import flags

    for flag in list(defined):
        for name in {flag.name, flag.short_name} - {None}:
            if name in flags.FLAGS:
                delattr(flags.FLAGS, name)


def forget_programs(before):
    """Removes from this process the program modules
    (:data:`PROGRAM_PACKAGES`) imported since ``before`` (``set(sys.modules)``
    then) and the flags they defined: the next program imported defines its
    flags afresh, even those another program defined (through
    keras_identity_cli._common, say)."""
    from absl import flags

    def of_a_program(module):
        return module.split(".")[0] in PROGRAM_PACKAGES

    for module, defined in flags.FLAGS.flags_by_module_dict().items():
        if of_a_program(module) and module not in before:
            remove_flags(defined)
    for module in set(sys.modules) - before:
        if of_a_program(module):
            del sys.modules[module]


def run_refusals(module, cases, env=None, timeout=600):
    """``[(exit code, stderr), ...]``: ``module``'s ``run()`` with each list of
    arguments of ``cases``, in one fresh process (cwd: the repository)."""
    return [(code, stderr) for code, stderr, _ in run_cases(module, cases, env, timeout)]


def run_cases(module, cases, env=None, timeout=600):
    """``[(exit code, stderr, stdout), ...]``: as :func:`run_refusals`, with
    what each run printed on standard output."""
    return run_programs([(module, args) for args in cases], env=env, timeout=timeout)


def run_programs(runs, cwd=REPO, env=None, timeout=600, one_process=False):
    """``[(exit code, stderr, stdout), ...]``: each ``(module, arguments)`` of
    ``runs`` in turn, its ``run()`` called as by :func:`run_refusals`, the
    runs of one module in a row in one fresh process started in ``cwd``.

    ``one_process=True`` runs them all in one process, each module and the
    flags it defined removed before another module runs: for runs that leave
    no state behind (refusals of flags, before the program's work begins);
    programs that train set the process's thread pools and precision."""
    if one_process:
        return _run_in_one_process(list(runs), cwd, env, timeout)
    results = []
    for _, group in itertools.groupby(runs, key=lambda run: run[0]):
        results += _run_in_one_process(list(group), cwd, env, timeout)
    return results


def _run_in_one_process(runs, cwd, env, timeout):
    result = subprocess.run([sys.executable, "-c", _DRIVER, json.dumps(runs)],
                            cwd=cwd, capture_output=True, text=True, timeout=timeout,
                            env={**os.environ, "PYTHONPATH": os.pathsep.join(
                                filter(None, [REPO, os.environ.get("PYTHONPATH")])),
                                 **(env or {})})
    lines = [l for l in result.stdout.splitlines() if l.startswith("RESULTS ")]
    assert result.returncode == 0 and lines, result.stderr[-3000:]
    return [tuple(r) for r in json.loads(lines[-1][len("RESULTS "):])]


def files_left(folders):
    """The files under ``folders`` (a machine's working directory and
    temporary folder, say), relative to each, that a program left there, but
    TensorFlow's AutoGraph bytecode: AutoGraph writes the code it converts to
    the temporary folder and removes it, and where Python writes bytecode
    (PYTHONDONTWRITEBYTECODE unset, as users have it) its
    ``__pycache__/__autograph_generated_file*.pyc`` stays: TensorFlow's, not
    the program's."""
    return sorted(path for path in (
        os.path.relpath(os.path.join(root, name), folder)
        for folder in folders for root, _, names in os.walk(folder) for name in names)
        if not re.fullmatch(r"(.*/)?__pycache__/__autograph_generated_file\w+\.[\w-]+\.pyc", path))


def error_lines(stderr):
    """The ``error: ...`` lines a program printed."""
    return [line for line in stderr.splitlines() if line.startswith("error:")]


class LineWatch:
    """Reads a running process's text output (``stream``) in a thread of its
    own, keeping every line (``lines``); :meth:`wait` returns once a line
    starts with ``prefix`` (False after ``timeout`` seconds)."""

    def __init__(self, stream, prefix):
        import threading

        self.lines, self.prefix = [], prefix
        self._seen = threading.Event()
        self._thread = threading.Thread(target=self._read, args=(stream,), daemon=True)
        self._thread.start()

    def _read(self, stream):
        for line in stream:
            self.lines.append(line)
            if line.startswith(self.prefix):
                self._seen.set()

    def wait(self, timeout):
        return self._seen.wait(timeout)

    def join(self, timeout=10):
        """Waits for the output's end (the process has exited)."""
        self._thread.join(timeout)

    def text(self):
        return "".join(self.lines)


def stop_by_taking_the_lock(proc, lock, remove):
    """Removes a training program's ``lock`` (``remove(lock)``) once its first
    epoch has ended, and checks that the program stops in one line, status
    75 (``proc``: a ``keras-identity-train`` with stdout and stderr piped)."""
    try:
        assert LineWatch(proc.stdout, "epoch 1 ").wait(300)
        remove(lock)
        status = proc.wait(timeout=300)
        stderr = proc.stderr.read()
    finally:
        proc.kill()
        proc.wait()
    assert status == 75, stderr[-3000:]
    lines = [line for line in stderr.splitlines() if line.startswith("the lock ")]
    assert len(lines) == 1, stderr[-3000:]
    assert lines[0].startswith(f"the lock {lock} was deleted while this run held it: this "
                               f"run stopped at step ") and \
        lines[0].endswith("then run the same command to resume (exit status 75)"), lines

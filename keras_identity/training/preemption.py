"""A run that is stopped loses seconds, not an epoch: the stop signals.

While a run trains, SIGTERM, SIGINT and the signal of ``--stop_signal``
(SLURM's ``--signal=USR1@120``, say) ask it to stop (:class:`StopSignals`):
the step in progress ends, a checkpoint of that step is written, and
:class:`Stopped` is raised (``keras-identity-train`` prints one line and
exits with :data:`STOP_STATUS`).  A second signal ends the process at once
(status 128 + its number).  The loop that writes the checkpoints (also every
``--checkpoint_every``) is :mod:`~keras_identity.training.fit_loop`.
"""

import os
import re
import signal
import sys
import threading

# sysexits.h EX_TEMPFAIL: stopped on request after saving; the same command
# continues the run (a scheduler's requeue condition).
STOP_STATUS = os.EX_TEMPFAIL  # 75
DEFAULT_SIGNALS = ("SIGTERM", "SIGINT")
# What --stop_signal may name (those this platform has).
OTHER_SIGNALS = tuple(s for s in ("SIGUSR1", "SIGUSR2", "SIGHUP", "SIGQUIT", "SIGXCPU")
                      if hasattr(signal, s))
# --checkpoint_every's default: the most a kill with no warning loses.
DEFAULT_CHECKPOINT_EVERY = "10m"
_UNITS = {"s": 1, "m": 60, "h": 3600}


def parse_checkpoint_every(value):
    """``(steps, seconds)`` of ``--checkpoint_every``: ``"500"`` (steps),
    ``"90s"``, ``"10m"``, ``"1h"`` (training time), or ``"epoch"`` (epoch
    ends only: ``(None, None)``).

    Raises:
        ValueError: one line naming the flag and what is allowed.
    """
    text = str(value).strip().lower()
    if text == "epoch":
        return None, None
    found = re.fullmatch(r"(\d+(?:\.\d+)?)\s*([smh]?)", text)
    if found and found.group(2):
        seconds = float(found.group(1)) * _UNITS[found.group(2)]
        if seconds > 0:
            return None, seconds
    elif found and "." not in found.group(1) and int(found.group(1)) > 0:
        return int(found.group(1)), None
    raise ValueError(f"checkpoint_every={value!r} is not valid; expected a number of steps "
                     f"(500), a training time (90s, 10m, 1h) or 'epoch'.")


def signal_number(name):
    """The number of the signal ``name`` (``"USR1"``, ``"SIGUSR1"``).

    Raises:
        ValueError: one line naming ``--stop_signal`` and what is allowed.
    """
    text = str(name).strip().upper()
    text = text if text.startswith("SIG") else "SIG" + text
    if text in DEFAULT_SIGNALS:
        raise ValueError(f"stop_signal={name!r} is not valid: {text} always stops a run; "
                         f"expected another signal: {', '.join(OTHER_SIGNALS)}.")
    if text not in OTHER_SIGNALS:
        raise ValueError(f"stop_signal={name!r} is not valid; expected one of "
                         f"{', '.join(OTHER_SIGNALS)} (SIGTERM and SIGINT always stop a run).")
    return int(getattr(signal, text))


def place(step, steps_per_epoch):
    """Where ``step`` is in the run, in words: ``"end of epoch E"`` or
    ``"inside epoch E"`` (epochs count from 1), the same when a checkpoint is
    written, when a signal stops the run there and when a run resumes."""
    epoch, within = divmod(int(step), int(steps_per_epoch))
    return f"inside epoch {epoch + 1}" if within else f"end of epoch {epoch}"


class Stopped(BaseException):
    """The run stopped on a signal after writing the checkpoint of ``step``.
    A ``BaseException``, as ``KeyboardInterrupt`` is: it ends the program (a
    tuner's trial loop, which catches ``Exception``, lets it pass)."""

    def __init__(self, signal_name, step, steps_per_epoch, directory, saved=True):
        self.signal_name, self.step, self.directory = signal_name, int(step), directory
        self.epoch = -(-self.step // int(steps_per_epoch))  # the epoch the step is in or ends
        self.saved = saved
        where = (f"the checkpoint of that step is in {directory}" if saved else
                 "no checkpoint of it (this trial restarts from its start)")
        # What happened, without what to do next (a caller may say it otherwise).
        self.what = (f"stopped by {signal_name} at step {self.step:,} "
                     f"({place(self.step, steps_per_epoch)}): {where}")
        super().__init__(f"{self.what}; run the same command to resume")


class StopSignals:
    """Catches the stop signals while a run trains (a context manager).

    The first signal is remembered (:attr:`received`, its name) and answered
    by the training loop at its next step; a second one ends the process at
    once with status 128 + its number.  Outside the main thread (where
    Python allows no handlers) it does nothing.
    """

    def __init__(self, extra=None, print_fn=None):
        self.numbers = [int(getattr(signal, name)) for name in DEFAULT_SIGNALS]
        if extra is not None:
            self.numbers.append(signal_number(extra))
        self.print_fn = print_fn or (lambda line: print(line, file=sys.stderr, flush=True))
        self.received = None
        self._previous = {}

    def _handle(self, number, frame):
        name = signal.Signals(number).name
        if self.received is not None:
            try:
                self.print_fn(f"a second stop signal ({name}): exiting at once, without "
                              f"saving the step in progress (the last checkpoint is intact)")
            finally:  # even if the line cannot be written (a write it interrupted)
                os._exit(128 + number)
        self.received = name
        self.print_fn(f"{name} received: saving a checkpoint after the step in progress "
                      f"(send it again to exit at once)")

    def __enter__(self):
        if threading.current_thread() is threading.main_thread():
            for number in self.numbers:
                self._previous[number] = signal.signal(number, self._handle)
        return self

    def __exit__(self, *exc):
        for number, previous in self._previous.items():
            signal.signal(number, previous)
        self._previous = {}
        return False

"""Fault-tolerant checkpoints: weights, optimizer state and history, by step.

A checkpoint is written at the end of every epoch (an epoch of
``steps_per_epoch`` steps) and inside epochs (:mod:`preemption`: a stop
signal, ``--checkpoint_every``): first the weights file (model and optimizer
variables) under a temporary name that is atomically renamed, then its state
(``ckpt-<step>.state.json``: step, epoch, history and, inside an epoch, the
epoch's metric sums) and ``state.json`` naming the latest.  A run killed at
any moment therefore finds an intact checkpoint and loses at most the
training since it; a latest checkpoint that cannot be
read (a damaged disk, a copy cut short) is skipped with a warning for the
newest one that can.

``state.json`` is only an index: every checkpoint carries its own state
(including the run's identity, the flags it was trained with), so a run
whose ``state.json`` is missing or garbled still resumes from the newest
checkpoint.  A run never deletes or overwrites a checkpoint it did not
write, except the older checkpoints of the very run it continues.
"""

import errno
import glob
import json
import math
import os
import re
import shutil
import warnings


def _finite(value):
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(v) for v in value]
    return value


def write_json(path, value, indent=1):
    """Writes ``value`` to ``path`` as JSON all at once: into a temporary file
    that is renamed over ``path`` (a reader never sees half a file; a full
    disk leaves the previous file).  NaN and infinities become ``null``
    (JSON has no such numbers)."""
    temporary = path + ".partial"
    try:
        with open(temporary, "w") as f:
            json.dump(_finite(value), f, indent=indent, allow_nan=False)
        os.replace(temporary, path)
    except BaseException:
        if os.path.exists(temporary):
            os.remove(temporary)
        raise


class CheckpointError(ValueError):
    """No checkpoint of a run can be read; the message names the files."""


class WriteError(RuntimeError):
    """A run's files could not be written (a full disk, a lost mount, ...);
    the message names the directory and the cause, and the checkpoint
    before it is intact."""


# Bytes an HDF5 weights file spends per variable besides its values (an upper
# estimate, for the free-space check before writing).
_PER_VARIABLE_BYTES = 4096


def checkpoint_bytes(model):
    """About how many bytes a checkpoint of ``model`` takes (weights and
    optimizer state)."""
    variables = list(model.weights)
    if model.optimizer is not None:
        variables += list(model.optimizer.variables)
    total = 0
    for variable in variables:
        bits = re.search(r"(\d+)$", str(variable.dtype))
        size = 1
        for dim in variable.shape:
            size *= int(dim)
        total += size * (int(bits.group(1)) // 8 if bits else 4) + _PER_VARIABLE_BYTES
    return total


def out_of_space(error):
    """Whether ``error`` (an ``OSError``) says the disk or quota is full."""
    return isinstance(error, OSError) and (
        error.errno in (errno.ENOSPC, errno.EDQUOT) or "No space left" in str(error))


class Checkpointer:
    """Saves and restores the training state in ``<model_dir>/checkpoints``."""

    def __init__(self, directory, keep=2, identity=None, owns_directory=False):
        """``owns_directory``: every checkpoint in ``directory`` is this run's
        (a TensorFlow worker's or a JAX process's own folder, never resumed
        from), so the keep policy may remove any of them."""
        self.directory = directory
        self.keep = max(1, int(keep))
        self.identity = identity
        self.owns_directory = owns_directory
        self.state_path = os.path.join(directory, "state.json")
        self._written = set()       # checkpoints this object wrote
        self._continued_step = -1   # the step of the checkpoint restored (-1: none)

    def save(self, model, *, step, epoch, history, extra=None):
        """Writes the checkpoint of ``step``; raises :class:`WriteError` (and
        leaves no partial file, the previous checkpoint still the latest)
        when it cannot: checked against the free space before writing, as
        HDF5 copes badly with a disk that fills up under it."""
        name = f"ckpt-{step:09d}.weights.h5"
        path = os.path.join(self.directory, name)
        temporary = path + ".partial.weights.h5"
        state = {"step": int(step), "epoch": int(epoch), "weights": name, "history": history,
                 **(extra or {})}
        if self.identity is not None:
            state["identity"] = self.identity
        written = []
        try:
            os.makedirs(self.directory, exist_ok=True)
            needed = checkpoint_bytes(model) + len(json.dumps(state)) * 2
            free = shutil.disk_usage(self.directory).free
            if free < needed:
                raise OSError(errno.ENOSPC, f"No space left on device: {free / 2 ** 20:.1f} MiB "
                                            f"free, about {needed / 2 ** 20:.1f} MiB needed")
            written.append(temporary)
            model.save_weights(temporary)
            if os.path.exists(path) and path not in self._written and not self.owns_directory:
                self._set_aside(path)
            os.replace(temporary, path)
            self._written.add(path)
            written.append(path)
            for target in (_state_of(path), self.state_path):
                written.append(target + ".partial")
                with open(target + ".partial", "w") as f:
                    json.dump(state, f)
                os.replace(target + ".partial", target)
        except Exception as error:  # OSError, h5py's errors
            for leftover in written:
                if leftover != self.state_path and os.path.exists(leftover):
                    try:
                        os.remove(leftover)
                    except OSError:
                        pass
            if os.path.exists(_state_of(path)) and not os.path.exists(path):
                os.remove(_state_of(path))
            previous = self.latest_step()
            raise WriteError(
                f"cannot write the checkpoint of step {step} into {self.directory} "
                f"({getattr(error, 'strerror', None) or ' '.join(str(error).split())[:200]}); "
                + (f"the checkpoint of step {previous} is intact: free space and run the "
                   f"same command to resume" if previous is not None else
                   "no checkpoint was written")) from None
        # Only this run's own checkpoints make room: those it wrote and those
        # of the run it continues (at or before the step it restored).
        own = [f for f in self._weights_files() if self.owns_directory
               or f in self._written or _step_of(f) <= self._continued_step]
        for old in own[:-self.keep]:
            os.remove(old)
            self._written.discard(old)
            if os.path.exists(_state_of(old)):
                os.remove(_state_of(old))

    def _set_aside(self, path):
        """Renames a checkpoint this run did not write (one it could not read,
        newer than the step it resumed from) out of the way, never over it."""
        aside = path + ".unread"
        number = 1
        while os.path.exists(aside):
            number += 1
            aside = f"{path}.unread{number}"
        os.replace(path, aside)
        if os.path.exists(_state_of(path)):
            os.replace(_state_of(path), _state_of(path) + aside[len(path):])
        warnings.warn(f"kept the checkpoint {os.path.basename(path)}, which this run did not "
                      f"write, as {os.path.basename(aside)}.", stacklevel=3)

    def latest_step(self):
        """The step of the latest readable checkpoint, or None."""
        try:
            state = self.latest()
        except CheckpointError:
            return None
        return None if state is None else state["step"]

    def _weights_files(self):
        pattern = os.path.join(glob.escape(self.directory), "ckpt-*.weights.h5")
        return sorted(f for f in glob.glob(pattern)
                      if not f.endswith(".partial.weights.h5"))

    def latest(self):
        """The saved state (``step``, ``epoch``, ``weights``, ``history`` and,
        when it was recorded, ``identity``) or None when there is no checkpoint.

        ``state.json`` names the latest checkpoint; when it is missing, cannot
        be read or names an older one than the newest checkpoint with a
        readable state of its own, that checkpoint's state is used (with a
        warning when ``state.json`` is missing or unreadable).

        Raises:
            CheckpointError: there are checkpoints, but none has a readable
                state (neither ``state.json`` nor their own).
        """
        candidates = self._candidates()
        newest = candidates[0][1] if candidates else None
        problem = None
        if os.path.exists(self.state_path):
            try:
                with open(self.state_path) as f:
                    state = json.load(f)
                if not _is_state(state):
                    raise ValueError("missing or invalid step/epoch/weights")
                if newest is None or state["step"] >= newest["step"]:
                    return state
                return newest  # saved, but stopped before state.json was updated
            except (OSError, ValueError, TypeError) as error:
                problem = f"is not readable ({error})"
        elif self._weights_files():
            problem = "is missing"
        else:
            return None
        if newest is None:
            raise CheckpointError(
                f"{self.state_path} {problem} and no checkpoint in {self.directory} has a "
                f"state of its own (ckpt-<step>.state.json); nothing was changed there: "
                f"restore the files, or use a new --model_dir.")
        warnings.warn(f"{self.state_path} {problem}; resuming from "
                      f"{os.path.basename(candidates[0][0])} (its own state).", stacklevel=2)
        return newest

    def _candidates(self):
        """``(weights path, state)`` of every checkpoint with a readable state,
        newest first."""
        found = []
        for path in reversed(self._weights_files()):
            try:
                with open(_state_of(path)) as f:
                    state = json.load(f)
            except (OSError, ValueError):
                continue
            if _is_state(state):
                found.append((path, state))
        return found

    def restore(self, model, state=None):
        """Loads the newest readable checkpoint into ``model`` (and its optimizer).

        ``state``: what :meth:`latest` returned, when the caller has read it
        already (it is not read, nor warned about, twice).  Returns the state
        restored, or None when there is no checkpoint.  A checkpoint whose
        weights cannot be read is skipped with a warning naming it.

        Raises:
            CheckpointError: there are checkpoints, but none can be read.
        """
        state = self.latest() if state is None else state
        if state is None:
            return None
        if model.optimizer is not None and not model.optimizer.built:
            model.optimizer.build(model.trainable_variables)
        latest_path = os.path.join(self.directory, state["weights"])
        candidates = [(latest_path, state)] + [
            (path, other) for path, other in self._candidates() if path != latest_path]
        skipped = []
        for path, candidate in candidates:
            try:
                model.load_weights(path)
            except Exception as error:  # h5py OSError, KeyError, ValueError, ...
                skipped.append(f"{os.path.basename(path)} ({type(error).__name__})")
                continue
            if skipped:
                warnings.warn(f"skipped unreadable checkpoint(s) {', '.join(skipped)} in "
                              f"{self.directory}; resuming from {os.path.basename(path)} "
                              f"(step {candidate['step']}).", stacklevel=2)
            self._continued_step = int(candidate["step"])
            return candidate
        raise CheckpointError(f"no checkpoint in {self.directory} can be read: "
                              f"{', '.join(skipped)}; use a new --model_dir.")


def _is_state(state):
    """Whether ``state`` (read from JSON) is a checkpoint's state."""
    return (isinstance(state, dict) and {"step", "epoch", "weights"} <= set(state)
            and all(isinstance(state[k], int) and not isinstance(state[k], bool)
                    for k in ("step", "epoch")) and isinstance(state["weights"], str))


def _state_of(weights_path):
    return weights_path[:-len(".weights.h5")] + ".state.json"


def _step_of(weights_path):
    """The step in a ``ckpt-<step>.weights.h5`` name (-1 for another name)."""
    found = re.search(r"ckpt-(\d+)\.weights\.h5$", weights_path)
    return int(found.group(1)) if found else -1

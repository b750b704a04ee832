"""Fault-tolerant checkpoints: weights, optimizer state and history, by step.

A checkpoint is written at the end of every epoch (an epoch of ``steps_per_epoch``
steps) and inside epochs (:mod:`preemption`: a stop signal, ``--checkpoint_every``),
into a local folder or a bucket (:mod:`keras_identity.storage`, where every file appears
whole: locally by an atomic rename, in a bucket when its upload ends): first its state
(``ckpt-<step>.state.json.partial``: step, epoch, history and, inside an epoch, the
epoch's metric sums), then the weights file (model and optimizer variables,
``ckpt-<step>.weights.h5``), then the state under its own name and ``state.json`` naming
the latest.  So a weights file under its own name always has its state or that whole
``.partial`` beside it: a run killed at any moment therefore finds an intact checkpoint
(completing one whose state was not yet renamed) and loses at most the training since
it.  A latest checkpoint that cannot be read (a damaged disk, a copy cut short, a state
whose step, epoch or weights name disagree, a file that is not a regular file) is
skipped with a warning for the newest one that can.

These are the HDF5 checkpoints (``--checkpoint_format=h5``: TensorFlow's, and the JAX
route's on request).  The JAX route's Orbax checkpoints are :mod:`orbax_checkpoints`' (a
subclass that reads both); this class refuses a folder holding them in one line rather
than start the run over.

``state.json`` is only an index: every checkpoint carries its own state (including the
run's identity, the flags it was trained with), so a run whose ``state.json`` is missing
or garbled still resumes from the newest checkpoint.  A checkpoint trained with other
flags than the run's (copied in from another run) is never resumed; the trainer refuses
it in one line.  A run never deletes or overwrites a checkpoint it did not write, except
the older checkpoints of the very run it continues, and refuses a ``checkpoints`` folder
that is a symbolic link (another run's folder, whose checkpoints the keep policy would
delete).
"""

import errno
import io
import json
import os
import re
import tempfile
import warnings

from keras_identity import storage


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


def check_free_space(directory, needed):
    """Raises ``OSError(ENOSPC)`` when a local ``directory`` has fewer than
    ``needed`` bytes free (a bucket is not asked)."""
    free = storage.free_bytes(directory)
    if free is not None and free < needed:
        raise OSError(errno.ENOSPC, f"No space left on device: {free / 2 ** 20:.1f} MiB "
                                    f"free, about {needed / 2 ** 20:.1f} MiB needed")


# The folder of an Orbax checkpoint (:mod:`orbax_checkpoints`: the JAX route's).
ORBAX_FOLDER = re.compile(r"ckpt_(\d{9})")


class Checkpointer:
    """Saves and restores the training state in ``<model_dir>/checkpoints``."""

    # Whether every process of a multi-process run writes the checkpoint
    # (Orbax's), rather than process 0 alone.
    collective = False
    # Whether Orbax checkpoints in the folder are read (else refused).
    reads_orbax = False

    def __init__(self, directory, keep=2, identity=None, owns_directory=False):
        """``identity``: the run's flags (:func:`run_files.run_identity`); kept
        in every checkpoint, and a checkpoint whose record differs is never
        restored.  ``owns_directory``: every checkpoint in ``directory`` is
        this run's (a TensorFlow worker's or a JAX process's own folder, never
        resumed from), so the keep policy may remove any of them."""
        self.directory = directory
        self.keep = max(1, int(keep))
        self.identity = identity
        self.owns_directory = owns_directory
        self.state_path = storage.join(directory, "state.json")
        self._written = set()       # checkpoints this object wrote
        self._continued_step = -1   # the step of the checkpoint restored (-1: none)

    def check_directory(self):
        """Raises :class:`CheckpointError` (one line naming the path) unless
        the checkpoint folder is absent or a real folder of its own, and its
        ``state.json`` absent or a regular file: found before any training,
        not when the first checkpoint is written."""
        directory = self.directory
        if storage.islink(directory):
            raise CheckpointError(
                f"{directory} is a symbolic link (to {os.readlink(directory)}); a run keeps its "
                f"checkpoints in a folder of its own, whose old checkpoints it deletes: replace "
                f"the link by a folder (copy the checkpoints in), or use a new --model_dir.")
        if storage.isfile(directory) or (
                not storage.is_remote(directory) and os.path.lexists(directory)
                and not os.path.isdir(directory)):
            raise CheckpointError(
                f"{directory} is not a folder ({storage.kind(directory)}); it is where the run "
                f"keeps its checkpoints: move it away, or use a new --model_dir.")
        if storage.isdir(self.state_path) or (
                storage.exists(self.state_path) and not storage.isfile(self.state_path)):
            raise CheckpointError(
                f"{self.state_path} is not a regular file ({storage.kind(self.state_path)}); it "
                f"is the "
                f"index of the run's checkpoints: remove it (each checkpoint keeps its own "
                f"state), or use a new --model_dir.")

    def save(self, model, *, step, epoch, history, extra=None):
        """Writes the checkpoint of ``step``; raises :class:`WriteError` (and
        leaves no partial file, the previous checkpoint still the latest)
        when it cannot: on a local disk, checked against the free space
        before writing, as a disk that fills up under a write is best not
        reached."""
        name = _name(step)
        path = storage.join(self.directory, name)
        state = {"step": int(step), "epoch": int(epoch), "weights": name, "history": history,
                 **(extra or {})}
        if self.identity is not None:
            state["identity"] = self.identity
        own_state = _state_of(path)
        written = []
        try:
            storage.makedirs(self.directory)
            check_free_space(self.directory, checkpoint_bytes(model) + len(json.dumps(state)) * 2)
            weights = _weights_bytes(model)
            if storage.exists(path) and path not in self._written and not self.owns_directory:
                self._set_aside(path)
            # The state first, whole, under its temporary name: a weights file
            # under its own name always has its state or this beside it.
            written += [own_state + ".partial", path]
            # As json.dump wrote it: a NaN in the history stays NaN.
            storage.write_text(own_state + ".partial", json.dumps(state))
            storage.write_bytes(path, weights)
            self._written.add(path)
            storage.rename(own_state + ".partial", own_state)
            storage.write_text(self.state_path, json.dumps(state))
        except Exception as error:  # OSError, h5py's errors
            for leftover in written:
                try:
                    storage.remove(leftover)
                except OSError:
                    pass
            self._written.discard(path)
            try:
                if storage.exists(own_state) and not storage.exists(path):
                    storage.remove(own_state)
            except OSError:
                pass
            raise write_error(self.directory, step, error, self.intact_step()) from None
        self._remove_old()

    def _remove_old(self):
        """Keeps the newest ``keep`` checkpoints of this run: only its own make
        room (those it wrote and those of the run it continues, at or before
        the step it restored)."""
        own = [f for f in self._weights_files() if self.owns_directory
               or f in self._written or step_of(f) <= self._continued_step]
        for old in own[:-self.keep]:
            self._remove_checkpoint(old)

    def _remove_checkpoint(self, path):
        """Removes the HDF5 checkpoint ``path`` and its state."""
        storage.remove(path)
        self._written.discard(path)
        for leftover in (_state_of(path), _state_of(path) + ".partial"):
            storage.remove(leftover)

    def writing(self):
        """Whether a checkpoint is being written in the background (never
        here: a save returns once its files are whole)."""
        return False

    def finish(self):
        """Waits for a checkpoint still being written (none here: a save
        returns once its files are whole)."""

    def close(self):
        """Ends the checkpointer's work (:meth:`finish`); never raises."""

    def _set_aside(self, path):
        """Renames a checkpoint this run did not write (one it could not read,
        newer than the step it resumed from) out of the way, never over it."""
        aside = aside_name(path)
        storage.rename(path, aside)
        for own in (_state_of(path), _state_of(path) + ".partial"):
            if storage.exists(own):
                storage.rename(own, own + aside[len(path):])
        warnings.warn(f"kept the checkpoint {storage.basename(path)}, which this run did not "
                      f"write, as {storage.basename(aside)}.", stacklevel=3)

    def intact_step(self):
        """The step of the newest readable checkpoint; None when there is
        none; :data:`UNKNOWN` when the folder cannot be read now (a store
        that does not answer: its checkpoints are not said to be none)."""
        try:
            state = self.latest()
        except CheckpointError:
            return None
        except OSError:
            return UNKNOWN
        return None if state is None else state["step"]

    def latest_step(self):
        """The step of the latest readable checkpoint, or None."""
        try:
            state = self.latest()
        except (CheckpointError, OSError):  # also a store that cannot be reached now
            return None
        return None if state is None else state["step"]

    def _weights_files(self, names=None):
        """The folder's HDF5 checkpoints, oldest first (``names``: its
        listing, when the caller has it)."""
        names = storage.listdir(self.directory) if names is None else names
        return [storage.join(self.directory, name) for name in names
                if re.fullmatch(r"ckpt-.*\.weights\.h5", name)]

    def latest(self):
        """The saved state (``step``, ``epoch``, ``weights``, ``history`` and, when it was
        recorded, ``identity``) or None when there is no checkpoint.

        ``state.json`` names the latest checkpoint; when it is missing, cannot be read,
        names a checkpoint that is not there (or whose state it contradicts) or an older one
        than the newest checkpoint with a readable state of its own, that checkpoint's state
        is used (with a warning when ``state.json`` is missing or unusable).  A checkpoint
        whose own state was written but not yet renamed (the process killed between the two)
        counts with that state; one whose state write was cut short before that is passed
        over with a warning.

        Raises:
            CheckpointError: the folder or ``state.json`` is not what a run writes
                (:meth:`check_directory`), or there are checkpoints, but none has a readable
                state (neither ``state.json`` nor their own).
        """
        self.check_directory()
        names = storage.listdir(self.directory)
        orbax = [name for name in names if ORBAX_FOLDER.fullmatch(name)]
        if orbax and not self.reads_orbax:
            raise CheckpointError(
                f"{self.directory} holds Orbax checkpoints (the newest: {orbax[-1]}), written "
                f"on the JAX backend, and this run reads and writes HDF5 checkpoints: continue "
                f"the run with --backend=jax (orbax-checkpoint installed, "
                f"--checkpoint_format=orbax), or use a new --model_dir.")
        files = self._weights_files(names)
        candidates = self._candidates(files)
        newest = candidates[0][1] if candidates else None
        problem = None
        if storage.exists(self.state_path):
            try:
                state = storage.read_json(self.state_path)
                if not _is_state(state):
                    raise ValueError("missing or invalid step/epoch/weights")
                weights = storage.join(self.directory, state["weights"])
                if not storage.isfile(weights):
                    raise ValueError(f"it names {state['weights']}, which is "
                                     f"{storage.kind(weights)}")
                if newest is None or state["step"] >= newest["step"]:
                    return state
                return newest  # saved, but stopped before state.json was updated
            except storage.StorageError:
                raise
            except (OSError, ValueError, TypeError) as error:
                problem = f"is not readable ({error})"
        elif files:
            problem = "is missing"
        else:
            return None
        if newest is None:
            if files and all(_interrupted(f) for f in files):
                warnings.warn(f"the checkpoint(s) in {self.directory} were cut short while "
                              f"their state was written; the run starts from its beginning.",
                              stacklevel=2)
                return None
            raise CheckpointError(
                f"{self.state_path} {problem} and no checkpoint in {self.directory} has a "
                f"state of its own (ckpt-<step>.state.json); nothing was changed there: "
                f"restore the files, or use a new --model_dir.")
        warnings.warn(f"{self.state_path} {problem}; resuming from "
                      f"{storage.basename(candidates[0][0])} (its own state).", stacklevel=2)
        return newest

    def _candidates(self, files=None):
        """``(weights path, state)`` of every checkpoint with a readable state
        (its own, or the whole ``.partial`` of a state not yet renamed) that
        agrees with the checkpoint's name, newest first (``files``: the
        folder's weights files, when the caller has listed them)."""
        found = []
        for path in reversed(self._weights_files() if files is None else files):
            if not storage.isfile(path):
                warnings.warn(f"passed over {path}: it is {storage.kind(path)}, not a checkpoint "
                              f"this package writes.", stacklevel=3)
                continue
            for state_path in (_state_of(path), _state_of(path) + ".partial"):
                try:
                    state = storage.read_json(state_path)
                except storage.StorageError:
                    raise
                except (OSError, ValueError):
                    continue
                if _is_state(state) and state["weights"] == storage.basename(path):
                    found.append((path, state))
                    break
        return found

    def same_identity(self, state):
        """Whether ``state`` records the flags of this run (True when this
        checkpointer was given no identity)."""
        if self.identity is None:
            return True
        return _canonical(state.get("identity")) == _canonical(self.identity)

    def restore(self, model, state=None):
        """Loads the newest readable checkpoint into ``model`` (and its optimizer).

        ``state``: what :meth:`latest` returned, when the caller has read it already (it is
        not read, nor warned about, twice).  Returns the state restored, or None when there
        is no checkpoint.  A checkpoint whose weights cannot be read, or do not match the
        model and its optimizer variable for variable, is skipped with a warning naming it;
        so is an older one recorded with other flags than this run's.

        Raises:
            CheckpointError: there are checkpoints, but none can be read.
        """
        state = self.latest() if state is None else state
        if state is None:
            return None
        if model.optimizer is not None and not model.optimizer.built:
            model.optimizer.build(model.trainable_variables)
        candidates = [state] + self._older(state)
        skipped = []
        for candidate in candidates:
            name = candidate["weights"]
            if not self.same_identity(candidate):
                skipped.append(f"{name} (trained with other flags)")
                continue
            try:
                self._load(model, candidate)
            except storage.StorageError as error:  # the store, not the file
                raise CheckpointError(f"cannot read {storage.join(self.directory, name)}: "
                                      f"{error.strerror}") from None
            except Exception as error:  # h5py OSError, KeyError, ValueError, ...
                skipped.append(f"{name} ({self._failure(error)})")
                continue
            if skipped:
                warnings.warn(f"skipped unreadable checkpoint(s) {', '.join(skipped)} in "
                              f"{self.directory}; resuming from {name} "
                              f"(step {candidate['step']}).", stacklevel=2)
            self._continued_step = int(candidate["step"])
            self._restored(candidates)
            return candidate
        raise CheckpointError(f"no checkpoint in {self.directory} can be read: "
                              f"{', '.join(skipped)}; use a new --model_dir.")

    def _older(self, state):
        """The states of the checkpoints older than ``state`` with a
        readable state, newest first: what :meth:`restore` falls back to."""
        return [other for path, other in self._candidates()
                if other["weights"] != state["weights"] and other["step"] < state["step"]]

    def _load(self, model, state):
        """Loads the checkpoint of ``state`` into ``model``."""
        load_weights(model, storage.join(self.directory, state["weights"]))

    def _failure(self, error):
        """How a checkpoint that could not be loaded is described."""
        return type(error).__name__

    def _restored(self, candidates):
        """Called once a checkpoint of ``candidates`` (the states tried,
        newest first) was restored, at ``self._continued_step``."""


def aside_name(path):
    """The name a checkpoint ``path`` is set aside under: ``<path>.unread``,
    or ``.unread2``, ... where that is taken (nothing is renamed over)."""
    aside = path + ".unread"
    number = 1
    while storage.exists(aside):
        number += 1
        aside = f"{path}.unread{number}"
    return aside


# Checkpointer.intact_step's answer when the checkpoints cannot be read now.
UNKNOWN = "unknown"


def intact_words(previous, fix):
    """What a write error says of the checkpoints (``previous``: the step of
    the one still intact, None: none, :data:`UNKNOWN`) and what to do."""
    if previous is None:
        return f"no checkpoint was written: {fix} and run the same command"
    if previous == UNKNOWN:
        return (f"the checkpoints written before are intact (they cannot be listed now): "
                f"{fix} and run the same command to resume")
    return f"the checkpoint of step {previous} is intact: {fix} and run the same command " \
           f"to resume"


def describe_cause(error):
    """``error`` in one line of at most 400 characters for a message: its
    text, or its type's name where it has none (fsspec's ``FSTimeoutError``)."""
    text = " ".join(str(getattr(error, "strerror", None) or error).split())[:400]
    return text or type(error).__name__


def write_error(directory, step, error, previous, context=None):
    """The :class:`WriteError` of a checkpoint of ``step`` that could not be
    written into ``directory`` for ``error`` (``context``: what was being
    done, said before it); ``previous``: the step of the checkpoint still
    intact (None: none; :data:`UNKNOWN`: not known now)."""
    cause = describe_cause(error) if context is None else \
        f"{context}: {describe_cause(error)}"
    fix = ("free space" if out_of_space(error) else
           f"make {directory} writable" if isinstance(error, PermissionError)
           else "fix the cause")
    return WriteError(f"cannot write the checkpoint of step {step} into {directory} "
                      f"({cause}); {intact_words(previous, fix)}")


def _weights_bytes(model):
    """The bytes of ``model.save_weights``'s HDF5 file, built in memory: HDF5
    cannot recover from a disk that fills up under it (h5py's objects fail
    to close and the process crashes at exit), while a plain write that
    fails leaves a clean ``OSError``; and a bucket takes whole objects.  The
    buffer is the checkpoint's size (about 80 MB for ResNet-1001 with its
    momentum).  Keras's own store takes a buffer; where a Keras version
    lacks it, the file is written by ``save_weights`` into a temporary
    folder and read back."""
    try:
        from keras.src.saving import saving_lib

        store = saving_lib.H5IOStore(io.BytesIO(), mode="w")
    except (ImportError, AttributeError, TypeError):
        with tempfile.TemporaryDirectory(prefix="keras_identity_") as folder:
            path = os.path.join(folder, "checkpoint.weights.h5")
            model.save_weights(path)
            with open(path, "rb") as f:
                return f.read()
    buffer = store.path_or_io
    try:
        saving_lib._save_state(model, weights_store=store, assets_store=None, inner_path="",
                               visited_saveables=set())
    finally:
        store.close()
    return buffer.getvalue()


def load_weights(model, path):
    """``model.load_weights``, refusing a file that does not hold exactly the
    model's and its optimizer's variables (Keras only warns, loads what
    matches and leaves the rest: another depth's checkpoint would restart the
    schedule with half its state)."""
    with warnings.catch_warnings(record=True) as caught, storage.local_copy(path) as local:
        warnings.simplefilter("always")
        model.load_weights(local)
    for warning in caught:
        text = str(warning.message)
        if "Skipping variable loading" in text or "mismatch" in text.lower():
            raise ValueError(f"{storage.basename(path)} does not match the model: "
                             f"{' '.join(text.split())[:200]}")
        warnings.warn_explicit(warning.message, warning.category, warning.filename,
                               warning.lineno)


def _canonical(value):
    return json.dumps(value, sort_keys=True)


def _name(step):
    return f"ckpt-{step:09d}.weights.h5"


def _interrupted(weights_path):
    """Whether the checkpoint ``weights_path`` was cut short while its state
    was written: no state of its own, but the ``.partial`` of one."""
    state = _state_of(weights_path)
    return not storage.exists(state) and storage.exists(state + ".partial")


def _is_state(state):
    """Whether ``state`` (read from JSON) is a checkpoint's state: a step and
    an epoch that are whole numbers, at least 0, the epoch no later than the
    step, and the weights file named for the step (a bare name in the
    checkpoint folder)."""
    return (isinstance(state, dict) and {"step", "epoch", "weights"} <= set(state)
            and all(isinstance(state[k], int) and not isinstance(state[k], bool)
                    and state[k] >= 0 for k in ("step", "epoch"))
            and state["epoch"] <= state["step"] and state["weights"] == _name(state["step"]))


def _state_of(weights_path):
    return weights_path[:-len(".weights.h5")] + ".state.json"


def step_of(weights_path):
    """The step in a ``ckpt-<step>.weights.h5`` name (-1 for another name)."""
    found = re.search(r"ckpt-(\d+)\.weights\.h5$", weights_path)
    return int(found.group(1)) if found else -1

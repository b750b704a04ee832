"""Orbax checkpoints: the JAX route's, asynchronous and written by every process.

On JAX a run's checkpoints are Orbax checkpoints (``--checkpoint_format=orbax``, the
default there where ``orbax-checkpoint`` is installed), one folder per step
(``checkpoints/ckpt_<step>/``), written by ``orbax.checkpoint.CheckpointManager``:

* **Asynchronous.**  :meth:`OrbaxCheckpointer.save` returns once the variables are
  copied off the devices; a background thread writes the files.  The next checkpoint,
  the run's end and a stop signal wait for it (:meth:`~OrbaxCheckpointer.finish`),
  where a failed write is a :class:`checkpoints.WriteError`, the one before intact.
* **Collective.**  Every process saves the shards it holds, and process 0 commits
  them into one checkpoint (on a TPU slice, in the run's bucket).
* **Its state inside.**  The step, epoch, history, an epoch's running metric sums
  and the run's identity (its flags) are an item (``state``) committed with the
  arrays (``weights``: the model's and optimizer's variables, in the model's order).
* **Whole or absent.**  Locally a checkpoint's temporary name is renamed at its
  commit; in a bucket its commit is the file ``commit_success.txt``.  One killed
  before its commit is not listed, so the newest committed one resumes.

The guarantees of :mod:`checkpoints` hold: a checkpoint whose state or arrays cannot
be read (or do not match the model) is passed over with a warning for the newest one
that can; one of other flags is never resumed; a run deletes only its own checkpoints
and those of the run it continues, and sets aside, never deletes, a newer one it
could not read.  There is no index file: the committed checkpoints are the index.  A
TensorFlow run's HDF5 checkpoints are read too (the newest of either format resumes).

Why Orbax, and only on JAX: it is the JAX ecosystem's maintained checkpoint library
(asynchronous saves, multi-host coordination, GCS through TensorStore), unmatched by
anything of ours on a TPU slice; it needs JAX, which a TensorFlow-only install (the
TensorFlow 2.19 line, many GPU users) lacks: TensorFlow keeps HDF5, which every install reads.

Paths: Orbax reaches a bucket through ``etils.epath`` (folders, small files), pointed
at fsspec (``EPATH_USE_TF=false``) like every other file (:mod:`keras_identity.storage`),
and TensorStore (arrays), pointed at the emulator ``STORAGE_EMULATOR_HOST`` names
(``TENSORSTORE_GCS_HTTP_URL``).  A user's own setting of either is kept.
"""

import importlib.util
import json
import logging
import os
import re
import sys
import threading
import warnings

import numpy as np

from keras_identity import storage
from keras_identity import store_clients
from keras_identity.training import checkpoints
from keras_identity.training import run_lock

_PREFIX = "ckpt"
_DIGITS = 9
_ABANDONED = []   # folders whose write a stalled store held past its bound


def abandoned_writes():
    """Whether a write was left to Orbax's threads (a stalled store): they never
    end, and a program that exits must not wait for them (``os._exit``)."""
    return bool(_ABANDONED)


def available():
    """Whether ``orbax-checkpoint`` is installed."""
    try:
        return importlib.util.find_spec("orbax.checkpoint") is not None
    except ImportError:  # no orbax package at all
        return False


def _configure_environment():
    os.environ.setdefault("EPATH_USE_TF", "false")
    # TensorStore's requests: one that gets no byte for the store's timeout
    # (store_clients.store_timeout) fails and is retried, as gcsfs's are.
    seconds = str(max(1, round(store_clients.store_timeout())))
    os.environ.setdefault("TENSORSTORE_CURL_LOW_SPEED_TIME_SECONDS", seconds)
    os.environ.setdefault("TENSORSTORE_CURL_LOW_SPEED_LIMIT_BYTES", "1")
    os.environ.setdefault("TENSORSTORE_CURL_CONNECT_TIMEOUT_SECONDS", seconds)
    host = store_clients.emulator_host()
    if host is not None:
        os.environ.setdefault("TENSORSTORE_GCS_HTTP_URL", host)
        # An emulator takes no credentials: TensorStore is given a token
        # rather than searching for (and logging the lack of) real ones.
        os.environ.setdefault("GOOGLE_AUTH_TOKEN_FOR_TESTING", "emulator")


class _OrbaxErrors(logging.Filter):
    """Drops Orbax's error logs and tracebacks (a background write's), and
    asyncio's "Task exception was never retrieved" for a TensorStore read
    Orbax left behind (a checkpoint passed over, whenever its task is
    collected): this module says each failure in one line naming the
    checkpoint."""

    def filter(self, record):
        if (record.levelno >= logging.ERROR or record.exc_info) and \
                f"{os.sep}orbax{os.sep}" in (record.pathname or ""):
            return False
        return not _orphaned_tensorstore_task(record)


def _orphaned_tensorstore_task(record):
    """Whether ``record`` is asyncio's log of a task whose TensorStore error
    (its message names the ``tensorstore_spec``) nothing retrieved."""
    if record.name != "asyncio" or not str(record.msg).startswith(
            "Task exception was never retrieved") or not record.exc_info:
        return False
    return "tensorstore_spec=" in str(record.exc_info[1])


def _quiet_errors():
    # Orbax logs through absl.logging, asyncio through its own logger (a
    # logger's filter sees only its own records, not those propagated to it).
    for name in ("absl", "asyncio"):
        logger = logging.getLogger(name)
        if not any(isinstance(f, _OrbaxErrors) for f in logger.filters):
            logger.addFilter(_OrbaxErrors())


def _late_callback(unraisable):
    """Whether an unraisable error is a TensorStore future's callback that
    completed after the asyncio loop awaiting it (Orbax's own, per call) was
    closed, so nothing waits for it: no object, and a traceback ending in
    asyncio's check of the closed loop."""
    error, trace = unraisable.exc_value, unraisable.exc_traceback
    if unraisable.object is not None or not isinstance(error, RuntimeError) \
            or str(error) != "Event loop is closed" or trace is None:
        return False
    while trace.tb_next is not None:
        trace = trace.tb_next
    code = trace.tb_frame.f_code
    return code.co_name == "_check_closed" and \
        os.path.basename(os.path.dirname(code.co_filename)) == "asyncio"


def _quiet_late_callbacks():
    """Keeps :func:`_late_callback`'s tracebacks (dozens, when a store fails or a
    checkpoint is passed over) off stderr; others go to the hook that was there."""
    previous = sys.unraisablehook
    if getattr(previous, "_keras_identity", False):
        return

    def hook(unraisable):
        if not _late_callback(unraisable):
            previous(unraisable)

    hook._keras_identity = True
    sys.unraisablehook = hook


def _name(step):
    return f"{_PREFIX}_{int(step):0{_DIGITS}d}"


def _variables(model):
    """``{"model": [...], "optimizer": [...]}``: the variables a checkpoint holds
    (``model.save_weights``'), in the model's order, so that a model built
    again (its layers' automatic names numbered anew) reads it."""
    return {"model": list(model.weights),
            "optimizer": list(model.optimizer.variables) if model.optimizer is not None
            else []}


def _is_state(state, step):
    return (isinstance(state, dict) and state.get("step") == step
            and isinstance(state.get("epoch"), int) and not isinstance(state["epoch"], bool)
            and 0 <= state["epoch"] <= step)


class OrbaxCheckpointer(checkpoints.Checkpointer):
    """:class:`checkpoints.Checkpointer`'s interface over Orbax checkpoints in
    ``<model_dir>/checkpoints``; every process calls it alike."""

    collective = True
    reads_orbax = True

    def __init__(self, directory, keep=2, identity=None):
        # Orbax's file layer takes a bracketed part of the path as a glob pattern: no arrays
        # are committed there (orbax-checkpoint 0.12, disk and bucket), so none resumes.
        bracketed = re.search(r"\[[^\]]*\]", os.fspath(directory))
        if bracketed:
            raise ValueError(
                f"{os.fspath(directory)!r}: Orbax checkpoints (the JAX route's) cannot be "
                f"read back from a path with a bracketed part ({bracketed.group(0)!r}: "
                f"Orbax's file layer takes it for a glob pattern); give a --model_dir "
                f"without brackets, or --checkpoint_format=h5")
        super().__init__(directory, keep=keep, identity=identity)
        self._manager = None
        self._pending = None          # the step being written in the background
        self._steps_written = set()   # Orbax checkpoints this object wrote
        self._continued = set()       # names of the continued run's checkpoints

    # -- Orbax ------------------------------------------------------------

    def _orbax(self):
        _configure_environment()
        import orbax.checkpoint as ocp

        _quiet_errors()
        _quiet_late_callbacks()
        return ocp

    def _checkpoints(self):
        """The folder's ``CheckpointManager``, made on first use (no files until a save)."""
        if self._manager is None:
            ocp = self._orbax()
            options = ocp.CheckpointManagerOptions(
                max_to_keep=None,  # the keep policy is this module's: only the run's own
                step_prefix=_PREFIX, step_format_fixed_length=_DIGITS, create=False,
                enable_async_checkpointing=True)
            if storage.is_remote(self.directory):
                # The store's client made first, so that Orbax's (etils.epath's) is it.
                storage.check_path(self.directory)
            root = (self.directory if storage.is_remote(self.directory)
                    else os.path.abspath(self.directory))  # TensorStore's paths are absolute
            self._manager = ocp.CheckpointManager(root, options=options, item_handlers={
                "weights": ocp.StandardCheckpointHandler(),
                "state": ocp.JsonCheckpointHandler()})
        return self._manager

    def _primary(self):
        import jax

        return jax.process_index() == 0

    def _steps(self):
        """The committed Orbax checkpoints' steps, newest first (in a bucket, a
        store's failure is a ``storage.StorageError`` naming the folder)."""
        manager = self._checkpoints()
        if not storage.is_remote(self.directory):
            manager.reload()
            return sorted(manager.all_steps(), reverse=True)
        def listing():
            with storage.remote_errors(self.directory, "listing"):
                manager.reload()
                return sorted(manager.all_steps(), reverse=True)

        return self._within_deadline(listing, "listing")

    def _read_state(self, step):
        ocp = self._orbax()
        state = self._checkpoints().restore(
            step, args=ocp.args.Composite(state=ocp.args.JsonRestore()))["state"]
        if not _is_state(state, step):
            raise ValueError("its step or epoch is missing or does not match its name")
        return {**state, "weights": _name(step)}

    def _orbax_states(self, steps=None, warn=True):
        """Yields ``(step, state)`` of each committed Orbax checkpoint with a
        readable state, newest first (of ``steps`` where the caller listed
        them); one passed over is warned about when ``warn``."""
        for step in self._steps() if steps is None else steps:
            try:
                state = self._read_state(step)
            except Exception as error:  # Orbax's, TensorStore's, JSON's errors
                if warn:
                    warnings.warn(f"passed over {_name(step)} in {self.directory}: its state "
                                  f"cannot be read ({type(error).__name__}: "
                                  f"{' '.join(str(error).split())[:160]}).", stacklevel=3)
                continue
            yield step, state

    # -- reading ----------------------------------------------------------

    def latest(self):
        """The base class's :meth:`~checkpoints.Checkpointer.latest` over
        both formats: the newest readable state, Orbax's or HDF5's."""
        self.check_directory()
        committed = self._steps()
        orbax = next(self._orbax_states(committed), (None, None))[1]
        try:
            h5 = super().latest()
        except checkpoints.CheckpointError:
            if orbax is None:
                raise
            h5 = None
        if orbax is None and h5 is None and committed:
            raise checkpoints.CheckpointError(
                f"no checkpoint in {self.directory} has a readable state (Orbax checkpoints "
                f"{', '.join(_name(s) for s in committed)}); nothing was changed there: "
                f"restore the files, or use a new --model_dir.")
        if h5 is not None and (orbax is None or h5["step"] > orbax["step"]):
            return h5
        return orbax

    def _older(self, state):
        """Older checkpoints of both formats, newest first."""
        return sorted(
            [other for _, other in self._orbax_states(warn=False)
             if other["step"] < state["step"]] + super()._older(state),
            key=lambda other: other["step"], reverse=True)

    def _failure(self, error):
        return f"{type(error).__name__}: {' '.join(str(error).split())[:120]}"

    def _restored(self, candidates):
        """Notes the run continued (its checkpoints at or before the one
        restored with this run's flags) and sets aside the newer Orbax
        checkpoints passed over, so that this run's next ones never meet them."""
        self._continued = {other["weights"] for other in candidates
                           if other["step"] <= self._continued_step
                           and self.same_identity(other)}
        self._set_aside_newer(self._continued_step)

    def _load(self, model, state):
        if checkpoints.ORBAX_FOLDER.fullmatch(state["weights"]):
            self._load_orbax(model, state["step"])
        else:
            super()._load(model, state)

    def _load_orbax(self, model, step):
        """Assigns the checkpoint's arrays to the model's and optimizer's
        variables, refusing one that does not hold exactly those shapes."""
        ocp = self._orbax()
        by_group = _variables(model)
        saved = self._checkpoints().item_metadata(step)["weights"] or {}
        for group, variables in by_group.items():
            kept = list(saved.get(group) or [])
            if len(kept) != len(variables):
                raise ValueError(f"it holds {len(kept)} {group} variables, the model "
                                 f"{len(variables)}")
            for meta, variable in zip(kept, variables):
                if tuple(meta.shape) != tuple(variable.shape):
                    raise ValueError(f"{variable.path} has shape {tuple(meta.shape)} there, "
                                     f"{tuple(variable.shape)} in the model")
        target = {group: [_abstract(variable) for variable in variables]
                  for group, variables in by_group.items()}
        restored = self._checkpoints().restore(
            step, args=ocp.args.Composite(weights=ocp.args.StandardRestore(target)))["weights"]
        for group, variables in by_group.items():
            for value, variable in zip(restored[group], variables):
                variable.assign(value)

    # -- writing ----------------------------------------------------------

    def save(self, model, *, step, epoch, history, extra=None):
        """Starts writing the checkpoint of ``step`` (after waiting for the one
        before) and returns once its arrays are off the devices.  Raises
        :class:`checkpoints.WriteError` when the one before failed or this one
        cannot start; this one's failure is raised by the next save or
        :meth:`finish`.  Each failure is every process's."""
        step = int(step)
        self.finish(before=step)
        ocp = self._orbax()
        started, failure = False, None
        try:
            # A JSON copy (NaN stays NaN): Orbax writes it in the background as history grows.
            state = json.loads(json.dumps({
                "step": step, "epoch": int(epoch), "history": history, **(extra or {}),
                **({"identity": self.identity} if self.identity is not None else {})}))
            storage.makedirs(self.directory)
            path = storage.join(self.directory, _name(step))
            if self._primary() and step not in self._steps_written and storage.exists(path):
                # Not this run's: a write killed before its commit, or unreadable.
                self._set_aside_folder(path)
            checkpoints.check_free_space(
                self.directory, checkpoints.checkpoint_bytes(model) + len(json.dumps(state)) * 2)
        except Exception as error:
            failure = error
        failure = _agreed(failure, "keras_identity_checkpoint_start")
        if failure is None:
            try:
                tree = {group: [variable.value for variable in variables]
                        for group, variables in _variables(model).items()}
                started = True
                if not self._checkpoints().save(step, force=True, args=ocp.args.Composite(
                        weights=ocp.args.StandardSave(tree), state=ocp.args.JsonSave(state))):
                    raise OSError(f"Orbax did not save {_name(step)}")
            except Exception as error:
                failure = error
        if failure is not None:
            if started:
                self._clean(step)
            raise checkpoints.write_error(self.directory, step, failure,
                                          self._intact_step()) from None
        self._pending = step

    def writing(self):
        """Whether a checkpoint is being written in the background."""
        return self._pending is not None and self._checkpoints().is_saving_in_progress()

    def finish(self, before=None):
        """Waits for the checkpoint being written, then keeps the run's newest
        ``keep``; raises :class:`checkpoints.WriteError` when it could not be written
        (its partial files removed, the one before intact).  ``before``: the step
        :meth:`save` is about to write; a write still running then is named so, and
        a commit whose listing fails is that new checkpoint's failure."""
        if self._pending is None:
            return
        step, self._pending = self._pending, None
        failure, unconfirmed, context = None, False, None
        still_running = before is not None and self._checkpoints().is_saving_in_progress()
        try:
            self._wait_for_write()
        except Exception as error:
            failure = error
        if failure is None and self._primary():   # process 0 commits it: its listing tells
            try:
                committed = self._steps()
            except Exception as error:
                failure, unconfirmed = error, True
            else:
                if step not in committed:
                    failure = OSError(f"{_name(step)} was not committed")
        own, failure = failure, _agreed(failure, "keras_identity_checkpoint_end")
        if failure is not None:
            self._clean(step)
            if unconfirmed and failure is own and before is not None:
                context, step = f"confirming the commit of {_name(step)}, written before", before
            elif still_running and failure is own:
                context = (f"its background write was still running when the checkpoint of "
                           f"step {before} began")
            raise checkpoints.write_error(self.directory, step, failure, self._intact_step(),
                                          context) from None
        self._steps_written.add(step)
        try:
            self._remove_old()
        except Exception as error:  # the checkpoint is written; an old one stays
            warnings.warn(f"could not remove an older checkpoint in {self.directory} "
                          f"({type(error).__name__}: {' '.join(str(error).split())[:160]}); "
                          f"it stays.", stacklevel=2)
        try:
            self._remove_stale_temporaries(step)
        except Exception:  # noqa: BLE001 - a leftover stays, as it was
            pass

    def _remove_stale_temporaries(self, step):
        """Removes Orbax's temporary folders of steps at or before ``step``
        (writes killed before their commit, e.g. by SIGKILL: none will finish):
        process 0, only while it holds the run's lock (no other run writes)."""
        if not self._primary() or not run_lock.held_here(storage.dirname(self.directory)):
            return
        for entry in storage.listdir(self.directory):
            found = _TEMPORARY.fullmatch(entry)
            if found and int(found.group(1)) <= step:
                storage.rmtree(storage.join(self.directory, entry))

    def _wait_for_write(self):
        """Waits for Orbax's background write; in a bucket within
        :meth:`_within_deadline` (a store that stops answering would hold
        TensorStore's write, and the run, for good)."""
        manager = self._checkpoints()
        if storage.is_remote(self.directory):
            self._within_deadline(manager.wait_until_finished, "writing a checkpoint into")
        else:
            manager.wait_until_finished()

    def _within_deadline(self, call, doing):
        """``call()`` (Orbax's, on a bucket's folder), given up after
        ``storage.call_deadline`` as a ``storage.StorageError`` of ``doing`` the
        folder: its thread is left running and its manager abandoned (closing
        it would wait again); later calls of the store wait less."""
        seconds = storage.call_deadline(self.directory)
        done, result, failure = threading.Event(), [], []

        def run():
            try:
                result.append(call())
            except BaseException as error:  # noqa: BLE001 - raised below
                failure.append(error)
            finally:
                done.set()

        threading.Thread(target=run, name="keras_identity_orbax_call", daemon=True).start()
        if not done.wait(seconds):
            self._manager = None
            _ABANDONED.append(self.directory)
            raise storage.stalled(self.directory, doing, seconds)
        if failure:
            raise failure[0]
        return result[0]

    def close(self):
        """Waits for the write and stops Orbax's threads; never raises: a failure
        is a warning, unless the caller is ending with an error (the same store's,
        through a ``finally``) or its stop, which is then the run's line."""
        ending_with_an_error = sys.exc_info()[1] is not None
        try:
            self.finish()
        except checkpoints.WriteError as error:
            if not ending_with_an_error:
                warnings.warn(str(error), stacklevel=2)
        manager, self._manager = self._manager, None
        try:
            if manager is not None:
                manager.close()
        except Exception as error:
            warnings.warn(f"closing the checkpoints of {self.directory}: "
                          f"{' '.join(str(error).split())[:160]}", stacklevel=2)

    def _intact_step(self):
        """The newest checkpoint known whole: written or restored by this
        object, else the folder's newest readable one."""
        steps = list(self._steps_written)
        if self._continued_step >= 0:
            steps.append(self._continued_step)
        if not steps and storage.is_stalled(self.directory):
            return checkpoints.UNKNOWN   # Orbax's listing would wait on it again
        return max(steps) if steps else self.intact_step()

    def _clean(self, step):
        """Replaces the manager (it keeps the failure to raise it again) and,
        on process 0, removes what a failed write of ``step`` left."""
        manager, self._manager = self._manager, None
        try:
            if manager is not None:
                manager.close()
        except Exception:  # the failure again
            pass
        try:
            if not self._primary() or storage.is_stalled(self.directory):
                return   # a stalled store: what is left stays (set aside by the next run)
            name = _name(step)
            committed = self._steps()
            for entry in storage.listdir(self.directory):
                if entry.startswith(name + ".orbax-checkpoint-tmp") or (
                        entry == name and step not in committed):
                    storage.rmtree(storage.join(self.directory, entry))
        except Exception:  # the store that failed the write may fail this too
            pass

    def _remove_old(self):
        """Keeps the newest ``keep`` of the run's own checkpoints (written here
        or continued), of both formats; process 0 removes the rest, with no
        collective (the processes' listings need not agree)."""
        own = [(step, _name(step)) for step in self._steps_written]
        own += [(_step_of_name(name), name) for name in self._continued]
        own.sort(reverse=True)
        for step, name in own[self.keep:]:
            self._steps_written.discard(step)
            self._continued.discard(name)
            if not self._primary():
                continue
            path = storage.join(self.directory, name)
            if checkpoints.ORBAX_FOLDER.fullmatch(name):
                _remove_folder(path)
            else:
                self._remove_checkpoint(path)
        if self._primary() and not self._weights_files() and storage.exists(self.state_path):
            storage.remove(self.state_path)  # the HDF5 checkpoints' index, none left

    def _set_aside_newer(self, step):
        """Sets aside the committed Orbax checkpoints newer than ``step`` that
        this run did not write: process 0, between two barriers."""
        _barrier("keras_identity_set_aside_start")
        if self._primary():
            for other in self._steps():
                if other > step and other not in self._steps_written:
                    self._set_aside_folder(storage.join(self.directory, _name(other)))
        _barrier("keras_identity_set_aside_end")
        self._checkpoints().reload()

    def _set_aside_folder(self, path):
        """Renames the checkpoint folder ``path``, which this run did not
        write, out of the way (never over another)."""
        aside = checkpoints.aside_name(path)
        storage.rename_folder(path, aside)
        warnings.warn(f"kept {storage.basename(path)}, a checkpoint this run did not write "
                      f"and cannot read, as {storage.basename(aside)}.", stacklevel=4)


# Orbax's temporary name of a folder being written (and _remove_folder's, of one removed).
_TEMPORARY = re.compile(rf"{_PREFIX}_(\d{{{_DIGITS}}})\.orbax-checkpoint-tmp.*")


def _step_of_name(name):
    """The step of a checkpoint's name, Orbax's folder or an HDF5 file."""
    found = checkpoints.ORBAX_FOLDER.fullmatch(name)
    return int(found.group(1)) if found else checkpoints.step_of(name)


def _barrier(name):
    import jax

    if jax.process_count() > 1:
        from jax.experimental import multihost_utils

        multihost_utils.sync_global_devices(name)


def _agreed(failure, name):
    """``failure`` (or None) made every process's (a collective): a process
    whose own part went well gets an error naming the one that failed."""
    import jax

    if jax.process_count() == 1:
        return failure
    from jax.experimental import multihost_utils

    failed = np.asarray(multihost_utils.process_allgather(
        np.array([failure is not None], dtype=np.int32))).reshape(-1)
    if failure is None and failed.any():
        return OSError(f"process {int(np.argmax(failed))} could not write its part")
    return failure


def _remove_folder(path):
    """Removes the Orbax checkpoint folder ``path`` after taking it out of the
    committed ones (renamed, or its commit file removed first), so a removal
    cut short never leaves a half checkpoint that looks whole."""
    if not storage.is_remote(path):
        doomed = f"{path}.orbax-checkpoint-tmp-removed"
        storage.rename_folder(path, doomed)
        storage.rmtree(doomed)
        return
    storage.remove(storage.join(path, "commit_success.txt"))
    storage.rmtree(path)


def _abstract(variable):
    """What Orbax restores ``variable`` as: an array of its dtype, shape and
    sharding (placed as the variable is)."""
    import jax

    value = variable.value
    return jax.ShapeDtypeStruct(value.shape, value.dtype, sharding=value.sharding)

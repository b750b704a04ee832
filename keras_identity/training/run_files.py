"""A run's identity and ``run.json``, the file that records it in ``model_dir``.

A run's identity (:func:`run_identity`) is everything that changes what a
training step computes, by flag name.  ``run.json`` (:data:`RUN_FILE`,
written by :func:`write_run_file`) holds it with the run's length and
backend, and each checkpoint keeps the identity too
(:mod:`~keras_identity.training.checkpoints`); :func:`check_identity`
compares both with the flags of a run that resumes, and refuses another
run's in one line (:func:`differences` names the flags).  The run's other
files: its checkpoints (:mod:`~keras_identity.training.checkpoints`,
:mod:`~keras_identity.training.orbax_checkpoints`) and its lock
(:mod:`~keras_identity.training.run_lock`).
"""

import json
import socket
import warnings

import keras

from keras_identity import storage

# The inputs of a run (run_identity), its length and backend, in its model_dir.
RUN_FILE = "run.json"


def longest_names(checkpoint_format):
    """The longest names, relative to ``model_dir``, of the files a run with
    ``checkpoint_format`` writes (digits of times, steps, processes and
    hashes as zeros, at their widest): TensorBoard's event files (named with
    this host, a process number and a time) and the checkpoints' (Orbax's
    array files, or HDF5's), a checkpoint set aside (``.unread``) included.
    For a store's limit on an object's name (``storage.check_object_names``)."""
    host = socket.gethostname()
    names = [f"tensorboard/validation/events.out.tfevents.{'0' * 10}.{host}.{'0' * 7}.000.v2"]
    if checkpoint_format == "orbax":
        names.append(f"checkpoints/ckpt_{'0' * 9}.unread/weights/ocdbt.process_0000/d/"
                     f"{'0' * 32}")
    else:
        names.append(f"checkpoints/ckpt-{'0' * 9}.weights.h5.unread")
    return names


def run_identity(config, data, recipe, plan, normalization, augmentation):
    """Everything that changes what a training step computes, by flag name.

    A ``model_dir`` resumes only with the same identity (:func:`check_identity`,
    from :func:`~keras_identity.training.trainer.prepare`); only the run's
    length (``--epochs``, ``--train_steps``) may change.
    """
    momentum, decay = config.momentum_and_decay(recipe)
    return {
        "model": config.model, "model_kwargs": config.identity_arguments(),
        "dataset": config.dataset, "data_dir": data.fingerprint,
        "train_examples": config.train_examples, "test_examples": config.test_examples,
        "recipe": recipe.name, "batch_size": plan.batch_size,
        "learning_rate": plan.learning_rate, "momentum": momentum,
        "weight_decay": decay, "warmup_steps": config.warmup_steps,
        "steps_per_epoch": plan.steps_per_epoch, "normalization": normalization.mode,
        "augmentation": augmentation, "precision": config.precision, "seed": config.seed,
        "deterministic": config.deterministic, "eval_crop": config.eval_crop,
        "lr_decay": config.lr_decay}


def differences(before, now):
    """``["key: old != new", ...]`` for the keys whose values differ, as JSON
    stores them (tuples as lists); the builder arguments of ``model_kwargs``
    are compared one by one."""
    before, now = json.loads(json.dumps(before)), json.loads(json.dumps(now))
    lines = []
    for key in sorted(set(before) | set(now)):
        old, new = before.get(key), now.get(key)
        if key == "model_kwargs" and isinstance(old, dict) and isinstance(new, dict):
            lines += differences(old, new)
        elif old != new:
            lines.append(f"{key}: {old!r} != {new!r}")
    return lines


def _read_run_file(path):
    """``run.json``'s contents, or the reason it cannot be used."""
    try:
        saved = storage.read_json(path)
        if not isinstance(saved, dict) or not isinstance(saved.get("identity"), dict):
            raise KeyError("identity")
        return saved, None
    except (FileNotFoundError, NotADirectoryError):
        return None, "is missing"
    except storage.StorageError:
        raise
    except (OSError, ValueError, KeyError, TypeError) as error:
        return None, f"is not readable ({type(error).__name__})"


def check_identity(model_dir, identity, state):
    """Refuses to resume a run whose flags differ from ``identity`` (one line
    naming the flags); returns ``run.json``'s contents (``None`` when it is
    missing or unreadable).

    The flags a run was started with are in ``run.json``, and each checkpoint
    (``state``, the latest) keeps them too: both are compared, so a
    checkpoint copied in from a run with other flags is refused even where
    ``run.json`` is this run's, and a missing or unreadable ``run.json`` is
    replaced by the checkpoint's record.  Checkpoints with no record of
    their flags are refused, never trained over.
    """
    path = storage.join(model_dir, RUN_FILE)
    checkpoint = None if state is None else storage.join(model_dir, "checkpoints",
                                                         state["weights"])
    saved, problem = _read_run_file(path)
    if saved is not None:
        before, where = saved["identity"], "flags"
    elif state is None:
        if problem == "is missing":
            return None
        raise ValueError(f"{path} {problem} and the run has no checkpoint; delete it, or use a "
                         f"new --model_dir.")
    elif isinstance(state.get("identity"), dict):
        before = state["identity"]
        where = f"flags (as its checkpoint of step {state['step']} records them; {RUN_FILE} " \
                f"{problem})"
        warnings.warn(f"{path} {problem}; the run's flags are compared with the record in its "
                      f"checkpoint of step {state['step']} instead.", stacklevel=2)
    else:
        raise ValueError(f"{path} {problem} and the checkpoints in {model_dir}/checkpoints "
                         f"keep no record of the flags they were trained with; nothing was "
                         f"changed there: restore {RUN_FILE}, or use a new --model_dir.")
    diffs = differences(before, identity)
    if diffs:
        raise ValueError(f"model_dir={model_dir!r} holds a run started with other {where} "
                         f"({'; '.join(diffs)}); resume it with its own flags (only "
                         f"--epochs/--train_steps may grow) or use a new --model_dir.")
    if state is not None:
        if not isinstance(state.get("identity"), dict):
            raise ValueError(f"the checkpoint {checkpoint} keeps no record of the flags it was "
                             f"trained with, so it cannot be told from another run's; nothing "
                             f"was changed: move it (and checkpoints/state.json) away, or use a "
                             f"new --model_dir.")
        diffs = differences(state["identity"], identity)
        if diffs:
            raise ValueError(f"the checkpoint {checkpoint} was trained with other flags than "
                             f"this run's ({'; '.join(diffs)}): it is not this run's; nothing "
                             f"was changed: move it (and checkpoints/state.json) away, or use a "
                             f"new --model_dir.")
    return saved


def write_run_file(model_dir, identity, plan):
    """Writes ``run.json`` into ``model_dir``: the run's ``identity``, its
    length (``plan``'s) and the Keras backend that trains it."""
    storage.write_json(storage.join(model_dir, RUN_FILE), {
        "identity": identity,
        "length": {"total_steps": plan.total_steps, "epochs": plan.epochs},
        "backend": keras.backend.backend()})

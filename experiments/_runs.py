"""Training runs of the experiment programs: each a ``keras-identity-train``
process with its own ``--model_dir`` (checkpointed: killed, the same call
continues it), its output in the run's ``train.log``."""

import json
import os
import subprocess
import sys

from experiments import _cli


def history(model_dir):
    """The run's ``history.json`` rows (``[]`` before its first logged point)."""
    path = os.path.join(model_dir, "history.json")
    if not os.path.exists(path):
        return []
    with open(path) as f:
        return json.load(f)


def reached(model_dir):
    """The last logged iteration of the run (0 when none)."""
    rows = history(model_dir)
    return rows[-1]["step"] if rows else 0


def shared_argv(interval, seed, test_examples=0, data_dir=None):
    """The flags every experiment's runs share: a logged point (and a
    checkpoint, the last one kept) every ``interval`` iterations, the seed,
    the test subset (0: all) and the data."""
    argv = [f"--steps_per_epoch={interval}", f"--seed={seed}", "--keep_checkpoints=1"]
    if test_examples:
        argv.append(f"--test_examples={test_examples}")
    return argv + ([f"--data_dir={data_dir}"] if data_dir else [])


def command(model_dir, argv):
    """The process's argv: ``keras-identity-train`` with ``argv`` into ``model_dir``."""
    return [sys.executable, "-m", "keras_identity_cli.train", *argv,
            f"--model_dir={model_dir}", "--verbose=2"]


def shown(model_dir, argv):
    """The command as a user types it (for reports)."""
    return " ".join(["keras-identity-train", *command(model_dir, argv)[3:]])


DIVERGED = "training diverged"   # keras-identity-train's words for a NaN loss


def diverged(model_dir):
    """The run stopped on a NaN or infinite loss (its log says so)."""
    path = os.path.join(model_dir, "train.log")
    if not os.path.exists(path):
        return False
    with open(path) as f:
        return any(DIVERGED in line for line in f)


def train(model_dir, argv, label, steps, divergence_is_a_result=False):
    """Trains the run to iteration ``steps`` (nothing when it is there and has
    saved its model); one line of progress before and after.  A run that
    diverges fails the program, or with ``divergence_is_a_result`` is left
    as it is (:func:`diverged` says so); returns False then."""
    done = os.path.exists(os.path.join(model_dir, "model.keras"))
    if (reached(model_dir) >= steps and done) or (divergence_is_a_result
                                                   and diverged(model_dir)):
        return not diverged(model_dir)
    os.makedirs(model_dir, exist_ok=True)
    log_path = os.path.join(model_dir, "train.log")
    print(f"{label}: to iteration {steps} (log: {log_path})", flush=True)
    with open(log_path, "a") as log:
        code = subprocess.call(command(model_dir, argv), stdout=log, stderr=subprocess.STDOUT)
    if code and divergence_is_a_result and diverged(model_dir):
        print(f"  {label}: diverged after iteration {reached(model_dir)}", flush=True)
        return False
    if code:
        _cli.fail(f"the run {label!r} exited with status {code}; see {log_path}")
    rows = history(model_dir)
    if rows:
        row = rows[-1]
        print(f"  {label}: iteration {row['step']}, training loss {row['loss']:.4f}, training "
              f"error {100 * row['train_error']:.1f}%, test error {100 * row['test_error']:.1f}%, "
              f"{row['images_per_sec']:.1f} img/s", flush=True)
    return True


def parameters(model_dir):
    """Trainable parameters, as the run's log states them ("-" when unknown)."""
    path = os.path.join(model_dir, "train.log")
    if os.path.exists(path):
        with open(path) as f:
            for line in f:
                if "trainable parameters" in line:
                    return line.split(": ", 1)[1].split(" trainable")[0]
    return "-"


def median_speed(model_dir):
    rows = history(model_dir)
    speeds = sorted(r["images_per_sec"] for r in rows)
    return speeds[len(speeds) // 2] if speeds else float("nan")


def kept_study(path, measured_on, compute):
    """``compute()``'s study, kept in the JSON file ``path`` with
    ``measured_on`` (what it was measured on): read back while that is the
    same, measured again otherwise."""
    from keras_identity.storage import write_json

    if os.path.exists(path):
        with open(path) as f:
            saved = json.load(f)
        if saved.get("measured_on") == measured_on:
            return saved["study"]
    result = compute()
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    write_json(path, {"measured_on": measured_on, "study": result})
    return result

"""Fault-tolerant checkpoints: weights, optimizer state and history, by step.

A checkpoint is written at the end of every epoch (an epoch of
``steps_per_epoch`` steps): first the weights file (model and optimizer
variables) under a temporary name that is atomically renamed, then
``state.json`` naming it.  A run killed at any moment therefore finds an
intact checkpoint and loses at most the epoch in progress.
"""

import glob
import json
import os


class Checkpointer:
    """Saves and restores the training state in ``<model_dir>/checkpoints``."""

    def __init__(self, directory, keep=2):
        self.directory = directory
        self.keep = max(1, int(keep))
        self.state_path = os.path.join(directory, "state.json")

    def save(self, model, *, step, epoch, history):
        os.makedirs(self.directory, exist_ok=True)
        name = f"ckpt-{step:09d}.weights.h5"
        path = os.path.join(self.directory, name)
        temporary = path + ".partial.weights.h5"
        model.save_weights(temporary)
        os.replace(temporary, path)
        state = {"step": int(step), "epoch": int(epoch), "weights": name, "history": history}
        with open(self.state_path + ".partial", "w") as f:
            json.dump(state, f)
        os.replace(self.state_path + ".partial", self.state_path)
        checkpoints = sorted(glob.glob(os.path.join(self.directory, "ckpt-*.weights.h5")))
        for old in checkpoints:
            if old.endswith(".partial.weights.h5") or old in checkpoints[-self.keep:]:
                continue
            os.remove(old)

    def latest(self):
        """The saved state (``step``, ``epoch``, ``weights``, ``history``) or None."""
        if not os.path.exists(self.state_path):
            return None
        with open(self.state_path) as f:
            return json.load(f)

    def restore(self, model):
        """Loads the latest checkpoint into ``model`` (and its optimizer).

        Returns the saved state, or None when there is no checkpoint.
        """
        state = self.latest()
        if state is None:
            return None
        if model.optimizer is not None and not model.optimizer.built:
            model.optimizer.build(model.trainable_variables)
        model.load_weights(os.path.join(self.directory, state["weights"]))
        return state

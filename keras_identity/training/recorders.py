"""What a run records at each epoch's end: :class:`RunRecorder` (a training
run's line, row, checkpoint and files) or :class:`EpochLog` (a tuner's trial),
and the TensorBoard logs (:func:`tensorboard`)."""

import io
import os
import shutil
import tempfile
import time
import warnings

import keras

from keras_identity import storage
from keras_identity.training import plots


def current_learning_rate(optimizer, step):
    """The rate the optimizer used for step ``step`` (1-based)."""
    optimizer = getattr(optimizer, "inner_optimizer", optimizer)  # loss scaling
    rate = optimizer.learning_rate
    schedule = getattr(optimizer, "_learning_rate", None)
    if isinstance(schedule, keras.optimizers.schedules.LearningRateSchedule):
        rate = schedule(max(step - 1, 0))
    return float(keras.ops.convert_to_numpy(rate))


class RunRecorder(keras.callbacks.Callback):
    """At every epoch end: one summary line, the history row, a checkpoint,
    ``history.csv``/``history.json`` and the training-curve PNG.

    Rows hold the epoch, the global step, the learning rate, the training
    loss and error (running means over the epoch, with augmentation), the
    test loss and error, and the training throughput in images/s.
    """

    # What epoch_progress() keeps in a checkpoint written inside an epoch.
    _PROGRESS = ("epoch_seconds", "epoch_first_step")

    def __init__(self, *, checkpointer, history, global_batch, total_steps, steps_per_epoch,
                 writer=None, title="", print_fn=print, resumed=None):
        """``steps_per_epoch``: an epoch ends at that position in the data
        stream (a float16 step that the loss scaling skips does not advance
        the optimizer's count).  ``resumed``: the state of the checkpoint
        this run resumes from inside an epoch (its :meth:`epoch_progress`)."""
        super().__init__()
        self.steps_per_epoch = int(steps_per_epoch)
        self.checkpointer = checkpointer
        self.history = list(history)
        self.global_batch = int(global_batch)
        self.total_steps = int(total_steps)
        self.writer = writer
        self.title = title
        self.print_fn = print_fn
        self._train_end = None
        self._epoch = None
        self._carried = {k: resumed[k] for k in self._PROGRESS if k in (resumed or {})}

    def on_epoch_begin(self, epoch, logs=None):
        if epoch == self._epoch:
            return  # the same epoch goes on in a new fit (after a checkpoint inside it)
        carried, self._carried = self._carried, {}
        self._epoch = epoch
        self._epoch_start = time.time() - carried.get("epoch_seconds", 0.0)
        self._train_end = None
        self._first_step = carried.get(
            "epoch_first_step", int(self.model.optimizer.iterations.numpy()))

    def epoch_progress(self):
        """The epoch in progress so far (its time and first step), kept in a
        checkpoint written inside it: the resumed epoch's row then counts
        its whole time and images."""
        return dict(zip(self._PROGRESS, (time.time() - self._epoch_start, self._first_step)))

    def on_test_begin(self, logs=None):
        if self._train_end is None:  # validation starts: the epoch's training ended
            self._train_end = time.time()

    def on_epoch_end(self, epoch, logs=None):
        logs = logs or {}
        now = time.time()
        train_time = (self._train_end or now) - self._epoch_start
        step = min((epoch + 1) * self.steps_per_epoch, self.total_steps)
        images = (step - self._first_step) * self.global_batch
        wall = self.history[-1]["wall_time"] if self.history else 0.0
        row = {
            "epoch": epoch + 1,
            "step": step,
            "learning_rate": current_learning_rate(self.model.optimizer, step),
            "loss": float(logs.get("loss", float("nan"))),
            "train_error": 1.0 - float(logs.get("accuracy", float("nan"))),
            "test_loss": float(logs.get("val_cross_entropy", logs.get("val_loss", float("nan")))),
            "test_error": 1.0 - float(logs.get("val_accuracy", float("nan"))),
            "images_per_sec": images / max(train_time, 1e-9),
            "epoch_time": now - self._epoch_start,
            "wall_time": wall + (now - self._epoch_start),
        }
        self.history.append(row)
        self.print_fn(
            f"epoch {row['epoch']} step {step}/{self.total_steps}: loss {row['loss']:.4f}, "
            f"train error {100 * row['train_error']:.2f}%, test loss {row['test_loss']:.4f}, "
            f"test error {100 * row['test_error']:.2f}%, lr {row['learning_rate']:.4g}, "
            f"{row['images_per_sec']:.0f} img/s, {row['epoch_time']:.1f}s")
        self.checkpointer.save(self.model, step=step, epoch=epoch + 1, history=self.history)
        if self.writer is not None:
            self.writer(self.history)


def history_writer(model_dir, title):
    """Writes history.csv, history.json and curves.png into ``model_dir``."""
    import csv

    def write(history):
        storage.write_json(storage.join(model_dir, "history.json"), history)
        table = io.StringIO(newline="")
        writer = csv.DictWriter(table, fieldnames=list(history[0]))
        writer.writeheader()
        writer.writerows(history)
        storage.write_text(storage.join(model_dir, "history.csv"), table.getvalue())
        plots.plot_history(history, storage.join(model_dir, "curves.png"), title=title)

    return write


class EpochLog(keras.callbacks.Callback):
    """Keeps each epoch's logs (``rows``) and writes a checkpoint at each
    epoch's end with them, at its position in the data stream: what a fit
    that is not a ``keras-identity-train`` run (a tuner's trial, whose
    epochs are whole) resumes from."""

    def __init__(self, checkpointer, steps_per_epoch, rows=()):
        super().__init__()
        self.checkpointer = checkpointer
        self.steps_per_epoch = int(steps_per_epoch)
        self.rows = list(rows)

    def on_epoch_end(self, epoch, logs=None):
        self.rows.append({"epoch": epoch + 1, **{k: float(v) for k, v in (logs or {}).items()}})
        self.checkpointer.save(self.model, step=(epoch + 1) * self.steps_per_epoch,
                               epoch=epoch + 1, history=self.rows)

    def history(self):
        """A Keras ``History`` of every epoch logged, before a resume too."""
        merged = keras.callbacks.History()
        merged.set_model(self.model)
        merged.epoch = [row["epoch"] - 1 for row in self.rows]
        keys = [k for k in self.rows[-1] if k != "epoch"] if self.rows else []
        merged.history = {k: [row.get(k) for row in self.rows] for k in keys}
        return merged


def tensorboard(log_dir):
    """The callbacks that write the run's TensorBoard logs into ``log_dir``:
    Keras's ``TensorBoard`` callback on the TensorFlow backend,
    :class:`EpochSummaries` (no TensorFlow needed) on the others.  For a
    bucket, :class:`EpochSummaries` on either backend (it flushes every
    epoch) writes into a local folder that :class:`UploadLogs` copies up
    after every epoch and at the end (TensorFlow's own file system would
    reach a bucket only where TensorFlow is installed, with credentials and
    an emulator setting of its own)."""
    if storage.is_remote(log_dir):
        local = tempfile.mkdtemp(prefix="keras_identity_tensorboard_")
        return [EpochSummaries(local), UploadLogs(local, log_dir)]
    if keras.backend.backend() == "tensorflow":
        return [keras.callbacks.TensorBoard(log_dir, update_freq="epoch")]
    return [EpochSummaries(log_dir)]


class UploadLogs(keras.callbacks.Callback):
    """Copies the files of ``local_dir`` that are new or have grown to
    ``log_dir`` (a bucket) after every epoch and at the end of training,
    then removes ``local_dir``."""

    def __init__(self, local_dir, log_dir):
        super().__init__()
        self.local_dir, self.log_dir = local_dir, log_dir
        self._stamps = {}

    def on_epoch_end(self, epoch, logs=None):
        storage.upload_tree(self.local_dir, self.log_dir, self._stamps)

    def on_train_end(self, logs=None):
        self.finish()

    def finish(self):
        """Uploads what is left and removes the local folder (also called
        when a stop signal or an error ends training, where Keras calls no
        ``on_train_end``: a failed upload is then a warning, never the
        error that ends the run)."""
        if os.path.isdir(self.local_dir):
            try:
                storage.upload_tree(self.local_dir, self.log_dir, self._stamps)
            except OSError as error:
                warnings.warn(f"the last TensorBoard logs were not copied to {self.log_dir}: "
                              f"{error}", stacklevel=2)
            finally:
                shutil.rmtree(self.local_dir, ignore_errors=True)


class EpochSummaries(keras.callbacks.Callback):
    """Writes every epoch's metrics as TensorBoard scalars with the
    ``tensorboard`` package's own event writer (no TensorFlow): the layout of
    Keras's ``TensorBoard`` callback, ``train/`` and ``validation/`` runs
    with ``epoch_<metric>`` tags (``val_`` logs go to ``validation/``)."""

    def __init__(self, log_dir):
        super().__init__()
        self.log_dir = log_dir
        self._writers = {}

    def _writer(self, run):
        if run not in self._writers:
            from tensorboard.summary.writer.event_file_writer import EventFileWriter

            self._writers[run] = EventFileWriter(os.path.join(self.log_dir, run))
        return self._writers[run]

    def on_epoch_end(self, epoch, logs=None):
        from tensorboard.compat.proto import event_pb2
        from tensorboard.compat.proto import summary_pb2

        values = {}
        for name, value in (logs or {}).items():
            run, tag = ("validation", name[4:]) if name.startswith("val_") else ("train", name)
            try:
                values.setdefault(run, []).append(summary_pb2.Summary.Value(
                    tag=f"epoch_{tag}", simple_value=float(value)))
            except (TypeError, ValueError):
                continue
        for run, entries in values.items():
            writer = self._writer(run)
            writer.add_event(event_pb2.Event(wall_time=time.time(), step=epoch,
                                             summary=summary_pb2.Summary(value=entries)))
            writer.flush()

    def on_train_end(self, logs=None):
        for writer in self._writers.values():
            writer.close()
        self._writers = {}

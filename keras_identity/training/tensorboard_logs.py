"""The run's TensorBoard logs: :func:`tensorboard` picks the callbacks,
Keras's own or :class:`EpochSummaries` (no TensorFlow), with
:class:`UploadLogs` for a bucket."""

import os
import shutil
import tempfile
import time
import warnings

import keras

from keras_identity import storage


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

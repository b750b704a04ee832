"""The bucket staging of a search: where Keras Tuner keeps the search's
state (``<model_dir>/search``, :data:`PROJECT`; the trials' records,
:data:`RECORDS`) and :class:`TunerFolder`, the local folder the tuner works
in for a ``model_dir`` in a bucket, filled from the bucket and copied back."""

import contextlib
import os
import shutil
import tempfile

from keras_identity import storage

RECORDS = "records_per_trial.json"
PROJECT = "search"   # Keras Tuner's folder in model_dir (its project_name)


class TunerFolder:
    """Where Keras Tuner keeps a search's state: ``<model_dir>/search``.

    Keras Tuner writes its files (the oracle's, each trial's ``trial.json`` and best
    weights) with local file calls (``tf.io.gfile`` where TensorFlow is installed, which
    reaches neither an emulator nor fsspec's credentials).  A local ``model_dir`` is used as
    it is.  For one in a bucket the tuner works in a local staging folder
    (:attr:`directory`, a temporary folder, never the current directory), filled from the
    bucket when the search starts (a search continues on any machine) and copied back
    (:meth:`publish`: the files that changed, trials' files before the oracle's and the
    records, which name finished trials) when a trial starts and ends and when the search
    ends or stops.  A trial's progress checkpoints are written in the bucket itself
    (:meth:`published`), so a trial stopped or killed resumes from the bucket too.
    """

    # Uploaded after the trials' files, in this order: what names a trial
    # comes after the trial's own files.
    _LAST = tuple(f"{PROJECT}/{name}" for name in ("tuner0.json", "oracle.json", RECORDS))

    def __init__(self, model_dir):
        self.model_dir = model_dir
        self.remote = storage.is_remote(model_dir)
        self._published = {}   # relative path -> storage.upload_tree's stamp uploaded
        if not self.remote:
            self.directory = model_dir
            return
        self.directory = tempfile.mkdtemp(prefix="keras_identity_tune_")
        try:
            project = os.path.join(self.directory, PROJECT)
            # A trial's progress is read in the bucket (TrialProgress): not copied.
            downloaded = storage.download_tree(
                storage.join(model_dir, PROJECT), project,
                skip=lambda relative: "/progress/" in f"/{relative}")
            self._published = {f"{PROJECT}/{r}": stamp for r, stamp in downloaded.items()}
        except BaseException:
            self.close()
            raise

    def published(self, path):
        """Where ``path`` (in :attr:`directory`) is kept in ``model_dir``."""
        if not self.remote:
            return path
        relative = os.path.relpath(path, self.directory).replace(os.sep, "/")
        return storage.join(self.model_dir, relative)

    def publish(self):
        """Uploads the files of the staging folder that are new or changed
        since they were last uploaded."""
        if self.remote:
            storage.upload_tree(self.directory, self.model_dir, self._published,
                                last=self._LAST)

    @contextlib.contextmanager
    def publishing(self):
        """Publishes when the block ends, with an error too (an error of the
        upload then does not hide the block's)."""
        try:
            yield
        except BaseException:
            with contextlib.suppress(Exception):
                self.publish()
            raise
        self.publish()

    def discard(self):
        """Removes the tuner's files (a new search that could not start)."""
        shutil.rmtree(os.path.join(self.directory, PROJECT), ignore_errors=True)
        if self.remote:
            storage.rmtree(storage.join(self.model_dir, PROJECT))

    def close(self):
        """Removes the staging folder (nothing for a local ``model_dir``)."""
        if self.remote:
            shutil.rmtree(self.directory, ignore_errors=True)

    def __enter__(self):
        return self

    def __exit__(self, *_):
        self.close()

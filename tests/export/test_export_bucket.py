"""keras-identity-export from and to a bucket (``gs://``, a local GCS emulator:
the ``gcs_emulator`` fixture): the model and the preprocessing.json beside
it read from the bucket, the version written into the bucket (nothing left
on the machine), loadable once downloaded, and the next version numbered
from the bucket's listing."""

import os
import subprocess
import sys

import numpy as np
import pytest

pytest.importorskip("tensorflow")  # SavedModels: TensorFlow on every backend

from keras_identity import storage  # noqa: E402
from tests.programs import files_left  # noqa: E402

pytestmark = pytest.mark.needs_tensorflow

CLASSES = list("abcdefghij")


def test_a_model_in_a_bucket_exports_into_the_bucket(gcs_emulator, tmp_path):
    import keras
    import tensorflow as tf

    import keras_identity as ki
    from keras_identity.data import Normalization
    from keras_identity.data import save_preprocessing
    from keras_identity.serving import export_saved_model

    run = gcs_emulator("run")
    model = ki.models.highway_net(10, include_preprocessing=True)
    model.save(tmp_path / "model.keras")
    storage.upload(str(tmp_path / "model.keras"), storage.join(run, "model.keras"))
    # The class names the signatures return come from the run's preprocessing.json.
    save_preprocessing(storage.join(run, "preprocessing.json"), dataset="mnist",
                       normalization=Normalization("scale"),
                       image_shape=model.input_shape[1:], class_names=CLASSES)

    base = storage.join(run, "serving", "hw")
    cwd, tmp = tmp_path / "cwd", tmp_path / "tmp"
    cwd.mkdir()
    tmp.mkdir()
    env = dict(os.environ, STORAGE_EMULATOR_HOST=gcs_emulator.url, TMPDIR=str(tmp),
               KERAS_BACKEND=keras.backend.backend())
    done = subprocess.run([sys.executable, "-m", "keras_identity_cli.export",
                           f"--model_path={storage.join(run, 'model.keras')}",
                           f"--export_dir={base}"], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "3 warm-up requests replayed" in done.stdout
    assert f"--model_name=hw --model_base_path={base} " in done.stdout
    files = storage.list_files(base)
    assert {"1/saved_model.pb", "1/variables/variables.index",
            "1/assets.extra/inputs.txt", "1/assets.extra/tf_serving_warmup_requests"} <= set(
        files), files
    assert [f for f in files if not f.startswith("1/")] == []   # no probe, no partial left
    assert files_left((cwd, tmp)) == []

    local = tmp_path / "downloaded"
    storage.download_tree(storage.join(base, "1"), str(local))
    pixels = np.random.default_rng(3).integers(0, 256, (2, *model.input_shape[1:]))
    served = tf.saved_model.load(str(local)).signatures["serving_uint8"](
        images=tf.constant(pixels.astype(np.uint8)))
    np.testing.assert_allclose(served["probabilities"].numpy(),
                               model.predict(pixels.astype(np.float32), verbose=0), atol=1e-5)
    assert served["class_names"].numpy()[0, 0].decode() in CLASSES

    # The next version is numbered from the bucket; a version there is not replaced.
    assert export_saved_model(model, base, warmup=False) == storage.join(base, "2")
    assert storage.isfile(storage.join(base, "2", "saved_model.pb"))
    with pytest.raises(ValueError, match="exists; pick another --version"):
        export_saved_model(model, base, version=1)

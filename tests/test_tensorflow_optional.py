"""TensorFlow is optional on the JAX route (keras_identity/_tensorflow.py):
without it the package imports, reads image files and trains, and what
needs it says in one line what to install."""

import os
import subprocess
import sys

import pytest

from keras_identity import _tensorflow

without_tensorflow = pytest.mark.skipif(
    _tensorflow.available(), reason="checks an install without TensorFlow (CI's JAX venv)")


def _python(code, **env):
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env=dict(os.environ, **env), timeout=300)


@without_tensorflow
def test_the_whole_package_imports_without_tensorflow():
    """Every module of the library (the serving package aside), and the
    programs' flag definitions, import without TensorFlow; Keras picks JAX."""
    code = (
        "import os, sys\n"
        "os.environ.pop('KERAS_BACKEND', None)\n"
        "import keras_identity as ki, keras\n"
        "import keras_identity.tuning, keras_identity.analysis, keras_identity.data.arrays\n"
        "import keras_identity.training.trainer, keras_identity.training.strategies\n"
        "import keras_identity_cli.train\n"
        "print(keras.backend.backend(), 'tensorflow' in sys.modules)\n")
    out = _python(code)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split() == ["jax", "False"]


@without_tensorflow
def test_what_needs_tensorflow_names_the_install(tmp_path):
    with pytest.raises(ImportError, match=r"keras_identity.data.train_dataset \(tf.data\) "
                                          r"needs TensorFlow.*keras_identity\[cpu\]"):
        from keras_identity.data import train_dataset  # noqa: F401
    with pytest.raises(ImportError, match=r"exporting or serving a SavedModel"):
        import keras_identity.serving  # noqa: F401
    for program, flags in (("export", ["--model_path=m.keras", f"--export_dir={tmp_path}"]),
                           ("serve", [f"--model_base_path={tmp_path}"])):
        out = subprocess.run([sys.executable, "-m", f"keras_identity_cli.{program}", *flags],
                             capture_output=True, text=True, timeout=300, cwd=tmp_path)
        assert out.returncode == 1
        lines = out.stderr.strip().splitlines()
        assert len(lines) == 1 and "needs TensorFlow, which is not installed: pip install " \
            "'keras_identity[cpu]'" in lines[0], out.stderr
    out = subprocess.run([sys.executable, "-m", "keras_identity_cli.train",
                          "--backend=tensorflow"], capture_output=True, text=True, timeout=300)
    assert out.returncode == 2 and out.stderr.strip().splitlines() == [
        "error: --backend=tensorflow needs TensorFlow, which is not installed: pip install "
        "'keras_identity[cpu]' (or [gpu]); or use --backend=jax"]


@without_tensorflow
def test_image_archives_decode_with_pillow_and_say_so(shared_dir):
    from keras_identity.data import load_dataset

    data = load_dataset("cifar10", os.path.join(shared_dir, "data"))
    assert data.x_train.shape == (50000, 32, 32, 3) and data.x_test.shape == (10000, 32, 32, 3)
    assert data.fingerprint.endswith("; decoded by Pillow")


def test_decode_image_reads_png_and_names_a_bad_file():
    import io

    import numpy as np
    from PIL import Image

    from keras_identity.data.decoding import decode_image
    from keras_identity.data.errors import DataError

    pixels = np.arange(2 * 3 * 3, dtype=np.uint8).reshape(2, 3, 3)
    buffer = io.BytesIO()
    Image.fromarray(pixels).save(buffer, format="PNG")
    np.testing.assert_array_equal(decode_image(buffer.getvalue(), 3), pixels)
    gray = decode_image(buffer.getvalue(), 1)
    assert gray.shape == (2, 3, 1)
    with pytest.raises(DataError, match="broken.jpg is not a readable image"):
        decode_image(b"not an image", 3, "broken.jpg")

"""experiments/torch_resnet20.py: the independent PyTorch ResNet-20 reads the
same images as the package, has the package's parameter count, crops as the
paper says, and resumes to the same weights as a straight run.

The PyTorch side runs in a process of its own
(``tests/experiments/torch_resnet20_probe.py``, once for the module): a test
process may have TensorFlow loaded, beside which importing ``torch.optim``
(torch._dynamo, Triton) crashed a pytest-xdist worker."""

import importlib.util
import io
import json
import os
import subprocess
import sys
import tarfile

import numpy as np
import pytest

from tests.conftest import REPO
from tests.conftest import SHARED

pytestmark = pytest.mark.skipif(importlib.util.find_spec("torch") is None,
                                reason="PyTorch is not installed")


@pytest.fixture(scope="module")
def small_archive(tmp_path_factory):
    """4 training and 2 test JPEGs of each class, from the shared archive."""
    if not os.path.isdir(SHARED):
        pytest.skip("../shared is not beside the repository")
    keep = {}
    with tarfile.open(os.path.join(SHARED, "data", "cifar10-jpg.tar.gz")) as archive:
        for member in archive:
            parts = member.name.split("/")
            if member.isfile() and len(parts) == 3:
                key = (parts[0], parts[1])
                if len(keep.setdefault(key, [])) < (4 if parts[0] == "train" else 2):
                    keep[key].append((member.name, archive.extractfile(member).read()))
    path = tmp_path_factory.mktemp("data") / "cifar10-jpg.tar.gz"
    with tarfile.open(path, "w:gz") as out:
        for files in keep.values():
            for name, data in files:
                info = tarfile.TarInfo(name)
                info.size = len(data)
                out.addfile(info, io.BytesIO(data))
    return path


@pytest.fixture(scope="module")
def probe(small_archive, tmp_path_factory):
    """The PyTorch side's results (its own process): ``(results, arrays)``."""
    out = tmp_path_factory.mktemp("torch")
    done = subprocess.run([sys.executable, "-m", "tests.experiments.torch_resnet20_probe",
                           str(small_archive), str(out)], cwd=REPO, capture_output=True,
                          text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    results = json.loads((out / "results.json").read_text())
    assert results["tensorflow_loaded"] is False
    with np.load(out / "arrays.npz") as arrays:
        return results, {split: (arrays[f"x_{split}"], arrays[f"y_{split}"])
                         for split in ("train", "test")}


def test_reads_the_images_the_package_reads(small_archive, probe):
    from keras_identity.data import datasets
    from keras_identity.data import decoding

    ours = probe[1]
    package = datasets.load_dataset("cifar10", data_dir=str(small_archive.parent))
    with tarfile.open(small_archive) as archive:
        files = {m.name: archive.extractfile(m).read() for m in archive if m.isfile()}
    for split, (x, y) in ours.items():
        assert x.shape == (40 if split == "train" else 20, 32, 32, 3) and x.dtype == np.uint8
        names = sorted(n for n in files if n.startswith(split + "/"))
        # The package's Pillow decoder (the JAX route's without TensorFlow, which
        # gave the package's ResNet-20 result): the same pixels.
        pillow = np.stack([decoding.decode_image(files[n], 3) for n in names])
        np.testing.assert_array_equal(x, pillow)
        # The loaded data set (TensorFlow's decoder where it is installed,
        # which rounds differently by up to 4 levels) and its labels.
        px, py = getattr(package, f"x_{split}"), getattr(package, f"y_{split}")
        assert np.abs(x.astype(int) - px.astype(int)).max() <= 4
        np.testing.assert_array_equal(y, py.reshape(-1))


def test_parameter_count_is_the_packages(probe):
    from keras_identity import models

    model = models.resnet(depth=20)
    keras_count = sum(int(np.prod(w.shape)) for w in model.trainable_weights)
    assert probe[0]["parameters"] == keras_count == 269_722


def test_augment_is_a_pad4_crop_or_its_flip(probe):
    counts = probe[0]["augment"]
    assert counts["other"] == 0 and 0 < counts["flipped"] < 6 and counts["plain"] > 0


def test_learning_rate_schedule(probe):
    assert probe[0]["learning_rates"] == pytest.approx([0.1, 0.1, 0.01, 0.01, 0.001, 0.001])


def test_resumed_run_ends_with_the_straight_runs_weights(probe):
    # 40 training images at batch 8: epochs of 5 steps; stop after 5, resume to 8.
    resume = probe[0]["resume"]
    assert resume["steps"] == [8, 8]
    assert resume["max_difference"] == 0.0
    assert resume["history_steps"] == [5, 8]


def test_missing_archive_is_one_line(probe):
    missing = probe[0]["missing_archive"]
    assert missing["code"] == 2
    assert "--data=" in missing["stderr"]

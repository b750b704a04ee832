"""experiments/torch_resnet20.py: the independent PyTorch ResNet-20 reads the
same images as the package, has the package's parameter count, crops as the
paper says, and resumes to the same weights as a straight run."""

import io
import json
import os
import tarfile

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from experiments import torch_resnet20  # noqa: E402



@pytest.fixture
def small_archive(tmp_path_factory, shared_dir):
    """4 training and 2 test JPEGs of each class, from the shared archive."""
    keep = {}
    with tarfile.open(os.path.join(shared_dir, "data", "cifar10-jpg.tar.gz")) as archive:
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


def test_reads_the_images_the_package_reads(small_archive):
    from keras_identity.data import datasets
    from keras_identity.data import decoding

    ours = torch_resnet20.load_jpeg_archive(str(small_archive))
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


def test_parameter_count_is_the_packages():
    from keras_identity import models

    model = models.resnet(depth=20)
    keras_count = sum(int(np.prod(w.shape)) for w in model.trainable_weights)
    torch_count = sum(p.numel() for p in torch_resnet20.ResNet20().parameters())
    assert torch_count == keras_count == 269_722


def test_augment_is_a_pad4_crop_or_its_flip():
    x = torch.randn(6, 3, 32, 32)
    out = torch_resnet20.augment(x, torch.Generator().manual_seed(1))
    padded = torch.nn.functional.pad(x, (4, 4, 4, 4))
    flipped = 0
    for i in range(len(x)):
        crops = [padded[i, :, r:r + 32, c:c + 32] for r in range(9) for c in range(9)]
        plain = any(torch.equal(out[i], crop) for crop in crops)
        mirrored = any(torch.equal(out[i], crop.flip(2)) for crop in crops)
        assert plain or mirrored
        flipped += mirrored and not plain
    assert 0 < flipped < len(x)


def test_learning_rate_schedule():
    assert [torch_resnet20.learning_rate(s) for s in (0, 31_999, 32_000, 47_999, 48_000, 63_999)] \
        == pytest.approx([0.1, 0.1, 0.01, 0.01, 0.001, 0.001])


def _run(archive, out, steps):
    args = [f"--data={archive}", f"--output_dir={out}", "--batch_size=8",
            f"--train_steps={steps}", "--checkpoint_epochs=1"]
    assert torch_resnet20.main(args) == 0
    return torch.load(out / "checkpoint.pt", weights_only=False)


def test_resumed_run_ends_with_the_straight_runs_weights(small_archive, tmp_path):
    # 40 training images at batch 8: epochs of 5 steps; stop after 5, resume to 8.
    straight = _run(small_archive, tmp_path / "straight", 8)
    _run(small_archive, tmp_path / "resumed", 5)
    resumed = _run(small_archive, tmp_path / "resumed", 8)
    assert straight["step"] == resumed["step"] == 8
    for name, value in straight["model"].items():
        torch.testing.assert_close(resumed["model"][name], value, rtol=0, atol=0)
    history = json.loads((tmp_path / "resumed" / "history.json").read_text())["history"]
    assert [row["step"] for row in history] == [5, 8]


def test_missing_archive_is_one_line(tmp_path, capsys):
    with pytest.raises(SystemExit) as stop:
        torch_resnet20.main([f"--data={tmp_path}/nothing.tar.gz", f"--output_dir={tmp_path}"])
    assert stop.value.code == 2
    assert "--data=" in capsys.readouterr().err

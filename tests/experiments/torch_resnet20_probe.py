"""The PyTorch side of tests/experiments/test_torch_resnet20.py, run in a
process of its own (``python -m tests.experiments.torch_resnet20_probe
ARCHIVE OUT``): PyTorch is never imported into a test process, where
TensorFlow may be loaded (``import torch.optim`` loads torch._dynamo and
Triton, which crashed a pytest-xdist worker with a segmentation fault beside
TensorFlow).  Writes ``OUT/arrays.npz`` (the images the experiment reads)
and ``OUT/results.json`` (what the tests assert on)."""

import contextlib
import io
import json
import os
import sys

import numpy as np
import torch

from experiments import torch_resnet20


def _augment_checks():
    """How many of 6 images ``augment`` gave as a pad-4 crop (``plain``), as
    its mirror image only (``flipped``), or as neither (``other``)."""
    x = torch.randn(6, 3, 32, 32)
    out = torch_resnet20.augment(x, torch.Generator().manual_seed(1))
    padded = torch.nn.functional.pad(x, (4, 4, 4, 4))
    counts = {"plain": 0, "flipped": 0, "other": 0}
    for i in range(len(x)):
        crops = [padded[i, :, r:r + 32, c:c + 32] for r in range(9) for c in range(9)]
        plain = any(torch.equal(out[i], crop) for crop in crops)
        mirrored = any(torch.equal(out[i], crop.flip(2)) for crop in crops)
        counts["plain" if plain else "flipped" if mirrored else "other"] += 1
    return counts


def _run(archive, out, steps):
    args = [f"--data={archive}", f"--output_dir={out}", "--batch_size=8",
            f"--train_steps={steps}", "--checkpoint_epochs=1"]
    with contextlib.redirect_stdout(io.StringIO()):
        code = torch_resnet20.main(args)
    assert code == 0, code
    return torch.load(os.path.join(out, "checkpoint.pt"), weights_only=False)


def _resume(archive, out):
    """A straight run of 8 steps against 5 steps resumed to 8 (40 training
    images at batch 8: epochs of 5 steps)."""
    straight = _run(archive, os.path.join(out, "straight"), 8)
    _run(archive, os.path.join(out, "resumed"), 5)
    resumed = _run(archive, os.path.join(out, "resumed"), 8)
    with open(os.path.join(out, "resumed", "history.json")) as f:
        history = json.load(f)["history"]
    return {"steps": [straight["step"], resumed["step"]],
            "max_difference": max(float((resumed["model"][n] - v).abs().max())
                                  for n, v in straight["model"].items()),
            "history_steps": [row["step"] for row in history]}


def _missing_archive(out):
    stderr = io.StringIO()
    with contextlib.redirect_stderr(stderr):
        try:
            torch_resnet20.main([f"--data={out}/nothing.tar.gz", f"--output_dir={out}"])
            code = 0
        except SystemExit as stop:
            code = stop.code
    return {"code": code, "stderr": stderr.getvalue()}


def main(archive, out):
    images = torch_resnet20.load_jpeg_archive(archive)
    np.savez(os.path.join(out, "arrays.npz"),
             **{f"{k}_{split}": v for split, (x, y) in images.items()
                for k, v in (("x", x), ("y", y))})
    results = {
        "parameters": sum(p.numel() for p in torch_resnet20.ResNet20().parameters()),
        "augment": _augment_checks(),
        "learning_rates": [torch_resnet20.learning_rate(s)
                           for s in (0, 31_999, 32_000, 47_999, 48_000, 63_999)],
        "resume": _resume(archive, out),
        "missing_archive": _missing_archive(out),
        "tensorflow_loaded": "tensorflow" in sys.modules,
    }
    with open(os.path.join(out, "results.json"), "w") as f:
        json.dump(results, f)


if __name__ == "__main__":
    main(*sys.argv[1:3])

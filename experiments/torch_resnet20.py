"""He et al. 2015's ResNet-20 on CIFAR-10, trained by PyTorch alone.

The reference for the ``he2015_resnet20`` claim (8.75% test error in the
paper's Table 6): the same recipe as the package's ``cifar`` recipe, written
independently of the package, so that a gap between the package's result on
the JPEG copy of CIFAR-10 and the paper's number can be split into what the
data costs and what the package costs.  It imports PyTorch, NumPy and Pillow
only: no Keras, no TensorFlow, nothing of ``keras_identity``.

What it runs (He et al. 2015, Sec. 4.2):

* the net: a 3x3 convolution of 16 filters, three stages of three basic
  residual units (16, 32, 64 filters; original units: conv-BN-ReLU-conv-BN,
  addition, ReLU), stride 2 at the first unit of stages 2 and 3 with the
  parameter-free option A shortcut (subsampling, zero channels appended),
  global average pooling, a 10-way dense layer: 269,722 parameters;
* He initialisation (normal, fan-out) of the convolutions, PyTorch's default
  for the dense layer, BN momentum 0.1 and epsilon 1e-5;
* SGD with momentum 0.9 and weight decay 1e-4 on every parameter (Torch's
  coupled decay), batch 128, learning rate 0.1, divided by 10 at 32,000 and
  48,000 iterations, stop at 64,000 (epochs of 390 iterations over a fresh
  permutation; the 80 images left over are skipped);
* per-pixel mean subtracted (pixels in [0, 1]), 4 pixels of zero padding on
  each side, a random 32x32 crop and a random horizontal flip;
* float32 (on a GPU, cuDNN's default TF32 convolutions).

The augmentation runs on the device over the whole epoch at once, so the
data never wait on the host.  Writes ``history.json`` (one row per epoch:
step, learning rate, training error of the epoch's augmented batches, test
error, seconds) to ``--output_dir`` after every epoch and a checkpoint every
``--checkpoint_epochs``; the same command resumes from it.  Usage::

    python -m experiments.torch_resnet20 --data=../shared/data/cifar10-jpg.tar.gz \\
        --output_dir=runs/torch_resnet20

A program of its own (``argparse``, not absl): it runs where only PyTorch is
installed, as on a lent GPU machine.
"""

import argparse
import io
import json
import os
import sys
import tarfile
import time

import numpy as np
from PIL import Image
import torch
from torch import nn
from torch.nn import functional as F

ITERATIONS_PER_EPOCH = 390


def load_jpeg_archive(path, limit=None):
    """The CIFAR-10 JPEG copy as ``{split: (uint8 NHWC images, int64
    labels)}``, classes numbered in sorted name order, images in sorted path
    order; ``limit`` keeps that many of each split, evenly spaced (tests)."""
    members = {}
    with tarfile.open(path, "r:*") as archive:
        for member in archive:
            parts = member.name.split("/")
            if member.isfile() and len(parts) == 3 and parts[2].lower().endswith(".jpg"):
                members[member.name] = archive.extractfile(member).read()
    classes = sorted({n.split("/")[1] for n in members if n.startswith("train/")})
    out = {}
    for split in ("train", "test"):
        names = sorted(n for n in members if n.startswith(split + "/"))
        if limit:
            names = names[::max(1, len(names) // limit)][:limit]
        if not names:
            raise SystemExit(f"--data={path}: no {split}/<class>/*.jpg images in the archive")
        labels = np.array([classes.index(n.split("/")[1]) for n in names], np.int64)
        images = np.stack([np.asarray(Image.open(io.BytesIO(members[n])).convert("RGB"))
                           for n in names])
        out[split] = (images, labels)
    return out


class BasicUnit(nn.Module):
    """An original residual unit (He et al. 2015, Fig. 2 left) with option A."""

    def __init__(self, in_channels, filters, stride):
        super().__init__()
        self.conv1 = nn.Conv2d(in_channels, filters, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(filters)
        self.conv2 = nn.Conv2d(filters, filters, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(filters)
        self.stride = stride
        self.extra = filters - in_channels

    def forward(self, x):
        out = F.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        shortcut = x
        if self.stride != 1 or self.extra:
            shortcut = F.pad(x[:, :, ::self.stride, ::self.stride],
                             (0, 0, 0, 0, 0, self.extra))
        return F.relu(out + shortcut)


class ResNet20(nn.Module):
    def __init__(self, units_per_stage=3, num_classes=10):
        super().__init__()
        self.conv = nn.Conv2d(3, 16, 3, 1, 1, bias=False)
        self.bn = nn.BatchNorm2d(16)
        layers, channels = [], 16
        for stage, filters in enumerate((16, 32, 64)):
            for unit in range(units_per_stage):
                stride = 2 if stage > 0 and unit == 0 else 1
                layers.append(BasicUnit(channels, filters, stride))
                channels = filters
        self.units = nn.Sequential(*layers)
        self.fc = nn.Linear(64, num_classes)
        for module in self.modules():
            if isinstance(module, nn.Conv2d):
                nn.init.kaiming_normal_(module.weight, mode="fan_out", nonlinearity="relu")

    def forward(self, x):
        x = self.units(F.relu(self.bn(self.conv(x))))
        return self.fc(x.mean((2, 3)))


def learning_rate(step, base=0.1, boundaries=(32_000, 48_000)):
    return base * 0.1 ** sum(step >= b for b in boundaries)


def augment(x, generator, pad=4):
    """Random ``pad``-pixel crops and flips of NCHW ``x``, on its device."""
    n, _, h, w = x.shape
    padded = F.pad(x, (pad, pad, pad, pad))
    offsets = torch.randint(0, 2 * pad + 1, (n, 2), generator=generator, device="cpu")
    offsets = offsets.to(x.device)
    rows = (offsets[:, :1] + torch.arange(h, device=x.device))[:, None, :, None]
    cols = (offsets[:, 1:] + torch.arange(w, device=x.device))[:, None, None, :]
    index = torch.arange(n, device=x.device)[:, None, None, None]
    channels = torch.arange(x.shape[1], device=x.device)[None, :, None, None]
    crops = padded[index, channels, rows, cols]
    flips = (torch.rand(n, generator=generator) < 0.5).to(x.device)[:, None, None, None]
    return torch.where(flips, crops.flip(3), crops)


def test_error(model, x, y, batch=1000):
    model.eval()
    wrong = 0
    with torch.no_grad():
        for i in range(0, len(x), batch):
            wrong += (model(x[i:i + batch]).argmax(1) != y[i:i + batch]).sum().item()
    model.train()
    return wrong / len(x)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--data", required=True, help="cifar10-jpg.tar.gz")
    parser.add_argument("--output_dir", required=True)
    parser.add_argument("--train_steps", type=int, default=64_000)
    parser.add_argument("--batch_size", type=int, default=128)
    parser.add_argument("--checkpoint_epochs", type=int, default=10)
    parser.add_argument("--limit", type=int, default=None,
                        help="images of each split (a smoke test; default all)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--max_seconds", type=float, default=None,
                        help="stop (checkpointed) after this much training time")
    args = parser.parse_args(argv)
    if not os.path.isfile(args.data):
        parser.exit(2, f"--data={args.data}: no such file\n")
    os.makedirs(args.output_dir, exist_ok=True)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    torch.backends.cudnn.benchmark = True
    torch.manual_seed(args.seed)
    generator = torch.Generator().manual_seed(args.seed)

    start = time.time()
    data = load_jpeg_archive(args.data, args.limit)
    (x_train, y_train), (x_test, y_test) = data["train"], data["test"]
    mean = (x_train / 255.0).mean(0, dtype=np.float64).astype(np.float32)

    def tensor(x):
        x = torch.from_numpy((x / np.float32(255.0) - mean).transpose(0, 3, 1, 2).copy())
        return x.to(device).contiguous(memory_format=torch.channels_last)

    x_train, x_test = tensor(x_train), tensor(x_test)
    y_train, y_test = torch.from_numpy(y_train).to(device), torch.from_numpy(y_test).to(device)
    print(f"data: {len(x_train)} train, {len(x_test)} test images decoded in "
          f"{time.time() - start:.1f} s; device {device}"
          f" ({torch.cuda.get_device_name() if device.type == 'cuda' else 'CPU'}), "
          f"torch {torch.__version__}", flush=True)

    model = ResNet20().to(device, memory_format=torch.channels_last)
    params = sum(p.numel() for p in model.parameters())
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, weight_decay=1e-4)
    checkpoint = os.path.join(args.output_dir, "checkpoint.pt")
    history_path = os.path.join(args.output_dir, "history.json")
    step, history = 0, []
    if os.path.exists(checkpoint):
        state = torch.load(checkpoint, map_location="cpu", weights_only=False)
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        generator.set_state(state["generator"])
        torch.set_rng_state(state["torch_rng"])
        step, history = state["step"], state["history"]
        print(f"resuming at step {step}", flush=True)

    def save():
        torch.save(dict(model=model.state_dict(), optimizer=optimizer.state_dict(),
                        generator=generator.get_state(), torch_rng=torch.get_rng_state(),
                        step=step, history=history), checkpoint + ".tmp")
        os.replace(checkpoint + ".tmp", checkpoint)

    per_epoch = min(ITERATIONS_PER_EPOCH, len(x_train) // args.batch_size)
    trained = 0.0
    while step < args.train_steps:
        epoch_start = time.time()
        order = torch.randperm(len(x_train), generator=generator).to(device)
        images, labels = augment(x_train[order], generator), y_train[order]
        images = images.contiguous(memory_format=torch.channels_last)
        wrong = torch.zeros((), device=device)
        seen = 0
        for i in range(min(per_epoch, args.train_steps - step)):
            for group in optimizer.param_groups:
                group["lr"] = learning_rate(step)
            x = images[i * args.batch_size:(i + 1) * args.batch_size]
            y = labels[i * args.batch_size:(i + 1) * args.batch_size]
            logits = model(x)
            loss = F.cross_entropy(logits, y)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            wrong += (logits.detach().argmax(1) != y).sum()
            seen += len(y)
            step += 1
        error = test_error(model, x_test, y_test)
        seconds = time.time() - epoch_start
        trained += seconds
        history.append(dict(step=step, learning_rate=learning_rate(step - 1),
                            train_error=wrong.item() / seen, test_error=error,
                            seconds=round(seconds, 3)))
        with open(history_path, "w") as f:
            json.dump(dict(parameters=params, device=str(device), torch=torch.__version__,
                           history=history), f, indent=1)
        print(f"epoch {len(history)} step {step} lr {history[-1]['learning_rate']:g} "
              f"train error {history[-1]['train_error']:.4f} test error {error:.4f} "
              f"({seconds:.2f} s)", flush=True)
        out_of_time = args.max_seconds is not None and trained >= args.max_seconds
        if len(history) % args.checkpoint_epochs == 0 or step >= args.train_steps or out_of_time:
            save()
        if out_of_time and step < args.train_steps:
            print(f"stopped at step {step} after {trained:.0f} s; the same command resumes",
                  flush=True)
            return 0
    last = history[-1]
    print(f"RESULT {json.dumps(dict(parameters=params, step=step, test_error=last['test_error'], best_test_error=min(h['test_error'] for h in history), train_error=last['train_error'], seconds=round(sum(h['seconds'] for h in history), 1)))}",
          flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

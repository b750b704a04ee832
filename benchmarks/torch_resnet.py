"""The CIFAR pre-activation ResNet of He et al. 2016 in PyTorch (the reference).

The same network as ``keras_identity.models.preact_resnet(depth)``: a 3x3
stem, three stages of n full pre-activation units (Fig. 4(e)), the first
unit of a stage pre-activating the input it shares with its shortcut, a
final BN-ReLU, global average pooling and a dense classifier.  Bottleneck
depths (9n+2: 164, 1001) have widths 16/32/64 with 4x expansion, stride on
the first 1x1 convolution and a 1x1 projection shortcut; basic depths (6n+2:
20, 56, 110) have two 3x3 convolutions and the parameter-free option A
shortcut (subsampling, zero channels appended).  :func:`build` checks that
the parameter count equals the Keras model's.

Run as a program it is :mod:`benchmarks.run`'s PyTorch worker: it imports
PyTorch and the standard library only (never TensorFlow or Keras, whose
native libraries can clash with PyTorch's in one process) and prints one
``RESULT {json}`` line::

    python -m benchmarks.torch_resnet --depth=164 --batch=64 --mode=channels_last

Needs the optional ``bench`` extra (``pip install -e ".[bench]"``).
"""

import argparse
import json
import resource
import time

import torch
from torch import nn

# PyTorch's execution modes, fastest first on CPUs (channels_last eager) and
# on GPUs (torch.compile).
MODES = ("eager", "channels_last", "compile")


class _PreActBottleneck(nn.Module):
    def __init__(self, in_channels, filters, stride, shared):
        super().__init__()
        width = filters // 4
        self.shared = shared
        self.bn1 = nn.BatchNorm2d(in_channels, eps=1e-5, momentum=0.1)
        self.conv1 = nn.Conv2d(in_channels, width, 1, stride=stride, bias=False)
        self.bn2 = nn.BatchNorm2d(width, eps=1e-5, momentum=0.1)
        self.conv2 = nn.Conv2d(width, width, 3, padding=1, bias=False)
        self.bn3 = nn.BatchNorm2d(width, eps=1e-5, momentum=0.1)
        self.conv3 = nn.Conv2d(width, filters, 1, bias=False)
        self.projection = None
        if stride != 1 or in_channels != filters:
            self.projection = nn.Conv2d(in_channels, filters, 1, stride=stride, bias=False)

    def forward(self, x):
        pre = torch.relu(self.bn1(x))
        shortcut = x
        if self.shared:
            # The first unit of a stage: BN-ReLU before the split, the
            # projection sees the pre-activated input.
            shortcut = self.projection(pre) if self.projection is not None else pre
        out = self.conv1(pre)
        out = self.conv2(torch.relu(self.bn2(out)))
        out = self.conv3(torch.relu(self.bn3(out)))
        return out + shortcut


class _PreActBasic(nn.Module):
    def __init__(self, in_channels, filters, stride, shared):
        super().__init__()
        self.shared, self.stride = shared, stride
        self.extra = filters - in_channels
        self.bn1 = nn.BatchNorm2d(in_channels, eps=1e-5, momentum=0.1)
        self.conv1 = nn.Conv2d(in_channels, filters, 3, stride=stride, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(filters, eps=1e-5, momentum=0.1)
        self.conv2 = nn.Conv2d(filters, filters, 3, padding=1, bias=False)

    def forward(self, x):
        pre = torch.relu(self.bn1(x))
        shortcut = pre if self.shared else x
        if self.stride != 1 or self.extra:
            # Option A: every stride-th pixel, zero channels appended.
            shortcut = nn.functional.pad(shortcut[:, :, ::self.stride, ::self.stride],
                                         (0, 0, 0, 0, 0, self.extra))
        out = self.conv2(torch.relu(self.bn2(self.conv1(pre))))
        return out + shortcut


def block_of(depth):
    """``("bottleneck" | "basic", units per stage)`` as keras_identity picks
    them for a CIFAR pre-activation net (bottleneck from 164 layers on)."""
    if depth >= 164 and (depth - 2) % 9 == 0:
        return "bottleneck", (depth - 2) // 9
    if (depth - 2) % 6 == 0:
        return "basic", (depth - 2) // 6
    if (depth - 2) % 9 == 0:
        return "bottleneck", (depth - 2) // 9
    raise ValueError(f"depth={depth!r}: the CIFAR nets need depth = 6n+2 (basic) or 9n+2 "
                     f"(bottleneck).")


class PreActResNet(nn.Module):
    def __init__(self, depth, num_classes=10):
        super().__init__()
        block, n = block_of(depth)
        self.stem = nn.Conv2d(3, 16, 3, padding=1, bias=False)
        units, channels = [], 16
        for width, stride in zip((16, 32, 64), (1, 2, 2)):
            filters = 4 * width if block == "bottleneck" else width
            unit = _PreActBottleneck if block == "bottleneck" else _PreActBasic
            for index in range(n):
                units.append(unit(channels, filters, stride if index == 0 else 1,
                                  shared=index == 0))
                channels = filters
        self.units = nn.Sequential(*units)
        self.final_bn = nn.BatchNorm2d(channels, eps=1e-5, momentum=0.1)
        self.classifier = nn.Linear(channels, num_classes)
        for m in self.modules():
            if isinstance(m, nn.Conv2d):
                nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")

    def forward(self, x):
        x = self.units(self.stem(x))
        x = torch.relu(self.final_bn(x))
        return self.classifier(torch.flatten(nn.functional.adaptive_avg_pool2d(x, 1), 1))


def count_parameters(model):
    return sum(p.numel() for p in model.parameters() if p.requires_grad)


def build(depth, num_classes=10, expected_parameters=None):
    """The PyTorch net; checks its parameter count against the Keras one."""
    model = PreActResNet(depth, num_classes)
    if expected_parameters is not None and count_parameters(model) != expected_parameters:
        raise RuntimeError(f"PyTorch pre-act ResNet-{depth} has {count_parameters(model):,} "
                           f"parameters, the Keras model {expected_parameters:,}.")
    return model


def measure(depth, batch, steps, warmup, mode, precision, expected_parameters=None):
    """Trains ``depth`` on random CIFAR-sized batches with SGD + momentum:
    build time, time of the first step, then images/s over ``steps`` steps
    after ``warmup`` more; ``precision`` ``"bfloat16"`` (float16 on CUDA)
    runs the forward pass under ``torch.autocast``."""
    if mode not in MODES:
        raise ValueError(f"mode={mode!r} is not valid; expected one of {', '.join(MODES)}.")
    torch.manual_seed(0)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    start = time.perf_counter()
    model = build(depth, expected_parameters=expected_parameters).to(device).train()
    layout = torch.channels_last if mode != "eager" else torch.contiguous_format
    model = model.to(memory_format=layout)
    forward = torch.compile(model) if mode == "compile" else model
    build_s = time.perf_counter() - start
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    loss_fn = nn.CrossEntropyLoss()
    x = torch.randn(batch, 3, 32, 32, device=device).to(memory_format=layout)
    y = torch.randint(0, 10, (batch,), device=device)
    autocast = precision != "float32"
    low = torch.float16 if device == "cuda" else torch.bfloat16

    def step():
        optimizer.zero_grad(set_to_none=True)
        with torch.autocast(device, dtype=low, enabled=autocast):
            loss = loss_fn(forward(x), y)
        loss.backward()
        optimizer.step()
        if device == "cuda":
            torch.cuda.synchronize()

    start = time.perf_counter()
    step()
    first_step_s = time.perf_counter() - start
    for _ in range(warmup):
        step()
    start = time.perf_counter()
    for _ in range(steps):
        step()
    images_per_s = batch * steps / (time.perf_counter() - start)
    memory = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0
    if device == "cuda":
        memory = torch.cuda.max_memory_allocated() / 2 ** 20
    return dict(params=count_parameters(model), build_s=build_s, first_step_s=first_step_s,
                images_per_s=images_per_s, peak_memory_mb=memory,
                device=torch.cuda.get_device_name() if device == "cuda" else "cpu",
                torch=torch.__version__)


def default_mode():
    """PyTorch's fastest mode here: ``torch.compile`` on a GPU, channels-last
    eager on a CPU (where inductor's code measured slower and compiles for
    minutes; docs/performance.md)."""
    return "compile" if torch.cuda.is_available() else "channels_last"


def main():
    parser = argparse.ArgumentParser(description="PyTorch worker of benchmarks.run.")
    parser.add_argument("--depth", type=int, required=True)
    parser.add_argument("--batch", type=int, required=True)
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--mode", default="auto", choices=("auto",) + MODES)
    parser.add_argument("--precision", default="float32", choices=("float32", "bfloat16"))
    parser.add_argument("--expected_parameters", type=int, default=None)
    args = parser.parse_args()
    mode = default_mode() if args.mode == "auto" else args.mode
    result = measure(args.depth, args.batch, args.steps, args.warmup, mode, args.precision,
                     args.expected_parameters)
    print("RESULT " + json.dumps(dict(result, mode=mode)), flush=True)


if __name__ == "__main__":
    main()

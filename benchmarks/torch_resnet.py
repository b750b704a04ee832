"""The CIFAR pre-activation ResNet of He et al. 2016 in PyTorch (the reference).

The same network as ``keras_identity.models.preact_resnet(depth)`` for the
bottleneck depths (9n+2): a 3x3 stem, three stages of n full pre-activation
bottleneck units (Fig. 4(e), widths 16/32/64 with 4x expansion), the first
unit of a stage pre-activating the input it shares with the 1x1 projection
shortcut, stride on the first 1x1 convolution, a final BN-ReLU, global
average pooling and a dense classifier.  :func:`build` checks that the
parameter count equals the Keras model's.  Needs the optional ``bench``
extra (``pip install -e ".[bench]"``).
"""

import torch
from torch import nn


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


class PreActResNet(nn.Module):
    def __init__(self, depth, num_classes=10):
        super().__init__()
        if (depth - 2) % 9:
            raise ValueError(f"depth={depth!r}: the bottleneck CIFAR net needs depth = 9n+2.")
        n = (depth - 2) // 9
        self.stem = nn.Conv2d(3, 16, 3, padding=1, bias=False)
        units, channels = [], 16
        for width, stride in zip((16, 32, 64), (1, 2, 2)):
            filters = 4 * width
            for index in range(n):
                units.append(_PreActBottleneck(channels, filters, stride if index == 0 else 1,
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

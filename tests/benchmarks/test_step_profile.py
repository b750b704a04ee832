"""benchmarks.step_profile: the convolutions it times are the net's."""

import pytest

from benchmarks import run as bench
from benchmarks import step_profile


@pytest.mark.parametrize("depth, count", [(164, 1 + 3 * (4 + 3 * 17)), (110, 1 + 3 * 2 * 18)])
def test_conv_shapes_are_every_convolution_of_the_net(depth, count):
    shapes = step_profile.conv_shapes(depth, batch=1)
    assert sum(shapes.values()) == count
    # Their multiply-adds are the forward pass's, less the classifier's.
    macs = sum(c * (h // s) * (w // s) * k * k * cin * cout
               for (n, h, w, cin, cout, k, s), c in shapes.items())
    classifier = (256 if depth == 164 else 64) * 10
    assert 2 * (macs + classifier) == bench.forward_flops(depth)

"""Named configurations of the papers' networks: ``list_models`` / ``get_model``."""

import functools

from keras_identity.models.highway_net import highway_net
from keras_identity.models.highway_net import plain_net
from keras_identity.models.resnet import preact_resnet
from keras_identity.models.resnet import resnet


def _entries():
    table = {}

    def add(name, builder, description, **kwargs):
        table[name] = (functools.partial(builder, **kwargs), description)

    for depth in (20, 32, 44, 56, 110, 164, 1001, 1202):
        add(f"resnet{depth}", resnet, f"CIFAR-10 ResNet-{depth}, original units "
            "(He et al. 2015; Tables 1-3 baselines)", depth=depth)
    for depth in (20, 32, 44, 56, 110, 164, 1001):
        add(f"preact_resnet{depth}", preact_resnet, f"CIFAR-10 pre-activation ResNet-{depth} "
            "(He et al. 2016, Fig. 4(e), Tables 2-4)", depth=depth)
    add("resnet110_1layer", resnet, "CIFAR-10 ResNet-110 with 1-layer skips, original units "
        "(Table 3)", depth=110, block="single")
    add("preact_resnet110_1layer", preact_resnet, "CIFAR-10 ResNet-110 with 1-layer skips, "
        "pre-activation units (Table 3)", depth=110, block="single")
    for depth in (164, 1001):
        add(f"preact_resnet{depth}_cifar100", preact_resnet, f"CIFAR-100 pre-activation "
            f"ResNet-{depth} (Table 3)", depth=depth, dataset="cifar100")
    for depth in (18, 34, 50, 101, 152, 200):
        add(f"resnet{depth}_imagenet", resnet, f"ImageNet ResNet-{depth}, original units "
            "(He et al. 2015, Table 1; Table 5)", depth=depth, dataset="imagenet")
        add(f"preact_resnet{depth}_imagenet", preact_resnet, f"ImageNet pre-activation "
            f"ResNet-{depth} (He et al. 2016, Table 5)", depth=depth, dataset="imagenet")
    add("resnet52_mnist", resnet, "the lecture notes' MNIST ResNet: conv0 1x1, 25 units of "
        "16 channels (117,802 parameters)", depth=52, dataset="mnist")
    for depth in (10, 20, 50, 100):
        add(f"highway{depth}_mnist", highway_net, f"fully connected highway net, {depth} "
            "layers of 50 blocks (Srivastava et al. 2015, Fig. 1)", depth=depth)
        add(f"plain{depth}_mnist", plain_net, f"fully connected plain net, {depth} layers "
            "of 71 units (Srivastava et al. 2015, Fig. 1)", depth=depth)
    add("highway19_cifar10", highway_net, "convolutional highway net, 19 layers "
        "(Srivastava et al. 2015, Sec. 3.3)", depth=19, dataset="cifar10")
    add("highway50_cifar100", highway_net, "fully connected highway net, 50 layers, "
        "CIFAR-100 (Srivastava et al. 2015, Figs. 2-4)", depth=50, dataset="cifar100",
        architecture="fully_connected")
    return table


_REGISTRY = _entries()


def list_models(with_descriptions=False):
    """Names of the papers' configurations (optionally with descriptions)."""
    if with_descriptions:
        return {name: description for name, (_, description) in _REGISTRY.items()}
    return list(_REGISTRY)


def get_model(name, **kwargs):
    """Builds the named configuration; ``kwargs`` override its arguments.

    ``get_model("preact_resnet164", num_classes=100)``.
    """
    if name not in _REGISTRY:
        raise ValueError(f"name={name!r} is not a known model; expected one of: "
                         f"{', '.join(_REGISTRY)}.")
    builder, _ = _REGISTRY[name]
    return builder(**kwargs)

"""The one registry of models: the builders with their default depths, and the
papers' named configurations (``list_models`` / ``get_model``).

The trainer, the tuner and the benchmarks find models here: a ``model`` is a
builder name (``"preact_resnet"``, with ``depth`` and builder arguments) or a
named configuration (``"preact_resnet164"``).
"""

import dataclasses
import inspect

from keras_identity.data.facts import DATASETS
from keras_identity.layers import BLOCKS
from keras_identity.layers import RECOMPUTE
from keras_identity.layers import SHORTCUTS
from keras_identity.layers import UNITS
from keras_identity.models.highway_net import highway_net
from keras_identity.models.highway_net import plain_net
from keras_identity.models.resnet import check_arguments
from keras_identity.models.resnet import preact_resnet
from keras_identity.models.resnet import resnet
from keras_identity.models.stage import STAGE_MODES


@dataclasses.dataclass(frozen=True)
class Builder:
    """A model builder: its function, its usual depth per dataset, and the
    check of its arguments that does not build (``None``: none cheaper than
    building)."""

    name: str
    function: object
    default_depths: dict
    check: object = None

    @property
    def parameters(self):
        """The keyword arguments the builder takes (besides ``depth``)."""
        if self.function is preact_resnet:
            names = inspect.signature(resnet).parameters
            return tuple(n for n in names if n not in ("depth", "unit"))
        return tuple(n for n in inspect.signature(self.function).parameters if n != "depth")

    @property
    def datasets(self):
        return tuple(self.default_depths)

    @property
    def defaults(self):
        """``{argument: default}`` of the builder (``preact_resnet`` passes
        its arguments to ``resnet``, whose defaults apply)."""
        function = resnet if self.function is preact_resnet else self.function
        return {n: p.default for n, p in inspect.signature(function).parameters.items()}

    @property
    def default_dataset(self):
        return self.defaults["dataset"]


BUILDERS = {b.name: b for b in (
    Builder("resnet", resnet, {"cifar10": 110, "cifar100": 110, "imagenet": 50, "mnist": 52},
            check=check_arguments),
    Builder("preact_resnet", preact_resnet,
            {"cifar10": 164, "cifar100": 164, "imagenet": 200, "mnist": 52},
            check=check_arguments),
    Builder("highway_net", highway_net, {"cifar10": 19, "cifar100": 19, "mnist": 50}),
    Builder("plain_net", plain_net, {"cifar10": 19, "cifar100": 19, "mnist": 50}),
)}


@dataclasses.dataclass(frozen=True)
class NamedModel:
    """A configuration of a paper: a builder and its arguments."""

    name: str
    builder: str
    kwargs: dict
    description: str


def _entries():
    table = {}

    def add(name, builder, description, **kwargs):
        table[name] = NamedModel(name, builder, kwargs, description)

    for depth in (20, 32, 44, 56, 110, 164, 1001, 1202):
        add(f"resnet{depth}", "resnet", f"CIFAR-10 ResNet-{depth}, original units "
            "(He et al. 2015; Tables 1-3 baselines)", depth=depth)
    for depth in (20, 32, 44, 56, 110, 164, 1001):
        add(f"preact_resnet{depth}", "preact_resnet", f"CIFAR-10 pre-activation "
            f"ResNet-{depth} (He et al. 2016, Fig. 4(e), Tables 2-4)", depth=depth)
    add("resnet110_1layer", "resnet", "CIFAR-10 ResNet-110 with 1-layer skips, original "
        "units (Table 3)", depth=110, block="single")
    add("preact_resnet110_1layer", "preact_resnet", "CIFAR-10 ResNet-110 with 1-layer "
        "skips, pre-activation units (Table 3)", depth=110, block="single")
    for depth in (164, 1001):
        add(f"preact_resnet{depth}_cifar100", "preact_resnet", f"CIFAR-100 pre-activation "
            f"ResNet-{depth} (Table 3)", depth=depth, dataset="cifar100")
    for depth in (18, 34, 50, 101, 152, 200):
        add(f"resnet{depth}_imagenet", "resnet", f"ImageNet ResNet-{depth}, original units "
            "(He et al. 2015, Table 1; Table 5)", depth=depth, dataset="imagenet")
        add(f"preact_resnet{depth}_imagenet", "preact_resnet", f"ImageNet pre-activation "
            f"ResNet-{depth} (He et al. 2016, Table 5)", depth=depth, dataset="imagenet")
    add("resnet52_mnist", "resnet", "the lecture notes' MNIST ResNet: conv0 1x1, 25 units "
        "of 16 channels (117,802 parameters)", depth=52, dataset="mnist")
    add("resnet52_mnist_plain", "resnet", "the lecture notes' MNIST ResNet without its "
        "shortcuts (lambda = 0): the plain twin of Veit et al.'s deletion study", depth=52,
        dataset="mnist", shortcut="constant_scaling", shortcut_scale=0.0)
    for depth in (10, 20, 50, 100):
        add(f"highway{depth}_mnist", "highway_net", f"fully connected highway net, {depth} "
            "layers of 50 blocks (Srivastava et al. 2015, Fig. 1)", depth=depth)
        add(f"plain{depth}_mnist", "plain_net", f"fully connected plain net, {depth} layers "
            "of 71 units (Srivastava et al. 2015, Fig. 1)", depth=depth)
    for width in (16, 32):
        add(f"highway10_conv{width}_mnist", "highway_net", f"convolutional highway net, 9 "
            f"convolutional layers of {width} maps + softmax (Srivastava et al. 2015, Table 1)",
            depth=10, architecture="convolutional", width=width)
    add("plain10_conv_mnist", "plain_net", "convolutional plain net, 9 convolutional layers "
        "of 23 maps + softmax (the plain counterpart of highway10_conv16_mnist)", depth=10,
        architecture="convolutional")
    add("highway19_cifar10", "highway_net", "convolutional highway net, 19 layers "
        "(Srivastava et al. 2015, Sec. 3.3)", depth=19, dataset="cifar10")
    add("highway50_cifar100", "highway_net", "fully connected highway net, 50 layers, "
        "CIFAR-100 (Srivastava et al. 2015, Figs. 2-4)", depth=50, dataset="cifar100",
        architecture="fully_connected")
    return table


NAMED_MODELS = _entries()


def list_models(with_descriptions=False):
    """Names of the papers' configurations (optionally with descriptions)."""
    if with_descriptions:
        return {name: entry.description for name, entry in NAMED_MODELS.items()}
    return list(NAMED_MODELS)


def _unknown(name, argument="model"):
    return ValueError(f"{argument}={name!r} is not valid; expected a builder ("
                      f"{', '.join(BUILDERS)}) or a named configuration "
                      f"(ki.models.list_models(), e.g. preact_resnet164).")


def builder_of(name):
    """The :class:`Builder` of a builder or named configuration ``name``."""
    if name in BUILDERS:
        return BUILDERS[name]
    if name in NAMED_MODELS:
        return BUILDERS[NAMED_MODELS[name].builder]
    raise _unknown(name)


def resolve(name, depth=None, dataset=None, **kwargs):
    """``(builder, arguments)`` for model ``name``: a named configuration's
    arguments overridden by the given ones; for a builder, ``depth`` defaults
    to its usual depth for ``dataset``."""
    builder = builder_of(name)
    arguments = dict(NAMED_MODELS[name].kwargs) if name in NAMED_MODELS else {}
    if dataset is not None:
        arguments["dataset"] = dataset
    if depth is not None:
        arguments["depth"] = depth
    elif "depth" not in arguments:
        dataset = arguments.get("dataset", builder.default_dataset)
        arguments["depth"] = builder.default_depths.get(dataset)
    arguments.update(kwargs)
    return builder, arguments


def non_default_arguments(builder, arguments):
    """``arguments`` of ``builder`` (a :class:`Builder`) without those equal
    to its defaults (``depth`` and ``dataset`` are always kept)."""
    defaults = builder.defaults
    return {k: v for k, v in arguments.items()
            if k not in defaults or v != defaults[k] or k in ("depth", "dataset")}


def configuration_name(builder, arguments):
    """The named configuration of builder ``builder`` (a name) whose arguments
    are ``arguments`` (defaults left out), or ``None``."""
    def key(given):
        return non_default_arguments(
            BUILDERS[builder], {"dataset": BUILDERS[builder].default_dataset, **given})

    wanted = key(arguments)
    for name, entry in NAMED_MODELS.items():
        if entry.builder == builder and key(resolve(name)[1]) == wanted:
            return name
    return None


def check_model_kwargs(name, depth=None, dataset=None, **kwargs):
    """Validates the arguments of model ``name`` without building it.

    Raises:
        ValueError: one line naming the argument: one the builder does not
            take (and the builders that do), or a value it refuses.
    """
    builder, arguments = resolve(name, depth, dataset, **kwargs)
    if arguments.get("dataset", builder.default_dataset) not in builder.datasets:
        raise ValueError(f"dataset={arguments['dataset']!r} is not valid for {name!r}; "
                         f"expected one of: {', '.join(repr(d) for d in builder.datasets)}.")
    for key, value in kwargs.items():
        if key not in builder.parameters:
            others = [b.name for b in BUILDERS.values() if key in b.parameters]
            hint = (f"; it is an argument of {', '.join(others)} (e.g. --model={others[0]} "
                    f"--{key}={value})") if others else (
                f"; {builder.name} takes: {', '.join(builder.parameters)}")
            raise ValueError(f"{key}={value!r} does not apply to {name!r}{hint}.")
    if builder.check is not None:
        try:
            builder.check(builder.function, **arguments)
        except TypeError as error:
            raise ValueError(f"model {name!r}: {error}") from None
    return builder, arguments


# The command-line flags that set builder arguments, declared here once:
# name -> (type, choices, help); the programs define them from this table.
MODEL_FLAGS = {
    "unit": (str, UNITS, "Residual unit ordering (Fig. 4)."),
    "shortcut": (str, SHORTCUTS, "Shortcut (Fig. 2)."),
    "block": (str, BLOCKS, "Residual block."),
    "gate_bias_init": (float, None, "Initial gate bias: b_g of gated shortcuts, b_T of "
                                    "highway layers."),
    "shortcut_scale": (float, None, "lambda of --shortcut=constant_scaling (0: a plain "
                                    "net)."),
    "scale_residual": (bool, None, "With constant_scaling, scale F by 1 - lambda (Table 1's "
                                   "frozen gating)."),
    "shortcut_dropout_rate": (float, None, "Drop rate of --shortcut=dropout."),
    "stochastic_depth_rate": (float, None, "Stochastic depth rate of the last unit."),
    "stage_mode": (str, STAGE_MODES, "ResNet stages as one layer per unit (unrolled) or one "
                                     "looped layer (scan: start-up flat in depth); default "
                                     "auto, which loops stages of 12+ units."),
    "recompute": (str, RECOMPUTE, "What the looped units compute again in the backward pass "
                                  "instead of keeping: nothing, the BN-ReLU outputs (half the "
                                  "activation memory) or all but each unit's input (e.g. "
                                  "ResNet-1001 at batch 128)."),
}
# The argument a flag sets where a builder names it otherwise (the highway
# paper's b_T).
_FLAG_ARGUMENTS = {("highway_net", "gate_bias_init"): "transform_bias_init"}


def kwargs_from_flags(name, **flags):
    """Builder arguments of model ``name`` from the values of
    :data:`MODEL_FLAGS` (``None``: not given), e.g. ``--gate_bias_init``
    is b_g of a gated ResNet and b_T (``transform_bias_init``) of a highway
    net."""
    builder = builder_of(name)
    return {_FLAG_ARGUMENTS.get((builder.name, flag), flag): value
            for flag, value in flags.items() if value is not None}


def get_model(name, **kwargs):
    """Builds the named configuration (or builder); ``kwargs`` override its
    arguments.

    ``get_model("preact_resnet164", num_classes=100)``.
    """
    if name not in NAMED_MODELS and name not in BUILDERS:
        raise _unknown(name, "name")
    builder, arguments = resolve(name, **kwargs)
    return builder.function(**arguments)


assert set(DATASETS) >= {d for b in BUILDERS.values() for d in b.datasets}

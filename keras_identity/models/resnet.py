"""Residual networks for CIFAR, ImageNet and MNIST, as functional Keras models.

The architectures follow the authors' code (summarised in
``../shared/README.md``) and the papers' tables:

* CIFAR (He et al. 2015, Sec. 4.2; He et al. 2016, appendix): a 3x3 stem
  convolution, three stages of n units at 32x32, 16x16 and 8x8 with 16, 32
  and 64 channels (bottleneck units: widths 16/32/64, outputs 64/128/256),
  global average pooling and a fully connected classifier.  Depth 6n+2 with
  basic units, 9n+2 with bottleneck units, 3n+2 with single-layer units.
* ImageNet (He et al. 2015, Table 1; ResNet-200 of He et al. 2016, Table
  5): 7x7/2 stem, 3x3/2 max pool, four stages {64, 128, 256, 512} wide.
* MNIST (the lecture notes' ResNet): a 1x1 ``conv0`` with 16 channels, one
  stage of n units of 16 channels with conv biases, average pooling and a
  fully connected layer.  25 basic units (depth 52) give 117,802 parameters.

For the pre-activation orderings the stem convolution of CIFAR and MNIST nets
is bare, the first unit of every stage applies its BN-ReLU before the split
(and projects the pre-activated input), and a final BN-ReLU follows the last
unit.  ImageNet stems keep their BN-ReLU and max pool, so the very first unit
omits its pre-activation (fb.resnet.torch's ``preresnet.lua``).
"""

import inspect
import types

import keras

from keras_identity import _checks
from keras_identity import initializers
from keras_identity import recipes
from keras_identity.data.facts import DATASETS
from keras_identity.data.facts import IMAGE_SHAPES
from keras_identity.data.facts import NUM_CLASSES
from keras_identity.data.normalization import MODES as NORMALIZATION_MODES
from keras_identity.data.normalization import Normalization
from keras_identity.layers.fused_batch_normalization import FusedBatchNormalization
from keras_identity.layers.preprocessing import ImageNormalization
from keras_identity.layers.residual import shortcuts
from keras_identity.layers.residual.blocks import BLOCKS
from keras_identity.layers.residual.blocks import BOTTLENECK_EXPANSION
from keras_identity.layers.residual.blocks import LAYERS_PER_UNIT
from keras_identity.layers.residual.orderings import PREACTIVATION_UNITS
from keras_identity.layers.residual.orderings import UNITS
from keras_identity.models.stage import check_stage_mode
from keras_identity.models.stage import residual_stage
from keras_identity.models import pretrained
from keras_identity.models.weights import check_weights_path
from keras_identity.models.weights import load_weights

POOLINGS = ("avg", "max")
_FORM_EXAMPLES = {
    ("cifar", "basic"): "6n+2 (e.g. 20, 32, 44, 56, 110, 1202)",
    ("cifar", "bottleneck"): "9n+2 (e.g. 164, 1001)",
    ("cifar", "single"): "3n+2 (e.g. 110 for Table 3's '1-layer skip')",
    ("mnist", "basic"): "2n+2 (e.g. 52: the lecture's 25 units)",
    ("mnist", "bottleneck"): "3n+2",
    ("mnist", "single"): "n+2",
}
IMAGENET_DEPTHS = {
    18: ("basic", (2, 2, 2, 2)),
    34: ("basic", (3, 4, 6, 3)),
    50: ("bottleneck", (3, 4, 6, 3)),
    101: ("bottleneck", (3, 4, 23, 3)),
    152: ("bottleneck", (3, 8, 36, 3)),
    200: ("bottleneck", (3, 24, 36, 3)),
}
_WIDTHS = {"cifar": (16, 32, 64), "imagenet": (64, 128, 256, 512), "mnist": (16,)}
_STRIDES = {"cifar": (1, 2, 2), "imagenet": (1, 2, 2, 2), "mnist": (1,)}


def _family(dataset):
    return "cifar" if dataset.startswith("cifar") else dataset


def resolve_depth(depth, dataset="cifar10", block=None):
    """Returns ``(block, units_per_stage)`` for a ResNet of ``depth`` layers.

    Depth counts the weight layers: the stem convolution, the units' layers
    and the classifier.  Without ``block``, CIFAR and MNIST nets use the
    papers' choice (basic units below 164 layers, bottleneck units from 164
    on, e.g. 20/32/44/56/110 basic, 164/1001 bottleneck) and fall back to the
    other form when only that one fits.

    Raises:
        ValueError: naming ``depth`` and the valid forms when none fits.
    """
    _checks.check_positive_int("depth", depth)
    _checks.check_choice("dataset", dataset, DATASETS)
    if block is not None:
        _checks.check_choice("block", block, BLOCKS)
    family = _family(dataset)
    if family == "imagenet":
        if depth not in IMAGENET_DEPTHS:
            raise ValueError(f"depth={depth} is not valid for ImageNet ResNets; expected one "
                             f"of {', '.join(map(str, IMAGENET_DEPTHS))}.")
        expected, units = IMAGENET_DEPTHS[depth]
        if block is not None and block != expected:
            raise ValueError(f"block={block!r} does not match ImageNet ResNet-{depth}, "
                             f"which is built from {expected!r} units (He et al. 2015, "
                             f"Table 1); leave block=None.")
        return expected, units

    stages = len(_WIDTHS[family])

    def units_for(form):
        per_stage, rest = divmod(depth - 2, stages * LAYERS_PER_UNIT[form])
        return per_stage if rest == 0 and per_stage >= 1 else None

    if block is not None:
        n = units_for(block)
        if n is None:
            raise ValueError(f"depth={depth} is not valid for a {dataset} ResNet with "
                             f"block={block!r}: it needs depth = "
                             f"{_FORM_EXAMPLES[(family, block)]}.")
        return block, (n,) * stages
    preferred = "bottleneck" if depth >= 164 and family == "cifar" else "basic"
    for form in (preferred, "bottleneck" if preferred == "basic" else "basic"):
        n = units_for(form)
        if n is not None:
            return form, (n,) * stages
    forms = "; ".join(f"{form} units need depth = {_FORM_EXAMPLES[(family, form)]}"
                      for form in BLOCKS)
    raise ValueError(f"depth={depth} is not valid for {dataset} ResNets: {forms}.")


def check_input_shape(input_shape, dataset):
    """``input_shape`` as a tuple (the dataset's image shape when ``None``);
    raises ``ValueError`` in one line for a shape a builder cannot take."""
    if input_shape is None:
        return IMAGE_SHAPES[dataset]
    shape = tuple(input_shape)
    if len(shape) != 3 or shape[-1] is None or not all(
            d is None or (isinstance(d, int) and d > 0) for d in shape):
        raise ValueError(f"input_shape={input_shape!r} is not valid; expected "
                         f"(height, width, channels) with a known number of channels, "
                         f"e.g. {IMAGE_SHAPES[dataset]}.")
    return shape


def resolve_normalization(include_preprocessing, normalization, *, dataset, builder,
                          architecture=None):
    """The :class:`Normalization` of the model's preprocessing layer, or
    ``None`` without ``include_preprocessing``.

    ``normalization`` is a mode, a :class:`Normalization` with statistics, or
    its ``to_dict()``; ``None`` is the mode of the builder's recipe for the
    dataset (ImageNet: per-channel with ImageNet's statistics).  A mode whose
    statistics are not given leaves the layer to be adapted.
    """
    if include_preprocessing not in (True, False):
        raise ValueError(f"include_preprocessing={include_preprocessing!r} is not valid; "
                         f"expected True or False.")
    if not include_preprocessing:
        if normalization is not None:
            shown = (repr(normalization.mode) if isinstance(normalization, Normalization)
                     else repr(normalization))
            raise ValueError(f"normalization={shown} applies only with "
                             f"include_preprocessing=True (the model then takes pixel values "
                             f"in [0, 255]).")
        return None
    if normalization is None:
        normalization = recipes.RECIPES[recipes.default_recipe(
            builder, dataset, architecture)].normalization
    if isinstance(normalization, dict):
        try:
            normalization = Normalization.from_dict(normalization)
        except KeyError:
            raise ValueError(f"normalization={normalization!r} is not valid; expected a "
                             f"mode, a Normalization or its to_dict().") from None
    if isinstance(normalization, str):
        _checks.check_choice("normalization", normalization, NORMALIZATION_MODES)
        normalization = (Normalization.imagenet() if normalization == "per_channel"
                         and dataset == "imagenet" else Normalization(normalization))
    if not isinstance(normalization, Normalization):
        raise ValueError(f"normalization={normalization!r} is not valid; expected one of "
                         f"{', '.join(repr(m) for m in NORMALIZATION_MODES)}, a "
                         f"keras_identity.data.Normalization or its to_dict().")
    return normalization


def input_normalization(inputs, normalization):
    """The model's first layer for a :func:`resolve_normalization` result: an
    :class:`ImageNormalization` named ``"preprocessing"`` (float32)."""
    if normalization is None:
        return inputs
    return ImageNormalization(normalization.mode, normalization.mean, normalization.std,
                              dtype="float32", name="preprocessing")(inputs)


def _fits(size, family, strided_kernel):
    """Whether ``size`` pixels pass every strided convolution (each needs at
    least its kernel's size of input)."""
    if family == "imagenet":
        size = (size + 6 - 7) // 2 + 1   # 7x7/2 stem, padded by 3
        size = (size + 2 - 3) // 2 + 1   # 3x3/2 max pool, padded by 1
    for stride in _STRIDES[family]:
        if stride > 1:
            if size < strided_kernel:
                return False
            size = -(-size // stride)
    return size >= 1


def _check_input_size(input_shape, family, block, stride_on_1x1, depth):
    strided_kernel = 1 if block == "bottleneck" and stride_on_1x1 else 3
    minimum = next(s for s in range(1, 4096) if _fits(s, family, strided_kernel))
    small = [d for d in input_shape[:2] if d is not None and d < minimum]
    if small:
        raise ValueError(f"input_shape={tuple(input_shape)!r} is too small for this "
                         f"{family} ResNet-{depth}: its strided convolutions need height and "
                         f"width of at least {minimum}.")


def check_top(include_top, pooling, num_classes, classifier_activation="softmax"):
    """``pooling``, ``num_classes`` and ``classifier_activation`` apply to one
    of the two model tops."""
    if include_top not in (True, False):
        raise ValueError(f"include_top={include_top!r} is not valid; expected True or False.")
    if pooling is not None:
        _checks.check_choice("pooling", pooling, POOLINGS)
        if include_top:
            raise ValueError(f"pooling={pooling!r} applies only with include_top=False (the "
                             f"classifier pools by global average itself).")
    if num_classes is not None and not include_top:
        raise ValueError(f"num_classes={num_classes!r} applies only with include_top=True "
                         f"(without the classifier the model returns features).")
    if classifier_activation != "softmax" and not include_top:
        raise ValueError(f"classifier_activation={classifier_activation!r} applies only with "
                         f"include_top=True (without the classifier the model returns "
                         f"features).")


def pooled_features(x, pooling):
    """The model's output without its classifier: the last feature map, or
    its global average (``"avg"``) or maximum (``"max"``) per channel."""
    if pooling == "avg":
        return keras.layers.GlobalAveragePooling2D(name="avg_pool")(x)
    if pooling == "max":
        return keras.layers.GlobalMaxPooling2D(name="max_pool")(x)
    return x


def _classifier(x, num_classes, classifier_activation, kernel_regularizer, seed):
    x = keras.layers.GlobalAveragePooling2D(name="avg_pool")(x)
    # Logits and probabilities stay in float32 under mixed precision.
    return keras.layers.Dense(
        num_classes, activation=classifier_activation, dtype="float32",
        kernel_initializer=initializers.torch_linear(seed),
        kernel_regularizer=kernel_regularizer, name="predictions")(x)


def _bn(name, momentum, epsilon):
    return FusedBatchNormalization(momentum=momentum, epsilon=epsilon, name=name)


def default_stride_on_1x1(dataset, unit):
    """Where a bottleneck strides by default (``stride_on_1x1=None``), as the
    released models do: the 3x3 (False) for ImageNet pre-activation nets
    (Table 5's, fb.resnet.torch), the first 1x1 (True) otherwise."""
    return not (_family(dataset) == "imagenet" and unit in PREACTIVATION_UNITS)


def _resolve_arguments(depth, *, dataset, unit, shortcut, block, num_classes, input_shape,
                       dimension_shortcut, shortcut_scale, scale_residual, gate_bias_init,
                       shortcut_dropout_rate, stochastic_depth_rate, stage_mode, recompute,
                       stride_on_1x1=None, classifier_activation="softmax",
                       include_top=True, include_preprocessing=False, normalization=None,
                       pooling=None, weights=None):
    """Validates :func:`resnet`'s arguments (the one place they are checked)
    and resolves their defaults."""
    _checks.check_choice("dataset", dataset, DATASETS)
    _checks.check_choice("unit", unit, UNITS)
    shortcut = shortcuts.get(
        shortcut, shortcut_scale=shortcut_scale, scale_residual=scale_residual,
        gate_bias_init=gate_bias_init, shortcut_dropout_rate=shortcut_dropout_rate)
    block, units = resolve_depth(depth, dataset, block)
    family = _family(dataset)
    if block == "single" and family == "imagenet":
        raise ValueError("block='single' is not valid for ImageNet ResNets; expected "
                         "'basic' (18, 34) or 'bottleneck' (50 and deeper).")
    if dimension_shortcut is None:
        dimension_shortcut = "A" if family != "imagenet" and block != "bottleneck" else "B"
    _checks.check_choice("dimension_shortcut", dimension_shortcut,
                         shortcuts.DIMENSION_SHORTCUTS)
    given_classes = num_classes
    num_classes = NUM_CLASSES[dataset] if num_classes is None else num_classes
    _checks.check_positive_int("num_classes", num_classes)
    if num_classes == 1 and classifier_activation == "softmax" and include_top:
        raise ValueError("num_classes=1 is not valid with classifier_activation='softmax' "
                         "(a softmax over one class is always 1); use num_classes >= 2, or "
                         "classifier_activation='sigmoid' for a binary output.")
    input_shape = check_input_shape(input_shape, dataset)
    if stride_on_1x1 is None:
        stride_on_1x1 = default_stride_on_1x1(dataset, unit)
    _check_input_size(input_shape, family, block, stride_on_1x1, depth)
    _checks.check_range("stochastic_depth_rate", stochastic_depth_rate, 0.0, 1.0,
                        high_inclusive=False)
    stage_mode, recompute = check_stage_mode(stage_mode, recompute)
    normalization = resolve_normalization(include_preprocessing, normalization,
                                          dataset=dataset, builder="resnet")
    check_top(include_top, pooling, given_classes, classifier_activation)
    check_weights_path(weights)
    if keras.config.image_data_format() != "channels_last":
        raise ValueError("keras_identity models need keras.config.image_data_format() == "
                         "'channels_last'.")
    return types.SimpleNamespace(
        block=block, units=units, family=family, dimension_shortcut=dimension_shortcut,
        num_classes=num_classes, input_shape=input_shape, shortcut=shortcut.name,
        shortcut_args=shortcut.config(),
        stage_mode=stage_mode, recompute=recompute, normalization=normalization,
        stride_on_1x1=bool(stride_on_1x1))


def _layout(arguments):
    """What ``arguments`` of :func:`resnet` build, defaults resolved (block, shortcuts,
    stride, classes, input): what a preset's arguments are compared by."""
    a = _resolve_arguments(**_checked(arguments))
    return {"block": a.block, "dimension_shortcut": a.dimension_shortcut,
            "stride_on_1x1": a.stride_on_1x1, "num_classes": a.num_classes,
            "input_shape": list(a.input_shape), "shortcut": a.shortcut, **a.shortcut_args}


def check_arguments(builder, *args, **kwargs):
    """Validates the arguments of ``builder`` (:func:`resnet` or
    :func:`preact_resnet`) as building would, without building.

    Raises:
        TypeError: an argument the builder does not take.
        ValueError: a value the builder refuses (the same message).
    """
    if builder is preact_resnet:
        if "unit" in kwargs:
            preact_resnet(unit=kwargs["unit"])  # raises the builder's message
        kwargs = dict(kwargs, unit="full_preactivation")
    bound = inspect.signature(resnet).bind(*args, **kwargs)
    bound.apply_defaults()
    arguments = dict(bound.arguments)
    _resolve_arguments(**_checked(arguments))
    pretrained.weights_file("resnet", arguments["weights"], arguments,
                            pretrained.defaults_of(resnet), resolve=_layout)


def _checked(arguments):
    """The builder's ``arguments`` that :func:`_resolve_arguments` checks."""
    names = inspect.signature(_resolve_arguments).parameters
    return {k: v for k, v in arguments.items() if k in names}


def resnet(depth=110, *, dataset="cifar10", unit="original", shortcut="identity",
           block=None, num_classes=None, input_shape=None, dimension_shortcut=None,
           shortcut_scale=None, scale_residual=None, gate_bias_init=None,
           shortcut_dropout_rate=None, stochastic_depth_rate=0.0, stride_on_1x1=None,
           include_top=True, classifier_activation="softmax", kernel_regularizer=None,
           bn_momentum=0.9, bn_epsilon=1e-5, stage_mode="auto", recompute="none", seed=None,
           include_preprocessing=False, normalization=None, pooling=None, weights=None,
           name=None):
    """Builds a ResNet of ``depth`` layers from :class:`ResidualUnit` layers.

    Args:
        depth: number of weight layers; CIFAR 6n+2 (basic), 9n+2 (bottleneck), 3n+2
            (single); ImageNet 18, 34, 50, 101, 152, 200; MNIST 2n+2 (basic).
        dataset: ``"cifar10"``, ``"cifar100"``, ``"imagenet"`` or ``"mnist"``; sets the
            architecture family, input shape and number of classes.
        unit: Fig. 4 ordering (``"original"`` ... ``"full_preactivation"``).
        shortcut: Fig. 2 shortcut: a name (``"identity"`` ... ``"dropout"``) or an object of
            :mod:`keras_identity.layers.shortcuts` carrying its arguments, e.g.
            ``ExclusiveGating(gate_bias_init=-6.0)``.
        block: ``"basic"``, ``"bottleneck"`` or ``"single"``; ``None`` follows the papers
            (see :func:`resolve_depth`).
        num_classes: classifier outputs (default: the dataset's classes).
        input_shape: ``(height, width, channels)``; ImageNet nets are fully convolutional,
            e.g. ``(320, 320, 3)`` for Table 5's test crop.
        dimension_shortcut: ``"A"`` (zero padding) or ``"B"`` (projection) for units that
            change shape; default A for basic/single CIFAR and MNIST nets (He et al. 2015,
            Sec. 4.2), B otherwise.
        shortcut_scale, scale_residual, gate_bias_init, shortcut_dropout_rate: parameters of
            the shortcut variants (lambda and frozen gating of ``constant_scaling``, b_g of
            the gated shortcuts, the rate of ``dropout``), see
            :mod:`keras_identity.layers.residual.shortcuts`; one given to a shortcut it does
            not apply to is refused.
        stochastic_depth_rate: drop rate of the last unit; unit l of L drops with
            ``rate * l / L`` (Huang et al.'s linear decay).  0 disables.
        stride_on_1x1: bottleneck stride on the first 1x1 convolution (True) or on the
            3x3 (False); ``None`` (default) strides where the released models do: the
            3x3 for ImageNet pre-activation nets (Table 5's ResNet-200, released with
            fb.resnet.torch, whose weights load as they are), the first 1x1 otherwise
            (the authors' CIFAR code, MSRA's released ImageNet ResNets).
        include_top: add global average pooling and the classifier; without it the model
            returns features (see ``pooling``).
        classifier_activation: activation of the classifier (``"softmax"``; ``None`` returns
            logits).
        kernel_regularizer: regularizer of every kernel (e.g. weight decay).
        bn_momentum, bn_epsilon: BatchNormalization settings (Torch's 0.9 and 1e-5, as the
            authors' code).
        stage_mode: how each stage's units are realised: ``"unrolled"`` (one
            :class:`ResidualUnit` layer per unit), ``"scan"`` (the units after the first in
            one :class:`ResidualStack` that loops over stacked weights: build, trace and XLA
            compile time stay flat in depth) or ``"auto"``, the default (scan for stages of
            at least 12 units, whatever the shortcut: CIFAR ResNet-110, -164, -1001, the
            long third stage of ImageNet ResNet-101/152/200; unrolled otherwise).  The forms
            compute the same function and exchange weights with :func:`transfer_weights`
            (``keras_identity.models.unroll`` gives a looped model's unrolled twin).
        recompute: what the looped units compute again in the backward pass instead of
            keeping it, so ResNet-1001 trains at larger batches in the same memory:
            ``"none"``; ``"bn_relu"``, the BN-ReLU outputs (half the kept feature maps of a
            pre-activation bottleneck, for one BN-ReLU pass per BN); ``"unit"``, everything
            but each unit's input (for one more forward pass).  The README's Performance
            section has the measurements.  Other than ``"none"`` it loops every stage
            (``stage_mode="unrolled"`` is then an error).
        seed: seed for initialisers and random masks (reproducible builds).
        include_preprocessing: put the input normalisation in the model (an
            :class:`ImageNormalization` layer named ``"preprocessing"``): the model then
            takes pixel values in [0, 255] in training, `.keras` files and exports.  Without
            it the model takes normalised inputs.
        normalization: with ``include_preprocessing``, a mode (``"per_pixel_mean"``,
            ``"per_channel"``, ``"scale"``) or a :class:`keras_identity.data.Normalization`
            with the training set's statistics; ``None`` is the recipe's mode (CIFAR:
            per-pixel mean; ImageNet: per-channel with ImageNet's statistics).  A mode given
            without statistics needs
            ``model.get_layer("preprocessing").adapt(train_images)``.
        pooling: with ``include_top=False``: ``None`` (the last feature map, after the final
            BN-ReLU of pre-activation nets), ``"avg"`` or ``"max"`` (global pooling to one
            vector per image).
        weights: a preset's name (``"mnist"``: :func:`keras_identity.models.presets`
            lists them with their test errors and cards; a name with no preset for these
            arguments is refused), a ``.keras`` file of a trained model (its weights are
            copied by layer and unit name, across stage modes; the classifier is left out
            when ``include_top=False``) or a ``.weights.h5`` file of this very
            architecture.
        name: model name (default e.g. ``"preact_resnet164"``).

    Returns:
        A functional ``keras.Model``.
    """
    given = dict(locals())
    a = _resolve_arguments(**_checked(given))  # every argument it checks, by name
    weights = pretrained.weights_file("resnet", weights, given, pretrained.defaults_of(resnet),
                                      resolve=_layout)
    block, units, family, dimension_shortcut = a.block, a.units, a.family, a.dimension_shortcut
    num_classes, input_shape, shortcut_args = a.num_classes, a.input_shape, a.shortcut_args
    stage_mode, recompute = a.stage_mode, a.recompute

    preact = unit in PREACTIVATION_UNITS
    kernel_init = initializers.he_normal_fan_out(seed)
    use_bias = family == "mnist"
    unit_kwargs = dict(
        block=block, unit=unit, shortcut=a.shortcut, dimension_shortcut=dimension_shortcut,
        stride_on_1x1=a.stride_on_1x1, **shortcut_args, use_bias=use_bias,
        bn_momentum=bn_momentum, bn_epsilon=bn_epsilon, kernel_initializer=kernel_init,
        kernel_regularizer=kernel_regularizer, seed=seed)

    inputs = keras.Input(shape=input_shape, name="images")
    x = input_normalization(inputs, a.normalization)
    widths = _WIDTHS[family]
    conv = dict(use_bias=use_bias, kernel_initializer=kernel_init,
                kernel_regularizer=kernel_regularizer)
    if family == "imagenet":
        x = keras.layers.ZeroPadding2D(3, name="stem_pad")(x)
        x = keras.layers.Conv2D(widths[0], 7, strides=2, name="stem_conv", **conv)(x)
        x = _bn("stem_bn", bn_momentum, bn_epsilon)(x)
        x = keras.layers.ReLU(name="stem_relu")(x)
        x = keras.layers.ZeroPadding2D(1, name="stem_pool_pad")(x)
        x = keras.layers.MaxPooling2D(3, strides=2, name="stem_pool")(x)
        first_preactivation = ["none"] + ["shared"] * (len(widths) - 1)
    else:
        kernel = 1 if family == "mnist" else 3
        x = keras.layers.Conv2D(widths[0], kernel, padding="same", name="stem_conv",
                                **conv)(x)
        if not preact:
            if family == "cifar":
                x = _bn("stem_bn", bn_momentum, bn_epsilon)(x)
            x = keras.layers.ReLU(name="stem_relu")(x)
        first_preactivation = ["shared"] * len(widths)

    total_units = sum(units)
    done = 0
    expansion = BOTTLENECK_EXPANSION if block == "bottleneck" else 1
    for index, (width, stride, n) in enumerate(zip(widths, _STRIDES[family], units)):
        rates = None
        if stochastic_depth_rate:
            rates = [stochastic_depth_rate * (done + i + 1) / total_units for i in range(n)]
        first = {"preactivation": first_preactivation[index]} if preact else None
        x = residual_stage(x, stage=index + 1, num_units=n, filters=width * expansion,
                           strides=stride, unit_kwargs=unit_kwargs,
                           first_unit_kwargs=first, stochastic_depth_rates=rates,
                           stage_mode=stage_mode, recompute=recompute)
        done += n
    if preact:
        if unit == "full_preactivation":
            x = _bn("final_bn", bn_momentum, bn_epsilon)(x)
        x = keras.layers.ReLU(name="final_relu")(x)
    if include_top:
        x = _classifier(x, num_classes, classifier_activation, kernel_regularizer, seed)
    else:
        x = pooled_features(x, pooling)
    if name is None:
        name = f"{'preact_' if unit == 'full_preactivation' else ''}resnet{depth}"
        name += "" if dataset == "cifar10" else f"_{dataset}"
    model = keras.Model(inputs, x, name=name)
    if weights is not None:
        load_weights(model, weights)
    return model


def preact_resnet(depth=164, **kwargs):
    """The full pre-activation ResNet of He et al. 2016 (Fig. 4(e), Eqn. 9).

    ``preact_resnet(depth=1001)`` is the CIFAR-10 ResNet-1001 (10,327,706
    trainable parameters); ``preact_resnet(200, dataset="imagenet")`` the
    ImageNet ResNet-200 of Table 5.  Arguments are those of :func:`resnet`
    except ``unit``.
    """
    if "unit" in kwargs:
        raise ValueError("preact_resnet() always uses unit='full_preactivation'; call "
                         "resnet(unit=...) for the other orderings of Fig. 4.")
    return resnet(depth, unit="full_preactivation", **kwargs)

"""Highway networks and their plain counterparts (Srivastava et al. 2015).

* Fully connected nets of the optimisation study (Sec. 3.1, Fig. 1): "each
  layer has 50 blocks for highway networks and 71 units for plain networks,
  yielding roughly identical numbers of parameters (~5000) per layer.  The
  first layer is a fully connected plain layer followed by 9, 19, 49, or 99
  fully connected plain or highway layers", then a softmax layer.  ``depth``
  counts those hidden layers (10, 20, 50, 100).
* Convolutional MNIST nets (Sec. 3.2, Table 1): "10-layer convolutional
  highway networks ... each with 9 convolutional layers followed by a softmax
  output.  The number of filter maps (width) was set to 16 and 32 for all the
  layers."  The paper does not say more; our choices: a plain 3x3 stem
  convolution, ``depth - 2`` 3x3 highway convolutions in three stages with
  2x2 max pooling between them (28, 14, 7 pixels), global average pooling
  and a softmax layer.  Width 16 gives 37,450 parameters, width 32 148,618
  (the paper's ~39K and ~151K: -4.0% and -1.6%).
* Convolutional CIFAR nets (Secs. 3.3): a plain stem convolution, three stages
  of 3x3 highway convolutions separated by max pooling and a plain
  convolution that doubles the width ("a plain layer to change
  dimensionality"), and a 1x1 convolution with global average pooling in
  place of a fully connected classifier (Sec. 3.3.2).  The paper does not
  list the layer widths of its Fitnet-derived nets, so these are a design of
  ours: widths (32, 64, 128) give 2.03M parameters at depth 19 (the paper's
  19-layer Highway B has ~2.3M).
"""

import math

import keras

from keras_identity import _checks
from keras_identity.layers.highway import CARRY_GATES
from keras_identity.layers.highway import Highway
from keras_identity.layers.highway import HighwayConv2D
from keras_identity.data.facts import NUM_CLASSES
from keras_identity.models.resnet import _check_input_shape
from keras_identity.models.resnet import check_top
from keras_identity.models.resnet import input_normalization
from keras_identity.models.resnet import pooled_features
from keras_identity.models.resnet import resolve_normalization
from keras_identity.models.weights import check_weights_path
from keras_identity.models.weights import load_weights

DATASETS = ("mnist", "cifar10", "cifar100")  # the highway paper's (no ImageNet)
ARCHITECTURES = ("fully_connected", "convolutional")
ACTIVATIONS = ("relu", "tanh")
HIGHWAY_WIDTH = 50
PLAIN_WIDTH = 71
CONV_WIDTHS = (32, 64, 128)
MNIST_CONV_WIDTH = 16  # Table 1's nets: 16 or 32 filter maps in every layer


def guideline_transform_bias(depth):
    """The paper's suggested initial transform-gate bias for a depth (Sec. 2.2).

    -1, -2 and -3 for depths of about 10, 20 and 30: -1 up to 10 layers, -2
    up to 20, -3 beyond.
    """
    return -1.0 if depth <= 10 else -2.0 if depth <= 20 else -3.0


def _stage_sizes(layers, stages=3):
    base, extra = divmod(layers, stages)
    return [base + (1 if i < extra else 0) for i in range(stages)]


def _conv_stages(x, widths, sizes, *, highway, transitions, gate, conv):
    """Three stages of 3x3 highway (or plain) convolutions, ``sizes[s]`` in
    stage ``s`` with ``widths[s]`` maps, 2x2 max pooling before stages 2
    and 3 (followed by a plain convolution to the new width with
    ``transitions``)."""
    kind = "highway" if highway else "plain"
    for stage, (w, n) in enumerate(zip(widths, sizes), start=1):
        if stage > 1:
            x = keras.layers.MaxPooling2D(2, name=f"stage{stage}_pool")(x)
            if transitions:
                x = keras.layers.Conv2D(w, 3, name=f"stage{stage}_transition", **conv)(x)
        for index in range(1, n + 1):
            layer_name = f"stage{stage}_{kind}{index}"
            if highway:
                x = HighwayConv2D(kernel_size=3, name=layer_name, **gate)(x)
            else:
                x = keras.layers.Conv2D(w, 3, name=layer_name, **conv)(x)
    return x


def _common(depth, dataset, architecture, activation, num_classes, input_shape, minimum):
    _checks.check_choice("dataset", dataset, DATASETS)
    if architecture is None:
        architecture = "fully_connected" if dataset == "mnist" else "convolutional"
    _checks.check_choice("architecture", architecture, ARCHITECTURES)
    minimum = minimum if architecture == "convolutional" else 1
    _checks.check_positive_int("depth", depth, minimum=minimum)
    _checks.check_choice("activation", activation, ACTIVATIONS)
    num_classes = NUM_CLASSES[dataset] if num_classes is None else num_classes
    _checks.check_positive_int("num_classes", num_classes, minimum=2)
    return architecture, num_classes, _check_input_shape(input_shape, dataset)


def _net(depth, *, highway, dataset, architecture, width, activation, transform_bias_init,
         carry_gate, num_classes, input_shape, kernel_regularizer, include_top, pooling,
         include_preprocessing, normalization, weights, name):
    check_top(include_top, pooling, num_classes)
    check_weights_path(weights)
    architecture, num_classes, input_shape = _common(
        depth, dataset, architecture, activation, num_classes, input_shape,
        minimum=3 if dataset == "mnist" else 7)
    normalization = resolve_normalization(include_preprocessing, normalization,
                                          dataset=dataset,
                                          builder="highway_net" if highway else "plain_net",
                                          architecture=architecture)
    if pooling is not None and architecture == "fully_connected":
        raise ValueError(f"pooling={pooling!r} applies only to convolutional nets (a fully "
                         f"connected net's features are a vector already).")
    if highway:
        _checks.check_choice("carry_gate", carry_gate, CARRY_GATES)
        if transform_bias_init is None:
            transform_bias_init = guideline_transform_bias(depth)
        _checks.check_range("transform_bias_init", transform_bias_init)
    dense = dict(kernel_regularizer=kernel_regularizer)
    gate = dict(activation=activation, transform_bias_init=transform_bias_init,
                carry_gate=carry_gate, kernel_regularizer=kernel_regularizer)
    kind = "highway" if highway else "plain"
    inputs = keras.Input(shape=input_shape, name="images")
    x = input_normalization(inputs, normalization)

    if architecture == "fully_connected":
        if width is None:
            width = HIGHWAY_WIDTH if highway else PLAIN_WIDTH
        _checks.check_positive_int("width", width)
        x = keras.layers.Flatten(name="flatten")(x)
        x = keras.layers.Dense(width, activation=activation, name="plain1", **dense)(x)
        for index in range(2, depth + 1):
            if highway:
                x = Highway(name=f"highway{index}", **gate)(x)
            else:
                x = keras.layers.Dense(width, activation=activation, name=f"plain{index}",
                                       **dense)(x)
        outputs = keras.layers.Dense(num_classes, activation="softmax", dtype="float32",
                                     name="predictions", **dense)(x) if include_top else x
    elif dataset == "mnist":
        if width is None:
            width = MNIST_CONV_WIDTH if highway else round(math.sqrt(2.0) * MNIST_CONV_WIDTH)
        _checks.check_positive_int("width", width)
        conv = dict(padding="same", activation=activation, **dense)
        x = keras.layers.Conv2D(width, 3, name="stem_conv", **conv)(x)
        x = _conv_stages(x, (width,) * 3, _stage_sizes(depth - 2), highway=highway,
                         transitions=False, gate=gate, conv=conv)
        if include_top:
            x = keras.layers.GlobalAveragePooling2D(name="avg_pool")(x)
            outputs = keras.layers.Dense(num_classes, activation="softmax", dtype="float32",
                                         name="predictions", **dense)(x)
        else:
            outputs = pooled_features(x, pooling)
    else:
        if width is None:
            width = CONV_WIDTHS if highway else tuple(
                round(math.sqrt(2.0) * w) for w in CONV_WIDTHS)
        width = tuple(width) if isinstance(width, (list, tuple)) else (width,) * 3
        if len(width) != 3:
            raise ValueError(f"width={width!r} is not valid; expected one int or three "
                             f"(one per stage).")
        for w in width:
            _checks.check_positive_int("width", w)
        conv = dict(padding="same", activation=activation, **dense)
        x = keras.layers.Conv2D(width[0], 3, name="stem_conv", **conv)(x)
        x = _conv_stages(x, width, _stage_sizes(depth - 4), highway=highway,
                         transitions=True, gate=gate, conv=conv)
        if include_top:
            x = keras.layers.Conv2D(num_classes, 1, name="classifier_conv",
                                    kernel_regularizer=kernel_regularizer)(x)
            x = keras.layers.GlobalAveragePooling2D(name="avg_pool")(x)
            outputs = keras.layers.Activation("softmax", dtype="float32",
                                              name="predictions")(x)
        else:
            outputs = pooled_features(x, pooling)
    if name is None:
        name = f"{kind}{depth}" + ("" if dataset == "mnist" and architecture ==
                                   "fully_connected" else f"_{architecture}")
        name += f"_{dataset}"
    model = keras.Model(inputs, outputs, name=name)
    if weights is not None:
        load_weights(model, weights)
    return model


def highway_net(depth=50, *, dataset="mnist", architecture=None, width=None,
                activation="relu", transform_bias_init=None, carry_gate="coupled",
                num_classes=None, input_shape=None, kernel_regularizer=None, include_top=True,
                pooling=None, include_preprocessing=False, normalization=None, weights=None,
                name=None):
    """A highway network of ``depth`` layers (Srivastava et al. 2015).

    Args:
        depth: fully connected nets: hidden layers (a plain first layer, then
            ``depth - 1`` highway layers; the paper's 10, 20, 50, 100).
            Convolutional MNIST nets: every weight layer, >= 3 (a stem,
            ``depth - 2`` highway layers, the softmax layer; Table 1's 10).
            Convolutional CIFAR nets: all convolutions, >= 7 (a stem,
            ``depth - 4`` highway layers in three stages, two transitions, a
            1x1 classifier).
        dataset: ``"mnist"``, ``"cifar10"`` or ``"cifar100"``.
        architecture: ``"fully_connected"`` (default for MNIST) or
            ``"convolutional"`` (default for CIFAR).
        width: blocks per layer (fully connected, default 50), filter maps of
            every layer (convolutional MNIST, default 16; Table 1: 16, 32), or
            the widths of the three stages (convolutional CIFAR, default (32,
            64, 128)).
        activation: of the block state H and plain layers, ``"relu"`` or
            ``"tanh"`` (the two the paper searched over).
        transform_bias_init: initial transform-gate bias; ``None`` follows
            the paper's guideline (-1/-2/-3 for depth ~10/20/30).
        carry_gate: ``"coupled"`` (C = 1 - T, Eqn. 3) or ``"separate"`` (Eqn. 2).
        num_classes, input_shape: default to the dataset's.
        kernel_regularizer: regularizer of every kernel.
        include_top, pooling, include_preprocessing, normalization, weights:
            as for :func:`keras_identity.models.resnet` (``pooling`` for
            convolutional nets; the recipe's normalisation is ``"scale"``
            for MNIST, per-channel for CIFAR).
        name: model name.
    """
    return _net(depth, highway=True, dataset=dataset, architecture=architecture,
                width=width, activation=activation, transform_bias_init=transform_bias_init,
                carry_gate=carry_gate, num_classes=num_classes, input_shape=input_shape,
                kernel_regularizer=kernel_regularizer, include_top=include_top,
                pooling=pooling, include_preprocessing=include_preprocessing,
                normalization=normalization, weights=weights, name=name)


def plain_net(depth=50, *, dataset="mnist", architecture=None, width=None,
              activation="relu", num_classes=None, input_shape=None,
              kernel_regularizer=None, include_top=True, pooling=None,
              include_preprocessing=False, normalization=None, weights=None, name=None):
    """The plain counterpart of :func:`highway_net` (Fig. 1's "plain" nets).

    Same layout with plain layers: 71 units per fully connected layer, so a
    layer has about the parameters of a 50-block highway layer; convolutional
    stages are sqrt(2) times wider than the highway ones for the same reason.
    (The plain CNNs of He et al. 2015 are
    ``resnet(depth, shortcut="constant_scaling", shortcut_scale=0.0)``.)
    """
    return _net(depth, highway=False, dataset=dataset, architecture=architecture,
                width=width, activation=activation, transform_bias_init=None,
                carry_gate="coupled", num_classes=num_classes, input_shape=input_shape,
                kernel_regularizer=kernel_regularizer, include_top=include_top,
                pooling=pooling, include_preprocessing=include_preprocessing,
                normalization=normalization, weights=weights, name=name)

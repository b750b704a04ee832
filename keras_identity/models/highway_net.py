"""Highway networks and their plain counterparts (Srivastava et al. 2015).

* Fully connected nets of the optimisation study (Sec. 3.1, Fig. 1): "each layer has 50
  blocks for highway networks and 71 units for plain networks, yielding roughly
  identical numbers of parameters (~5000) per layer.  The first layer is a fully
  connected plain layer followed by 9, 19, 49, or 99 fully connected plain or highway
  layers", then a softmax layer.  ``depth`` counts those hidden layers (10, 20, 50,
  100).
* Convolutional MNIST nets (Sec. 3.2, Table 1): "10-layer convolutional highway networks
  ... each with 9 convolutional layers followed by a softmax output.  The number of
  filter maps (width) was set to 16 and 32 for all the layers."  The paper does not say
  more; our choices: a plain 3x3 stem convolution, ``depth - 2`` 3x3 highway
  convolutions in three stages with 2x2 max pooling between them (28, 14, 7 pixels),
  global average pooling and a softmax layer.  Width 16 gives 37,450 parameters, width
  32 148,618 (the paper's ~39K and ~151K: -4.0% and -1.6%).
* Convolutional CIFAR nets (Secs. 3.3): a plain stem convolution, three stages of 3x3
  highway convolutions separated by max pooling and a plain convolution that doubles the
  width ("a plain layer to change dimensionality"), and a 1x1 convolution with global
  average pooling in place of a fully connected classifier (Sec. 3.3.2).  The paper does
  not list the layer widths of its Fitnet-derived nets, so these are a design of ours:
  widths (32, 64, 128) give 2.03M parameters at depth 19 (the paper's 19-layer Highway B
  has ~2.3M).
"""

import math

import keras

from keras_identity import _checks
from keras_identity import initializers
from keras_identity.layers.crelu import CReLU
from keras_identity.layers.highway import CARRY_GATES
from keras_identity.layers.highway import Highway
from keras_identity.layers.highway import HighwayConv2D
from keras_identity.data.facts import NUM_CLASSES
from keras_identity.models.resnet import check_input_shape
from keras_identity.models.resnet import check_top
from keras_identity.models.resnet import input_normalization
from keras_identity.models.resnet import pooled_features
from keras_identity.models.resnet import resolve_normalization
from keras_identity.models import pretrained
from keras_identity.models.weights import check_weights_path
from keras_identity.models.weights import load_weights

DATASETS = ("mnist", "cifar10", "cifar100")  # the highway paper's (no ImageNet)
ARCHITECTURES = ("fully_connected", "convolutional")
ACTIVATIONS = ("relu", "tanh")
# Plain nets may also use CReLU (Balduzzi et al. 2017): with the looks-linear
# initialisation a feedforward net is linear at initialisation.
PLAIN_ACTIVATIONS = ACTIVATIONS + ("crelu",)
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
                x = conv(x, w, 3, f"stage{stage}_transition")
        for index in range(1, n + 1):
            layer_name = f"stage{stage}_{kind}{index}"
            if highway:
                x = HighwayConv2D(kernel_size=3, name=layer_name, **gate)(x)
            else:
                x = conv(x, w, 3, layer_name)
    return x


_FIRST_LAYERS = ("plain1", "stem_conv")  # the layers that read the images


def _plain_layers(activation, kernel_initializer, kernel_regularizer):
    """``(dense, conv)``: functions adding a plain layer (``x, units, name`` /
    ``x, filters, size, name``) with its activation.  With CReLU, the
    activation is a :class:`CReLU` layer after the weights (doubling the
    width), and a looks-linear initialisation gives every layer fed by a
    CReLU a :class:`LooksLinear` kernel and the first an orthogonal one."""
    crelu = activation == "crelu"
    looks_linear = kernel_initializer == "looks_linear"
    if looks_linear and not crelu:
        raise ValueError(f"kernel_initializer='looks_linear' needs activation='crelu' (it "
                         f"pairs each CReLU output with its negative); got "
                         f"activation={activation!r}.")

    def initializer(name):
        if not looks_linear:
            return initializers.get(kernel_initializer, default=lambda: "glorot_uniform")
        # Every layer but the first reads CReLU pairs (through pooling, too).
        return "orthogonal" if name in _FIRST_LAYERS else initializers.LooksLinear()

    def add(x, layer, name):
        x = layer(x)
        return CReLU(name=f"{name}_crelu")(x) if crelu else x

    def dense(x, units, name, final=False):
        layer = keras.layers.Dense(units, activation="softmax" if final else (
            None if crelu else activation), kernel_initializer=initializer(name),
            kernel_regularizer=kernel_regularizer, name=name,
            **({"dtype": "float32"} if final else {}))
        return layer(x) if final else add(x, layer, name)

    def conv(x, filters, size, name, final=False):
        layer = keras.layers.Conv2D(filters, size, padding="same", activation=None if (
            crelu or final) else activation, kernel_initializer=initializer(name),
            kernel_regularizer=kernel_regularizer, name=name)
        return layer(x) if final else add(x, layer, name)

    return dense, conv


def default_width(highway, dataset, architecture, activation):
    """The width a net gets with ``width=None``: 50 blocks or 71 units per fully connected
    layer, 16 (MNIST) or (32, 64, 128) (CIFAR) highway maps, sqrt(2) times more plain ones;
    CReLU narrows a plain net by 1/sqrt(2) (it doubles a layer's outputs)."""
    narrow = 1.0 / math.sqrt(2.0) if activation == "crelu" else 1.0
    if architecture == "fully_connected":
        return HIGHWAY_WIDTH if highway else round(narrow * PLAIN_WIDTH)
    if dataset == "mnist":
        return MNIST_CONV_WIDTH if highway else round(
            narrow * math.sqrt(2.0) * MNIST_CONV_WIDTH)
    return CONV_WIDTHS if highway else tuple(round(narrow * math.sqrt(2.0) * w)
                                             for w in CONV_WIDTHS)


def _layout(arguments, highway):
    """The architecture, width, classes and input shape ``arguments`` build
    (defaults resolved): what a preset's arguments are compared by."""
    architecture = arguments["architecture"] or (
        "fully_connected" if arguments["dataset"] == "mnist" else "convolutional")
    width = arguments["width"]
    if width is None:
        width = default_width(highway, arguments["dataset"], architecture,
                              arguments["activation"])
    dataset, num_classes = arguments["dataset"], arguments["num_classes"]
    return {"architecture": architecture,
            "width": list(width) if isinstance(width, (list, tuple)) else width,
            "num_classes": NUM_CLASSES[dataset] if num_classes is None else num_classes,
            "input_shape": list(check_input_shape(arguments["input_shape"], dataset))}


def _common(depth, dataset, architecture, activation, num_classes, input_shape, minimum,
            activations=ACTIVATIONS):
    _checks.check_choice("dataset", dataset, DATASETS)
    if architecture is None:
        architecture = "fully_connected" if dataset == "mnist" else "convolutional"
    _checks.check_choice("architecture", architecture, ARCHITECTURES)
    minimum = minimum if architecture == "convolutional" else 1
    _checks.check_positive_int("depth", depth, minimum=minimum)
    _checks.check_choice("activation", activation, activations)
    num_classes = NUM_CLASSES[dataset] if num_classes is None else num_classes
    _checks.check_positive_int("num_classes", num_classes, minimum=2)
    return architecture, num_classes, check_input_shape(input_shape, dataset)


def _net(depth, *, highway, dataset, architecture, width, activation, transform_bias_init,
         carry_gate, num_classes, input_shape, kernel_regularizer, include_top, pooling,
         include_preprocessing, normalization, weights, name, kernel_initializer=None):
    given = dict(locals())
    check_top(include_top, pooling, num_classes)
    check_weights_path(weights)
    architecture, num_classes, input_shape = _common(
        depth, dataset, architecture, activation, num_classes, input_shape,
        minimum=3 if dataset == "mnist" else 7,
        activations=ACTIVATIONS if highway else PLAIN_ACTIVATIONS)
    function = highway_net if highway else plain_net
    defaults = pretrained.defaults_of(function)
    weights = pretrained.weights_file(function.__name__, weights,
                                   {k: v for k, v in given.items() if k in defaults}, defaults,
                                   resolve=lambda arguments: _layout(arguments, highway))
    dense_layer, conv_layer = _plain_layers(activation, kernel_initializer, kernel_regularizer)
    if width is None:
        width = default_width(highway, dataset, architecture, activation)
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
    gate = dict(activation=activation, transform_bias_init=transform_bias_init,
                carry_gate=carry_gate, kernel_regularizer=kernel_regularizer)
    kind = "highway" if highway else "plain"
    inputs = keras.Input(shape=input_shape, name="images")
    x = input_normalization(inputs, normalization)

    if architecture == "fully_connected":
        _checks.check_positive_int("width", width)
        x = keras.layers.Flatten(name="flatten")(x)
        x = dense_layer(x, width, "plain1")
        for index in range(2, depth + 1):
            if highway:
                x = Highway(name=f"highway{index}", **gate)(x)
            else:
                x = dense_layer(x, width, f"plain{index}")
        outputs = dense_layer(x, num_classes, "predictions", final=True) if include_top else x
    elif dataset == "mnist":
        _checks.check_positive_int("width", width)
        x = conv_layer(x, width, 3, "stem_conv")
        x = _conv_stages(x, (width,) * 3, _stage_sizes(depth - 2), highway=highway,
                         transitions=False, gate=gate, conv=conv_layer)
        if include_top:
            x = keras.layers.GlobalAveragePooling2D(name="avg_pool")(x)
            outputs = dense_layer(x, num_classes, "predictions", final=True)
        else:
            outputs = pooled_features(x, pooling)
    else:
        width = tuple(width) if isinstance(width, (list, tuple)) else (width,) * 3
        if len(width) != 3:
            raise ValueError(f"width={width!r} is not valid; expected one int or three "
                             f"(one per stage).")
        for w in width:
            _checks.check_positive_int("width", w)
        x = conv_layer(x, width[0], 3, "stem_conv")
        x = _conv_stages(x, width, _stage_sizes(depth - 4), highway=highway,
                         transitions=True, gate=gate, conv=conv_layer)
        if include_top:
            x = conv_layer(x, num_classes, 1, "classifier_conv", final=True)
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
        depth: fully connected nets: hidden layers (a plain first layer, then ``depth - 1``
            highway layers; the paper's 10, 20, 50, 100).  Convolutional MNIST nets: every
            weight layer, >= 3 (a stem, ``depth - 2`` highway layers, the softmax layer;
            Table 1's 10).  Convolutional CIFAR nets: all convolutions, >= 7 (a stem,
            ``depth - 4`` highway layers in three stages, two transitions, a 1x1
            classifier).
        dataset: ``"mnist"``, ``"cifar10"`` or ``"cifar100"``.
        architecture: ``"fully_connected"`` (default for MNIST) or ``"convolutional"``
            (default for CIFAR).
        width: blocks per layer (fully connected, default 50), filter maps of every layer
            (convolutional MNIST, default 16; Table 1: 16, 32), or the widths of the three
            stages (convolutional CIFAR, default (32, 64, 128)).
        activation: of the block state H and plain layers, ``"relu"`` or ``"tanh"`` (the two
            the paper searched over).
        transform_bias_init: initial transform-gate bias; ``None`` follows the paper's
            guideline (-1/-2/-3 for depth ~10/20/30).
        carry_gate: ``"coupled"`` (C = 1 - T, Eqn. 3) or ``"separate"`` (Eqn. 2).
        num_classes, input_shape: default to the dataset's.
        kernel_regularizer: regularizer of every kernel.
        include_top, pooling, include_preprocessing, normalization, weights: as for
            :func:`keras_identity.models.resnet` (``pooling`` for convolutional nets; the
            recipe's normalisation is ``"scale"`` for MNIST, per-channel for CIFAR).
        name: model name.
    """
    return _net(depth, highway=True, dataset=dataset, architecture=architecture,
                width=width, activation=activation, transform_bias_init=transform_bias_init,
                carry_gate=carry_gate, num_classes=num_classes, input_shape=input_shape,
                kernel_regularizer=kernel_regularizer, include_top=include_top,
                pooling=pooling, include_preprocessing=include_preprocessing,
                normalization=normalization, weights=weights, name=name)


def plain_net(depth=50, *, dataset="mnist", architecture=None, width=None,
              activation="relu", kernel_initializer=None, num_classes=None,
              input_shape=None, kernel_regularizer=None, include_top=True, pooling=None,
              include_preprocessing=False, normalization=None, weights=None, name=None):
    """The plain counterpart of :func:`highway_net` (Fig. 1's "plain" nets).

    Same layout with plain layers: 71 units per fully connected layer, so a layer has about
    the parameters of a 50-block highway layer; convolutional stages are sqrt(2) times wider
    than the highway ones for the same reason.  (The plain CNNs of He et al. 2015 are
    ``resnet(depth, shortcut="constant_scaling", shortcut_scale=0.0)``.)

    ``activation="crelu"`` puts a :class:`keras_identity.layers.CReLU` after every plain
    layer and narrows the default widths by 1/sqrt(2) for about the same parameters
    (Balduzzi et al. 2017, Sec. 5.1: 50 units per fully connected layer); with
    ``kernel_initializer="looks_linear"`` every layer after the first gets a
    :class:`keras_identity.initializers.LooksLinear` kernel and the first an orthogonal one,
    so a fully connected net is exactly linear at initialisation (a convolutional one within
    each stage: its max pooling is not linear).  Other ``kernel_initializer`` values are
    Keras initializers (default: Glorot uniform, Keras's).  Other arguments as for
    :func:`highway_net`.
    """
    return _net(depth, highway=False, dataset=dataset, architecture=architecture,
                width=width, activation=activation, transform_bias_init=None,
                carry_gate="coupled", num_classes=num_classes, input_shape=input_shape,
                kernel_regularizer=kernel_regularizer, include_top=include_top,
                pooling=pooling, include_preprocessing=include_preprocessing,
                normalization=normalization, weights=weights, name=name,
                kernel_initializer=kernel_initializer)

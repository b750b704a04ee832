import keras
import numpy as np
import pytest

import keras_identity as ki
from keras_identity.layers import Highway
from keras_identity.layers import HighwayConv2D
from keras_identity.models.highway_net import guideline_transform_bias

pytestmark = [pytest.mark.core_leg, pytest.mark.quick]  # quick: the quick tier


def trainable(model):
    return sum(int(np.prod(w.shape)) for w in model.trainable_weights)


@pytest.mark.parametrize("depth", [10, 20, 50, 100])
def test_fig1_nets_have_about_5000_parameters_per_layer(depth):
    highway = ki.models.highway_net(depth)
    plain = ki.models.plain_net(depth)
    # first plain layer + (depth - 1) hidden layers + softmax
    assert trainable(highway) == (784 * 50 + 50) + (depth - 1) * 2 * (50 * 50 + 50) + 510
    assert trainable(plain) == (784 * 71 + 71) + (depth - 1) * (71 * 71 + 71) + 720
    assert len(ki.layers.highway_layers(highway)) == depth - 1
    per_layer_h = 2 * (50 * 50 + 50)
    per_layer_p = 71 * 71 + 71
    assert abs(per_layer_h - per_layer_p) / per_layer_p < 0.01


def test_guideline_gate_biases():
    assert [guideline_transform_bias(d) for d in (10, 20, 30, 50)] == [-1, -2, -3, -3]
    net = ki.models.highway_net(10)
    np.testing.assert_array_equal(net.get_layer("highway2").transform_gate.bias, -1.0)
    net = ki.models.highway_net(19, dataset="cifar10")
    np.testing.assert_array_equal(net.get_layer("stage1_highway1").transform_gate.bias, -2.0)
    net = ki.models.highway_net(10, transform_bias_init=-7)
    np.testing.assert_array_equal(net.get_layer("highway10").transform_gate.bias, -7.0)


def test_convolutional_highway_net():
    net = ki.models.highway_net(19, dataset="cifar10")
    hw = [l for l in net.layers if isinstance(l, HighwayConv2D)]
    assert len(hw) == 15
    convs = [l for l in net.layers if isinstance(l, keras.layers.Conv2D)]
    assert len(hw) + len(convs) == 19
    assert trainable(net) == 2_032_138
    assert net.output_shape == (None, 10)
    assert net.get_layer("stage3_highway5").output.shape == (None, 8, 8, 128)
    plain = ki.models.plain_net(19, dataset="cifar100")
    assert plain.output_shape == (None, 100)
    assert plain.get_layer("stage1_plain1").kernel.shape == (3, 3, 45, 45)


def test_fully_connected_cifar100_highway_net():
    net = ki.models.highway_net(50, dataset="cifar100", architecture="fully_connected")
    assert net.get_layer("plain1").kernel.shape == (32 * 32 * 3, 50)
    assert net.output_shape == (None, 100)


def test_highway_net_trains_and_round_trips(tmp_path, rng):
    model = ki.models.highway_net(6, width=16, carry_gate="separate")
    x = rng.uniform(size=(8, 28, 28, 1)).astype("float32")
    y = rng.integers(0, 10, 8)
    model.compile("sgd", "sparse_categorical_crossentropy")
    assert np.isfinite(model.train_on_batch(x, y))
    model.save(tmp_path / "m.keras")
    restored = keras.models.load_model(tmp_path / "m.keras", safe_mode=True)
    np.testing.assert_array_equal(restored.predict(x, verbose=0), model.predict(x, verbose=0))
    assert isinstance(restored.get_layer("highway2"), Highway)


@pytest.mark.parametrize("call, words", [
    (lambda: ki.models.highway_net(0), ["depth=0"]),
    (lambda: ki.models.highway_net(5, dataset="cifar10"), ["depth=5", ">= 7"]),
    (lambda: ki.models.highway_net(10, dataset="imagenet"), ["dataset='imagenet'"]),
    (lambda: ki.models.highway_net(10, activation="gelu"), ["activation='gelu'", "'tanh'"]),
    (lambda: ki.models.highway_net(10, carry_gate="x"), ["carry_gate='x'"]),
    (lambda: ki.models.highway_net(10, architecture="rnn"), ["architecture='rnn'"]),
    (lambda: ki.models.plain_net(10, width=0), ["width=0"]),
    (lambda: ki.models.highway_net(19, dataset="cifar10", width=(8, 8)), ["width=(8, 8)"]),
])
def test_bad_input(call, words):
    with pytest.raises(ValueError) as error:
        call()
    for word in words:
        assert word in str(error.value)


@pytest.mark.parametrize("width, paper", [(16, 39_000), (32, 151_000)])
def test_table1_convolutional_mnist_nets_have_the_papers_parameters(width, paper):
    """Srivastava et al. 2015, Sec. 3.2 / Table 1: 9 convolutional layers of
    16 or 32 maps and a softmax layer: ~39K and ~151K parameters."""
    net = ki.models.highway_net(10, architecture="convolutional", width=width)
    stem = 9 * width + width
    highway = 2 * (9 * width * width + width)  # H and T, 3x3
    assert trainable(net) == stem + 8 * highway + (10 * width + 10)
    assert abs(trainable(net) / paper - 1) <= 0.05
    convolutions = [l for l in net.layers if l.name.startswith(("stem_conv", "stage"))
                    and "pool" not in l.name]
    assert len(convolutions) == 9 and len(ki.layers.highway_layers(net)) == 8
    assert net.get_layer("stage3_highway2").output.shape == (None, 7, 7, width)
    np.testing.assert_array_equal(net.get_layer("stage1_highway1").transform_gate.bias, -1.0)
    assert list(ki.models.feature_extractor(net).output) == ["stage1", "stage2", "stage3"]


def test_table1_nets_are_named_and_train_with_their_recipe():
    from keras_identity.training import TrainConfig

    assert ki.models.get_model("highway10_conv32_mnist").count_params() == 148_618
    plain = ki.models.get_model("plain10_conv_mnist")
    assert abs(plain.count_params() / 37_450 - 1) < 0.05  # as many as the width-16 highway net
    config = TrainConfig(model="highway10_conv16_mnist")
    assert config.resolved_recipe == "highway_mnist_conv"
    assert TrainConfig(model="highway_net").resolved_recipe == "highway_mnist"
    with pytest.raises(ValueError, match="depth=2"):
        ki.models.highway_net(2, architecture="convolutional")


# --- CReLU and the looks-linear initialisation (Balduzzi et al. 2017) -----------

def _linear_logits(model, x):
    """The logits of the linear net of the model's W's: the first layer's
    kernel, then every looks-linear kernel's even rows (biases are zero)."""
    h = x.reshape(len(x), -1) @ model.get_layer("plain1").kernel.numpy()
    for layer in model.layers:
        if isinstance(layer, keras.layers.Dense) and layer.name != "plain1":
            h = h @ layer.kernel.numpy()[0::2]
    return h


def test_a_deep_crelu_net_with_looks_linear_init_is_its_linear_net():
    from tests.backend import value_and_grad

    keras.utils.set_random_seed(0)
    model = ki.models.plain_net(30, activation="crelu", kernel_initializer="looks_linear")
    assert model.get_layer("plain2").kernel.shape == (100, 50)  # 71 / sqrt(2) = 50 units
    x = np.random.default_rng(0).uniform(size=(6, 28, 28, 1)).astype(np.float32)
    expected = _linear_logits(model, x)
    probabilities = np.exp(expected) / np.exp(expected).sum(axis=1, keepdims=True)
    np.testing.assert_allclose(model.predict(x, verbose=0), probabilities, atol=1e-5)
    # The input gradient of a logit is the same for every input.
    head = keras.Model(model.input, model.get_layer("predictions").input)
    column = model.get_layer("predictions").kernel.numpy()[:, 3]
    grads = [np.asarray(value_and_grad(
        head, lambda h: keras.ops.sum(keras.ops.matmul(h, column)), x[i:i + 1],
        training=False, sources="inputs")[1]) for i in range(3)]
    assert np.abs(grads[0]).max() > 0
    np.testing.assert_allclose(grads[0], grads[1], atol=1e-5)
    np.testing.assert_allclose(grads[0], grads[2], atol=1e-5)
    # Parameter parity per hidden layer (5,050 against ReLU's 5,112); the first
    # layer, fed by 784 pixels, is the narrower one.
    relu = ki.models.plain_net(30)
    assert model.get_layer("plain2").count_params() == 100 * 50 + 50
    assert relu.get_layer("plain2").count_params() == 71 * 71 + 71
    assert model.count_params() == 186_710 and relu.count_params() == 204_703


def test_looks_linear_without_crelu_is_refused_and_highway_nets_keep_their_activations():
    with pytest.raises(ValueError, match=r"kernel_initializer='looks_linear' needs "
                                         r"activation='crelu'"):
        ki.models.plain_net(10, kernel_initializer="looks_linear")
    with pytest.raises(ValueError, match="activation='crelu' is not valid"):
        ki.models.highway_net(10, activation="crelu")


@pytest.mark.parametrize("dataset", ["mnist", "cifar10"])
def test_convolutional_crelu_nets_build_train_and_round_trip(dataset, tmp_path):
    keras.utils.set_random_seed(1)
    model = ki.models.plain_net(7, dataset=dataset, architecture="convolutional",
                                activation="crelu", kernel_initializer="looks_linear",
                                include_preprocessing=True)
    convs = [l for l in model.layers if isinstance(l, keras.layers.Conv2D)]
    assert convs[0].name == "stem_conv" and convs[1].kernel.shape[2] == 2 * convs[0].filters
    centre = convs[1].kernel.numpy()
    centre[1, 1] = 0.0
    assert not centre.any()  # looks-linear: only the centre tap
    shape = model.input_shape[1:]
    x = np.random.default_rng(0).integers(0, 256, (8, *shape)).astype(np.float32)
    y = np.arange(8) % 10
    model.get_layer("preprocessing").adapt(x)
    model.compile("sgd", "sparse_categorical_crossentropy")
    model.fit(x, y, epochs=1, batch_size=4, verbose=0)
    path = str(tmp_path / "crelu.keras")
    model.save(path)
    np.testing.assert_allclose(keras.models.load_model(path).predict(x, verbose=0),
                               model.predict(x, verbose=0), atol=1e-6)


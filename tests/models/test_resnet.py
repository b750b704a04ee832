import io
import contextlib

import keras
import numpy as np
import pytest

import keras_identity as ki
from keras_identity.layers import ResidualUnit

pytestmark = pytest.mark.quick  # the quick tier (docs/testing.md)


def trainable(model):
    return sum(int(np.prod(w.shape)) for w in model.trainable_weights)


# --- parameter counts pinned to the papers and the authors' code --------------

@pytest.mark.core_leg
@pytest.mark.parametrize("build, expected", [
    (lambda: ki.models.preact_resnet(164), 1_703_258),
    (lambda: ki.models.resnet(110), 1_727_962),          # "1.7M", Table 4
    (lambda: ki.models.resnet(20), 269_722),             # 0.27M, He et al. 2015
    (lambda: ki.models.resnet(52, dataset="mnist"), 117_802),  # the lecture's net
    (lambda: ki.models.resnet(50, dataset="imagenet"), 25_557_032),
    (lambda: ki.models.resnet(152, dataset="imagenet"), 60_192_808),
    (lambda: ki.models.preact_resnet(152, dataset="imagenet"), 60_185_128),  # ~60.2M
    (lambda: ki.models.preact_resnet(200, dataset="imagenet"), 64_666_152),  # ~64.7M
])
def test_parameter_counts(build, expected):
    assert trainable(build()) == expected


def test_resnet1001_builds_with_the_papers_parameters():
    model = ki.models.preact_resnet(depth=1001, stage_mode="unrolled")
    assert trainable(model) == 10_327_706
    convs_and_fc = sum(int(np.prod(w.shape)) for w in model.trainable_weights
                       if w.path.endswith("kernel"))
    assert round(convs_and_fc / 1e6, 1) == 10.2  # the paper's "10.2M"
    assert len([l for l in model.layers if isinstance(l, ResidualUnit)]) == 333


def test_cifar100_changes_only_the_classifier():
    assert trainable(ki.models.preact_resnet(164, dataset="cifar100")) == \
        1_703_258 + 256 * 90 + 90


# --- architecture as in the authors' code -------------------------------------

def test_preact_cifar_architecture():
    model = ki.models.preact_resnet(164, stage_mode="unrolled")
    names = [l.name for l in model.layers]
    assert names[:3] == ["images", "stem_conv", "stage1_unit1"]  # bare stem conv
    assert names[-4:] == ["final_bn", "final_relu", "avg_pool", "predictions"]
    first = model.get_layer("stage1_unit1")
    assert first.preactivation == "shared" and first.projection is not None
    assert tuple(first.projection.kernel.shape) == (1, 1, 16, 64)
    for stage in (2, 3):
        unit = model.get_layer(f"stage{stage}_unit1")
        assert unit.preactivation == "shared"
        assert unit.convs[0].strides == (2, 2)  # stride on the first 1x1
    other = model.get_layer("stage2_unit2")
    assert other.preactivation == "residual" and other.projection is None
    assert [tuple(c.kernel.shape) for c in other.convs] == \
        [(1, 1, 128, 32), (3, 3, 32, 32), (1, 1, 32, 128)]
    convs = [l for l in model.layers if isinstance(l, keras.layers.Conv2D)]
    convs += [c for u in model.layers if isinstance(u, ResidualUnit) for c in u.convs]
    assert convs and not any(c.use_bias for c in convs)
    assert model.output.dtype == "float32" and model.output_shape == (None, 10)


def test_original_cifar_uses_option_a_and_post_activation_stem():
    model = ki.models.resnet(20)
    assert [l.name for l in model.layers][1:4] == ["stem_conv", "stem_bn", "stem_relu"]
    unit = model.get_layer("stage2_unit1")
    assert unit.zero_pad is not None and unit.projection is None
    assert "final_bn" not in [l.name for l in model.layers]


def test_imagenet_stem_and_first_units():
    model = ki.models.preact_resnet(50, dataset="imagenet")
    assert model.get_layer("stem_conv").kernel.shape == (7, 7, 3, 64)
    assert model.get_layer("stem_pool").output.shape == (None, 56, 56, 64)
    assert model.get_layer("stage1_unit1").preactivation == "none"
    assert model.get_layer("stage2_unit1").preactivation == "shared"
    assert model.get_layer("stage4_unit3").output.shape == (None, 7, 7, 2048)


def test_imagenet_nets_are_fully_convolutional():
    model = ki.models.resnet(18, dataset="imagenet", input_shape=(320, 320, 3))
    assert model.get_layer("stage4_unit2").output.shape == (None, 10, 10, 512)
    assert trainable(model) == 11_689_512


def test_he_initialisation_fan_out():
    model = ki.models.preact_resnet(164, seed=3, stage_mode="unrolled")
    kernel = np.asarray(model.get_layer("stage3_unit5").convs[1].kernel)  # 3x3, 64 out
    assert kernel.std() == pytest.approx(np.sqrt(2.0 / (3 * 3 * 64)), rel=0.05)
    assert abs(kernel.mean()) < 0.01


def test_seed_makes_builds_reproducible():
    a = ki.models.resnet(20, seed=11).get_weights()
    b = ki.models.resnet(20, seed=11).get_weights()
    assert all(np.array_equal(x, y) for x, y in zip(a, b))


def test_readable_layer_names_in_summary():
    model = ki.models.resnet(20)
    buffer = io.StringIO()
    with contextlib.redirect_stdout(buffer):
        model.summary(expand_nested=True, line_length=120)
    text = buffer.getvalue()
    for name in ("stage2_unit3", "stage2_unit3_conv1", "stage2_unit3_bn2", "stage3_unit1"):
        assert name in text
    paths = [w.path for w in model.get_layer("stage2_unit3").weights]
    assert "stage2_unit3/stage2_unit3_conv1/kernel" in paths


# --- the issue's examples and the papers' table cells ------------------------

def test_table1_cell_gate_bias():
    model = ki.models.resnet(20, unit="original", shortcut="exclusive_gating",
                             gate_bias_init=-6.0)
    gates = [u.gate for u in model.layers if isinstance(u, ResidualUnit)]
    assert len(gates) == 9
    for gate in gates:
        np.testing.assert_array_equal(gate.bias, -6.0)


def test_table2_cell_and_block_defaults():
    assert ki.models.resnet(164, unit="relu_before_addition").get_layer(
        "stage1_unit1").block == "bottleneck"
    for depth, block in [(20, "basic"), (56, "basic"), (110, "basic"), (164, "bottleneck"),
                         (1001, "bottleneck"), (1202, "basic"), (29, "bottleneck")]:
        assert ki.models.resolve_depth(depth)[0] == block, depth
    assert ki.models.resolve_depth(110, block="bottleneck") == ("bottleneck", (12, 12, 12))
    assert ki.models.resolve_depth(110, block="single") == ("single", (36, 36, 36))


def test_stochastic_depth_linear_decay():
    model = ki.models.preact_resnet(20, stochastic_depth_rate=0.5)
    rates = [u.stochastic_depth_rate for u in model.layers if isinstance(u, ResidualUnit)]
    np.testing.assert_allclose(rates, 0.5 * np.arange(1, 10) / 9)


def test_mixed_precision_model(rng):
    keras.config.set_dtype_policy("mixed_bfloat16")
    model = ki.models.resnet(8, shortcut="exclusive_gating", input_shape=(8, 8, 3))
    assert model.get_layer("stage1_unit1").compute_dtype == "bfloat16"
    assert model.get_layer("stage1_unit1").gate.compute_dtype == "float32"
    y = model(rng.uniform(size=(2, 8, 8, 3)).astype("float32"))
    assert y.dtype == "float32"
    np.testing.assert_allclose(np.asarray(y).sum(axis=1), 1.0, rtol=1e-5)


def test_logits_and_headless_models():
    logits = ki.models.resnet(8, input_shape=(8, 8, 3), classifier_activation=None)
    assert logits.get_layer("predictions").activation.__name__ == "linear"
    features = ki.models.preact_resnet(11, include_top=False)
    assert features.output_shape == (None, 8, 8, 256)


@pytest.mark.needs_tensorflow
def test_export_round_trip(tmp_path, rng):
    import tensorflow as tf

    model = ki.models.preact_resnet(11, shortcut="shortcut_only_gating")
    x = rng.uniform(size=(3, 32, 32, 3)).astype("float32")
    path = str(tmp_path / "export")
    model.export(path, verbose=False)
    restored = tf.saved_model.load(path)
    np.testing.assert_allclose(restored.serve(x), model.predict(x, verbose=0), atol=1e-6)


def test_all_datasets_train_a_step(rng):
    for dataset, shape in [("cifar100", (32, 32, 3)), ("mnist", (28, 28, 1))]:
        model = ki.models.resnet(8 if dataset != "mnist" else 6, dataset=dataset,
                                 unit="full_preactivation")
        model.compile("sgd", "sparse_categorical_crossentropy")
        x = rng.uniform(size=(2,) + shape).astype("float32")
        assert np.isfinite(model.train_on_batch(x, np.array([1, 2])))


# --- bad input ----------------------------------------------------------------

@pytest.mark.parametrize("call, words", [
    (lambda: ki.models.preact_resnet(1000), ["depth=1000", "9n+2", "6n+2"]),
    (lambda: ki.models.preact_resnet(1000, block="bottleneck"),
     ["depth=1000", "block='bottleneck'", "9n+2", "1001"]),
    (lambda: ki.models.resnet(100, dataset="imagenet"),
     ["depth=100", "ImageNet", "18, 34, 50, 101, 152, 200"]),
    (lambda: ki.models.resnet(50, dataset="imagenet", block="basic"), ["block='basic'"]),
    (lambda: ki.models.resnet(20, dataset="svhn"), ["dataset='svhn'", "'cifar10'"]),
    (lambda: ki.models.resnet(20, unit="preact"), ["unit='preact'"]),
    (lambda: ki.models.resnet(20, shortcut="skip"), ["shortcut='skip'"]),
    (lambda: ki.models.resnet(20, block="wide"), ["block='wide'"]),
    (lambda: ki.models.resnet(20, shortcut="dropout", shortcut_dropout_rate=1.2),
     ["shortcut_dropout_rate=1.2"]),
    (lambda: ki.models.resnet(20, shortcut="constant_scaling", shortcut_scale=-1),
     ["shortcut_scale=-1"]),
    (lambda: ki.models.resnet(20, stochastic_depth_rate=1.0), ["stochastic_depth_rate=1.0"]),
    (lambda: ki.models.resnet(20, input_shape=(32, 32)), ["input_shape=(32, 32)"]),
    (lambda: ki.models.resnet(20, num_classes=0), ["num_classes=0"]),
    (lambda: ki.models.resnet("20"), ["depth='20'"]),
    (lambda: ki.models.preact_resnet(164, unit="original"), ["unit="]),
])
def test_bad_input_raises_clear_value_errors(call, words):
    with pytest.raises(ValueError) as error:
        call()
    for word in words:
        assert word in str(error.value)


# --- inputs the network cannot take are refused by name (issue 20: 8) ----------

@pytest.mark.parametrize("kwargs, minimum", [
    (dict(depth=20, input_shape=(4, 4, 3)), 5),
    (dict(depth=29, input_shape=(4, 4, 3), stride_on_1x1=False), 5),
    (dict(depth=18, dataset="imagenet", input_shape=(8, 8, 3)), 33),
    (dict(depth=18, dataset="imagenet", input_shape=(32, 32, 3)), 33),
])
def test_too_small_input_shape_names_the_minimum(kwargs, minimum):
    with pytest.raises(ValueError, match=rf"input_shape=.* is too small .* at least {minimum}\."):
        ki.models.resnet(**kwargs)
    shape = (minimum, minimum, kwargs["input_shape"][-1])
    ki.models.resnet(**dict(kwargs, input_shape=shape))  # the minimum builds
    # (a bottleneck with its stride on the 1x1 convolution takes any size)
    ki.models.resnet(29, input_shape=(2, 2, 3))


def test_one_class_softmax_is_refused():
    with pytest.raises(ValueError, match="num_classes=1 is not valid with "
                                         "classifier_activation='softmax'"):
        ki.models.resnet(20, num_classes=1)
    assert ki.models.resnet(20, num_classes=1, classifier_activation="sigmoid",
                            input_shape=(8, 8, 3)).output_shape == (None, 1)
    with pytest.raises(ValueError, match="num_classes=1 is not valid; expected an integer >= 2"):
        ki.models.highway_net(4, num_classes=1)


def _strided_kernels(unit):
    """The kernel sizes of a bottleneck unit's residual convolutions with stride 2."""
    return [layer.kernel.shape[0] for layer in unit._flatten_layers()
            if isinstance(layer, keras.layers.Conv2D) and layer.strides == (2, 2)
            and layer is not unit.projection]


def test_imagenet_preactivation_nets_stride_the_3x3_as_the_released_model():
    # Table 5's pre-activation ResNets were released with fb.resnet.torch,
    # which strides a bottleneck's 3x3: its weights load into the default
    # model as they are.  The CIFAR nets (the authors' code) and the original
    # ImageNet ResNets (MSRA's release) stride the first 1x1.
    cases = [(ki.models.preact_resnet(50, dataset="imagenet", input_shape=(64, 64, 3)), 3),
             (ki.models.preact_resnet(50, dataset="imagenet", input_shape=(64, 64, 3),
                                      stride_on_1x1=True), 1),
             (ki.models.resnet(50, dataset="imagenet", input_shape=(64, 64, 3)), 1),
             (ki.models.resnet(50, dataset="imagenet", input_shape=(64, 64, 3),
                               stride_on_1x1=False), 3),
             (ki.models.preact_resnet(47, stage_mode="unrolled"), 1)]
    for model, kernel in cases:
        strided = [l for l in model.layers if getattr(l, "strides", 1) == 2
                   and hasattr(l, "stride_on_1x1")]
        assert strided, model.name
        for unit in strided:
            assert unit.stride_on_1x1 is (kernel == 1), (model.name, unit.name)
            assert _strided_kernels(unit) == [kernel], (model.name, unit.name)

import keras
import numpy as np
import pytest
from tests.backend import jax_only
from tests.backend import vjp

import keras_identity as ki
from keras_identity.layers import ResidualUnit
from keras_identity.layers.residual import SHORTCUTS
from keras_identity.layers.residual import UNITS

pytestmark = pytest.mark.quick  # the quick tier (docs/testing.md)


def _unit(input_shape=(2, 6, 6, 8), **kwargs):
    layer = ResidualUnit(kwargs.pop("filters", input_shape[-1]), **kwargs)
    layer.build(input_shape)
    return layer


def _randomize_bn(layer, rng):
    """Non-trivial BN statistics and affine parameters, so orderings differ."""
    for bn in [l for l in layer.layers if isinstance(l, keras.layers.BatchNormalization)]:
        c = bn.gamma.shape[0]
        bn.gamma.assign(rng.uniform(0.5, 1.5, c).astype("float32"))
        bn.beta.assign(rng.normal(0, 0.3, c).astype("float32"))
        bn.moving_mean.assign(rng.normal(0, 0.3, c).astype("float32"))
        bn.moving_variance.assign(rng.uniform(0.5, 2.0, c).astype("float32"))


def _zero_residual(layer):
    """Zeroes the last weight layer of F, so F(x) = 0 for every ordering that
    ends F with that convolution (full pre-activation)."""
    layer.convs[-1].kernel.assign(np.zeros(layer.convs[-1].kernel.shape, "float32"))


def bn(layer, x):
    return layer(x, training=False)


relu = keras.ops.relu


# Each ordering of Fig. 4 written out by hand from the sub-layers.
def _reference(u, x):
    c1, c2 = u.convs
    b = {l.name.rsplit("_", 1)[-1]: l for l in u.layers
         if isinstance(l, keras.layers.BatchNormalization)}
    if u.unit == "original":
        return relu(x + bn(b["bn2"], c2(relu(bn(b["bn1"], c1(x))))))
    if u.unit == "bn_after_addition":
        return relu(bn(b["bn2"], x + c2(relu(bn(b["bn1"], c1(x))))))
    if u.unit == "relu_before_addition":
        return x + relu(bn(b["bn2"], c2(relu(bn(b["bn1"], c1(x))))))
    if u.unit == "relu_only_preactivation":
        return x + bn(b["bn2"], c2(relu(bn(b["bn1"], c1(relu(x))))))
    return x + c2(relu(bn(b["bn2"], c1(relu(bn(b["bn1"], x))))))


@pytest.mark.parametrize("unit", UNITS)
def test_each_ordering_matches_fig4(unit, rng):
    layer = _unit(unit=unit)
    _randomize_bn(layer, rng)
    x = rng.normal(size=(2, 6, 6, 8)).astype("float32")
    np.testing.assert_allclose(layer(x, training=False), _reference(layer, x),
                               rtol=1e-5, atol=1e-5)


def test_orderings_give_different_functions(rng):
    x = rng.normal(size=(2, 6, 6, 8)).astype("float32")
    outputs = []
    for unit in UNITS:
        keras.utils.set_random_seed(7)
        layer = _unit(unit=unit)
        _randomize_bn(layer, np.random.default_rng(1))
        outputs.append(np.asarray(layer(x, training=False)))
    for i in range(len(outputs)):
        for j in range(i + 1, len(outputs)):
            assert np.abs(outputs[i] - outputs[j]).max() > 1e-2, (UNITS[i], UNITS[j])


def test_bottleneck_widths_strides_and_no_bias():
    layer = _unit((2, 8, 8, 64), filters=128, block="bottleneck", strides=2,
                  unit="full_preactivation")
    kernels = [tuple(c.kernel.shape) for c in layer.convs]
    assert kernels == [(1, 1, 64, 32), (3, 3, 32, 32), (1, 1, 32, 128)]
    assert [c.strides for c in layer.convs] == [(2, 2), (1, 1), (1, 1)]
    assert all(not c.use_bias for c in layer.convs)
    assert tuple(layer.projection.kernel.shape) == (1, 1, 64, 128)
    v15 = _unit((2, 8, 8, 64), filters=128, block="bottleneck", strides=2,
                stride_on_1x1=False)
    assert [c.strides for c in v15.convs] == [(1, 1), (2, 2), (1, 1)]
    assert layer.compute_output_shape((None, 8, 8, 64)) == (None, 4, 4, 128)


def test_single_layer_unit():
    layer = _unit(block="single", unit="full_preactivation")
    assert len(layer.convs) == 1 and len(layer.bns) == 1


def test_strided_conv_pads_symmetrically_like_torch(rng):
    """A strided 3x3 conv reads pixels -1..1, 1..3, ... (pad 1 on both sides)."""
    layer = _unit((1, 4, 4, 1), filters=1, block="single", strides=2, unit="full_preactivation",
                  preactivation="none", dimension_shortcut="B")
    kernel = np.zeros((3, 3, 1, 1), "float32")
    kernel[0, 0] = 1.0  # picks the top-left neighbour
    layer.convs[0].kernel.assign(kernel)
    layer.projection.kernel.assign(np.zeros((1, 1, 1, 1), "float32"))
    x = np.arange(16, dtype="float32").reshape(1, 4, 4, 1) + 1.0
    y = np.asarray(layer(x, training=False))[0, :, :, 0]
    # Output (i, j) is centred on input (2i, 2j); its top-left neighbour is
    # (2i-1, 2j-1), which is padding for i = 0 or j = 0.
    np.testing.assert_array_equal(y, [[0.0, 0.0], [0.0, x[0, 1, 1, 0]]])


def test_option_a_has_no_parameters_and_zero_pads(rng):
    layer = _unit((2, 6, 6, 4), filters=8, strides=2, dimension_shortcut="A",
                  unit="full_preactivation")
    assert layer.projection is None and layer.zero_pad is not None
    _zero_residual(layer)
    x = rng.normal(size=(2, 6, 6, 4)).astype("float32")
    y = np.asarray(layer(x, training=False))
    np.testing.assert_allclose(y[..., :4], x[:, ::2, ::2, :], atol=1e-6)
    np.testing.assert_array_equal(y[..., 4:], 0.0)
    option_b = _unit((2, 6, 6, 4), filters=8, strides=2, dimension_shortcut="B",
                     unit="full_preactivation")
    n_params = lambda l: sum(int(np.prod(w.shape)) for w in l.trainable_weights)  # noqa: E731
    assert n_params(option_b) - n_params(layer) == 4 * 8  # the 1x1 projection


@jax_only
@pytest.mark.parametrize("block", ["basic", "bottleneck"])
def test_option_a_unit_of_unknown_size_traces_symbolically(block):
    """JAX export of an any-size model traces H and W as symbols: option A's
    subsampling must write its size as the residual branch's strided
    convolution does, or x + F(x) is refused (a strided slice wrote ceil(H / 2))."""
    import jax

    layer = _unit((2, 6, 6, 4), filters=8, strides=2, dimension_shortcut="A",
                  unit="full_preactivation", block=block)
    spec = jax.ShapeDtypeStruct(jax.export.symbolic_shape("b, h, w, 4"), "float32")
    shape = jax.eval_shape(lambda x: layer(x, training=False), spec).shape
    assert str(shape[1]) == "floordiv(h - 1, 2) + 1" and shape[3] == 8


def test_post_activation_projection_has_bn():
    layer = _unit((2, 6, 6, 4), filters=8, strides=2, unit="original")
    assert layer.projection_bn is not None
    layer = _unit((2, 6, 6, 4), filters=8, strides=2, unit="full_preactivation")
    assert layer.projection_bn is None


def test_shared_preactivation_feeds_both_branches(rng):
    """The first-unit rule: BN-ReLU before the split, the projection reads it."""
    layer = _unit((2, 6, 6, 4), filters=8, strides=2, unit="full_preactivation",
                  preactivation="shared")
    _randomize_bn(layer, rng)
    _zero_residual(layer)
    x = rng.normal(size=(2, 6, 6, 4)).astype("float32")
    pre = relu(layer.bns[0](x, training=False))
    expected = layer.projection(pre)
    np.testing.assert_allclose(layer(x, training=False), expected, rtol=1e-5, atol=1e-5)


def test_post_activation_is_the_last_unit_rule(rng):
    layer = _unit(unit="full_preactivation", post_activation=True)
    _randomize_bn(layer, rng)
    x = rng.normal(size=(2, 6, 6, 8)).astype("float32")
    expected = relu(layer.post_bn(x + layer._residual(x, False), training=False))
    np.testing.assert_allclose(layer(x, training=False), expected, rtol=1e-5, atol=1e-5)


# --- Eqns. (4)-(5) and (7)-(8): signal propagation through k units ----------

def _stack(k, **kwargs):
    inputs = keras.Input((4, 4, 3))
    x = inputs
    units = []
    for i in range(k):
        layer = ResidualUnit(3, unit="full_preactivation", name=f"u{i}", **kwargs)
        x = layer(x)
        units.append(layer)
    for layer in units:
        _zero_residual(layer)
    return keras.Model(inputs, x), units


@pytest.mark.parametrize("depth", [1, 7, 60])
def test_identity_mappings_propagate_signal_unchanged(depth, rng):
    """Eqns. (4), (5): with F = 0, x_L = x_l and dx_L/dx_l = I at any depth."""
    model, _ = _stack(depth)
    x = rng.normal(size=(2, 4, 4, 3)).astype("float32")
    upstream = rng.normal(size=(2, 4, 4, 3)).astype("float32")
    np.testing.assert_allclose(model(x, training=False), x, atol=1e-6)
    grad, _ = vjp(lambda t: model(t, training=False), x, upstream)
    np.testing.assert_allclose(grad, upstream, atol=1e-6)


def test_constant_scaling_scales_gradient_by_lambda_power_k(rng):
    """Eqns. (7), (8): the shortcut path multiplies signal and gradient by lambda^k."""
    k, lam = 6, 0.5
    model, _ = _stack(k, shortcut="constant_scaling", shortcut_scale=lam)
    x = rng.normal(size=(2, 4, 4, 3)).astype("float32")
    np.testing.assert_allclose(model(x, training=False), lam ** k * x, rtol=1e-6)
    grad, _ = vjp(lambda t: model(t, training=False), x, np.ones_like(x))
    np.testing.assert_allclose(grad, np.full(x.shape, lam ** k), rtol=1e-6)
    assert lam ** k == pytest.approx(0.015625)


def test_gradient_through_nonzero_residuals_has_the_identity_term(rng):
    """Eqn. (5): dx_L/dx_l = 1 + d(sum F)/dx_l; removing F leaves exactly 1."""
    inputs = keras.Input((4, 4, 3))
    layer = ResidualUnit(3, unit="full_preactivation")
    model = keras.Model(inputs, layer(inputs))
    x = rng.normal(size=(1, 4, 4, 3)).astype("float32")
    upstream = rng.normal(size=(1, 4, 4, 3)).astype("float32")
    total, _ = vjp(lambda t: model(t, training=False), x, upstream)
    through_f, _ = vjp(lambda t: model(t, training=False) - t, x, upstream)
    np.testing.assert_allclose(total - through_f, upstream, atol=1e-5)


# --- the shortcuts of Fig. 2 ------------------------------------------------

def _residual_only(layer, x):
    """F(x) of a pre-activation unit (its output minus the shortcut)."""
    return layer._residual(x, False)


def test_exclusive_gating_equation(rng):
    layer = _unit(unit="full_preactivation", shortcut="exclusive_gating", gate_bias_init=-2.0)
    _randomize_bn(layer, rng)
    x = rng.normal(size=(2, 6, 6, 8)).astype("float32")
    g = layer.gate(x)
    expected = (1.0 - g) * x + g * _residual_only(layer, x)
    np.testing.assert_allclose(layer(x, training=False), expected, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(layer.gate.bias, -2.0)
    assert layer.gate.kernel.shape == (1, 1, 8, 8)


def test_shortcut_only_gating_equation(rng):
    layer = _unit(unit="full_preactivation", shortcut="shortcut_only_gating",
                  gate_bias_init=-6.0)
    x = rng.normal(size=(2, 6, 6, 8)).astype("float32")
    layer.gate.kernel.assign(np.zeros(layer.gate.kernel.shape, "float32"))
    sig = 1.0 / (1.0 + np.exp(6.0))
    expected = (1.0 - sig) * x + _residual_only(layer, x)
    np.testing.assert_allclose(layer(x, training=False), expected, rtol=1e-5, atol=1e-5)


def test_frozen_gating_scales_both_paths(rng):
    layer = _unit(unit="full_preactivation", shortcut="constant_scaling",
                  shortcut_scale=0.5, scale_residual=True)
    x = rng.normal(size=(2, 6, 6, 8)).astype("float32")
    expected = 0.5 * x + 0.5 * _residual_only(layer, x)
    np.testing.assert_allclose(layer(x, training=False), expected, rtol=1e-5, atol=1e-5)


def test_lambda_zero_is_a_plain_unit_without_shortcut_parameters(rng):
    layer = _unit((2, 6, 6, 4), filters=8, strides=2, unit="full_preactivation",
                  shortcut="constant_scaling", shortcut_scale=0.0, dimension_shortcut="B")
    assert layer.projection is None and layer.zero_pad is None
    x = rng.normal(size=(2, 6, 6, 4)).astype("float32")
    np.testing.assert_allclose(layer(x, training=False), _residual_only(layer, x), atol=1e-6)


def test_conv1x1_shortcut_everywhere(rng):
    layer = _unit(unit="original", shortcut="conv1x1")
    assert layer.projection is not None and layer.projection_bn is not None
    assert layer.projection.kernel.shape == (1, 1, 8, 8)


def test_dropout_shortcut(rng):
    layer = _unit(unit="full_preactivation", shortcut="dropout", shortcut_dropout_rate=0.5,
                  seed=3)
    _zero_residual(layer)
    x = rng.uniform(1.0, 2.0, size=(4, 6, 6, 8)).astype("float32")
    # Inference: the shortcut is scaled by its expectation 1 - rate.
    np.testing.assert_allclose(layer(x, training=False), 0.5 * x, rtol=1e-6)
    # Training: each element is kept as is or dropped, not rescaled.
    y = np.asarray(layer(x, training=True))
    kept = np.isclose(y, x)
    dropped = y == 0.0
    assert np.all(kept | dropped)
    assert 0.4 < dropped.mean() < 0.6


def test_stochastic_depth_drops_whole_residual_branches(rng):
    layer = _unit(unit="full_preactivation", stochastic_depth_rate=0.5, seed=5)
    x = rng.normal(size=(256, 6, 6, 8)).astype("float32")
    f = np.asarray(_residual_only(layer, x))
    np.testing.assert_allclose(layer(x, training=False), x + f, rtol=1e-5, atol=1e-5)
    y = np.asarray(layer(x, training=True))
    f_train = np.asarray(layer._residual(x, True))
    kept = np.all(np.isclose(y, x + 2.0 * f_train, atol=1e-4), axis=(1, 2, 3))
    dropped = np.all(np.isclose(y, x, atol=1e-6), axis=(1, 2, 3))
    assert np.all(kept | dropped)
    assert 0.35 < dropped.mean() < 0.65


# --- all 30 unit x shortcut combinations in a model --------------------------

@pytest.mark.parametrize("shortcut", SHORTCUTS)
@pytest.mark.parametrize("unit", UNITS)
def test_every_unit_and_shortcut_trains_and_round_trips(unit, shortcut, tmp_path, rng):
    model = ki.models.resnet(8, unit=unit, shortcut=shortcut, input_shape=(8, 8, 3),
                             num_classes=3, seed=1)
    x = rng.uniform(size=(4, 8, 8, 3)).astype("float32")
    y = np.array([0, 1, 2, 0])
    before = [w.copy() for w in model.get_weights()]
    model.compile(keras.optimizers.SGD(0.1), "sparse_categorical_crossentropy")
    loss = float(model.train_on_batch(x, y))
    assert np.isfinite(loss)
    changed = sum(not np.array_equal(a, b) for a, b in zip(before, model.get_weights()))
    assert changed >= len(model.trainable_weights)
    path = str(tmp_path / "model.keras")
    model.save(path)
    restored = keras.models.load_model(path, safe_mode=True)
    np.testing.assert_array_equal(np.asarray(restored(x, training=False)),
                                  np.asarray(model(x, training=False)))
    assert restored.get_layer("stage2_unit1").get_config() == \
        model.get_layer("stage2_unit1").get_config()


def test_mixed_precision_keeps_gates_in_float32(rng):
    keras.config.set_dtype_policy("mixed_bfloat16")
    layer = _unit(unit="full_preactivation", shortcut="exclusive_gating")
    x = rng.normal(size=(2, 6, 6, 8)).astype("float32")
    y = layer(x, training=False)
    assert y.dtype == "bfloat16"
    assert layer.convs[0].compute_dtype == "bfloat16"
    assert layer.gate.compute_dtype == "float32" and layer.gate.kernel.dtype == "float32"


# --- bad input ----------------------------------------------------------------

@pytest.mark.parametrize("kwargs, words", [
    (dict(unit="post"), ["unit='post'", "full_preactivation"]),
    (dict(shortcut="gated"), ["shortcut='gated'", "exclusive_gating"]),
    (dict(block="wide"), ["block='wide'", "bottleneck"]),
    (dict(dimension_shortcut="C"), ["dimension_shortcut='C'", "'A'", "'B'"]),
    (dict(shortcut="constant_scaling", shortcut_scale=-0.5), ["shortcut_scale=-0.5"]),
    (dict(shortcut="constant_scaling", shortcut_scale=1.5, scale_residual=True),
     ["shortcut_scale=1.5", "[0, 1]"]),
    (dict(shortcut="dropout", shortcut_dropout_rate=1.0),
     ["shortcut_dropout_rate=1.0", "[0.0, 1.0)"]),
    (dict(stochastic_depth_rate=-0.1), ["stochastic_depth_rate=-0.1"]),
    (dict(shortcut="exclusive_gating", gate_bias_init="low"), ["gate_bias_init='low'"]),
    # Arguments that do not apply to the shortcut are refused, naming the
    # shortcuts that take them.
    (dict(gate_bias_init=-2.0), ["gate_bias_init=-2.0", "shortcut='identity'",
                                 "'exclusive_gating' or 'shortcut_only_gating'"]),
    (dict(shortcut="exclusive_gating", shortcut_scale=0.5),
     ["shortcut_scale=0.5", "shortcut='exclusive_gating'", "'constant_scaling'"]),
    (dict(shortcut="conv1x1", shortcut_dropout_rate=0.2),
     ["shortcut_dropout_rate=0.2", "'dropout'"]),
    (dict(shortcut="dropout", scale_residual=True), ["scale_residual=True", "'constant_scaling'"]),
    (dict(preactivation="shared"), ["preactivation='shared'", "pre-activation units"]),
    (dict(kernel_size=2), ["kernel_size=2", "odd"]),
    (dict(strides=0), ["strides=0"]),
])
def test_bad_arguments_raise_value_error(kwargs, words):
    with pytest.raises(ValueError) as error:
        ResidualUnit(8, **kwargs)
    for word in words:
        assert word in str(error.value)


def test_wrong_rank_is_reported_at_build_time():
    with pytest.raises(ValueError, match=r"4-D input.*shape \(None, 32, 3\)"):
        ResidualUnit(8)(keras.Input((32, 3)))


def test_option_a_cannot_reduce_channels():
    with pytest.raises(ValueError, match="option A"):
        ResidualUnit(4, dimension_shortcut="A")(keras.Input((8, 8, 8)))


# --- one shortcut class per figure; configs ----------------------------------

@pytest.mark.parametrize("shortcut, figure", [
    ("identity", "Fig. 2(a)"), ("constant_scaling", "Fig. 2(b)"),
    ("exclusive_gating", "Fig. 2(c)"), ("shortcut_only_gating", "Fig. 2(d)"),
    ("conv1x1", "Fig. 2(e)"), ("dropout", "Fig. 2(f)")])
def test_each_shortcut_is_one_class_naming_its_figure(shortcut, figure):
    from keras_identity.layers.residual import shortcuts

    instance = shortcuts.get(shortcut)
    assert instance.figure == figure and figure in type(instance).__doc__
    assert ResidualUnit(8, shortcut=shortcut)._shortcut.figure == figure


@pytest.mark.parametrize("shortcut", SHORTCUTS)
def test_config_holds_only_the_arguments_of_its_shortcut(shortcut):
    from keras_identity.layers.residual import shortcuts

    config = ResidualUnit(8, shortcut=shortcut, unit="full_preactivation").get_config()
    present = {p for p in shortcuts.PARAMETERS if p in config}
    assert present == set(shortcuts.get(shortcut).parameters)
    assert ResidualUnit.from_config(config).get_config() == config


# --- deleting a unit (Veit et al. 2016) -------------------------------------------

@pytest.mark.parametrize("kwargs, expected", [
    (dict(unit="full_preactivation"), lambda x, unit: x),
    (dict(unit="original"), lambda x, unit: np.maximum(x, 0)),        # f = ReLU
    (dict(unit="original", shortcut="constant_scaling", shortcut_scale=0.5),
     lambda x, unit: np.maximum(0.5 * x, 0)),
    (dict(unit="full_preactivation", shortcut="constant_scaling", shortcut_scale=0.0),
     lambda x, unit: x),                                               # plain: passes x on
])
def test_a_deleted_unit_outputs_what_its_shortcut_carries(kwargs, expected):
    import keras_identity as ki

    unit = ki.layers.ResidualUnit(8, **kwargs)
    x = np.random.default_rng(0).normal(size=(2, 5, 5, 8)).astype(np.float32)
    whole = keras.ops.convert_to_numpy(unit(x))
    unit.deleted = True
    np.testing.assert_allclose(keras.ops.convert_to_numpy(unit(x)), expected(x, unit),
                               atol=1e-6)
    unit.deleted = False
    np.testing.assert_allclose(keras.ops.convert_to_numpy(unit(x)), whole, atol=1e-6)


def test_a_unit_that_changes_shape_keeps_its_shortcut_and_a_plain_one_cannot_be_deleted():
    import keras_identity as ki

    x = np.random.default_rng(1).normal(size=(2, 6, 6, 4)).astype(np.float32)
    unit = ki.layers.ResidualUnit(8, strides=2, unit="full_preactivation",
                                  dimension_shortcut="A")
    unit(x)
    unit.deleted = True
    out = keras.ops.convert_to_numpy(unit(x))
    np.testing.assert_allclose(out[..., :4], x[:, ::2, ::2], atol=1e-6)   # option A
    np.testing.assert_array_equal(out[..., 4:], 0.0)
    plain = ki.layers.ResidualUnit(8, strides=2, shortcut="constant_scaling",
                                   shortcut_scale=0.0)
    plain(x)
    assert plain.changes_shape and not plain.has_shortcut
    with pytest.raises(ValueError, match="has no shortcut and changes the shape"):
        plain.deleted = True


def test_a_shortcut_object_is_the_same_unit_as_its_name_and_arguments(rng):
    """shortcut= takes a Fig. 2 object carrying its arguments: the unit, its
    config and its output equal those of the name and arguments."""
    import keras_identity as ki

    gate = ki.layers.shortcuts.ExclusiveGating(gate_bias_init=-6.0)
    assert repr(gate) == "ExclusiveGating(gate_bias_init=-6.0)"
    x = rng.normal(size=(2, 6, 6, 8)).astype("float32")
    keras.utils.set_random_seed(3)
    by_object = ki.layers.ResidualUnit(8, shortcut=gate)
    y_object = by_object(x)
    keras.utils.set_random_seed(3)
    by_name = ki.layers.ResidualUnit(8, shortcut="exclusive_gating", gate_bias_init=-6.0)
    np.testing.assert_array_equal(keras.ops.convert_to_numpy(y_object),
                                  keras.ops.convert_to_numpy(by_name(x)))
    assert by_object.get_config() == dict(by_name.get_config(), name=by_object.name)
    stack = ki.layers.ResidualStack(8, 2, shortcut=gate)
    assert (stack.shortcut, stack.gate_bias_init) == ("exclusive_gating", -6.0)
    model = ki.models.resnet(8, shortcut=gate, stage_mode="unrolled")
    gates = [w for w in model.weights if w.path.endswith("gate/bias")]
    assert gates and all(np.all(keras.ops.convert_to_numpy(w) == -6.0) for w in gates)
    with pytest.raises(ValueError, match="gate_bias_init=-2.0 is given beside shortcut="
                                         r"ExclusiveGating\(gate_bias_init=-6.0\)"):
        ki.layers.ResidualUnit(8, shortcut=gate, gate_bias_init=-2.0)
    with pytest.raises(ValueError, match="ExclusiveGating .Fig. 2.c.. takes gate_bias_init; "
                                         "got bias_init"):
        ki.layers.shortcuts.ExclusiveGating(bias_init=-6.0)
    with pytest.raises(ValueError, match="shortcut=3 is not valid"):
        ki.layers.ResidualUnit(8, shortcut=3)

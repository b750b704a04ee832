"""ResidualStack: the looped form of a run of identical units must compute
exactly what the unrolled ResidualUnit layers compute."""

import os

import numpy as np
import pytest
import keras
from keras import ops

from keras_identity.layers import ResidualStack
from keras_identity.layers import ResidualUnit
from keras_identity.layers.residual import SHORTCUTS
from keras_identity.layers.residual import UNITS
from tests.backend import BACKEND
from tests.backend import jax_only
from tests.backend import mse
from tests.backend import tensorflow_only
from tests.backend import value_and_grad
from tests.combinations import BLOCKS
from tests.combinations import ORDERING_SHORTCUT_BLOCK
from tests.combinations import pairs

pytestmark = pytest.mark.quick  # the quick tier (docs/testing.md)

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(
    __file__)))))

# Arguments that make each shortcut's looped form do something visible.
SHORTCUT_ARGS = {
    "identity": {}, "constant_scaling": dict(shortcut_scale=0.7, scale_residual=True),
    "exclusive_gating": dict(gate_bias_init=-1.0),
    "shortcut_only_gating": dict(gate_bias_init=1.0), "conv1x1": {},
    "dropout": dict(shortcut_dropout_rate=0.3)}


def _pair(unit, block, num_units=3, filters=8, recompute="none", shortcut="identity",
          rates=None, size=6):
    """An unrolled chain of units and a stack holding the same weights (and,
    for random shortcuts, the same seeds: unit j of the stack draws as the
    unrolled unit seeded ``seed + j``)."""
    kwargs = dict(block=block, unit=unit, shortcut=shortcut, **SHORTCUT_ARGS[shortcut])
    inputs = keras.Input((size, size, filters))
    x = inputs
    for j in range(num_units):
        x = ResidualUnit(filters, name=f"stage1_unit{j + 2}", seed=10 + j,
                         stochastic_depth_rate=0.0 if rates is None else rates[j],
                         **kwargs)(x)
    unrolled = keras.Model(inputs, x)
    stack = ResidualStack(filters, num_units, recompute=recompute, name="stage1_units2to4",
                          seed=10, stochastic_depth_rates=rates, **kwargs)
    looped = keras.Sequential([keras.Input((size, size, filters)), stack])
    for j in range(num_units):
        layer = unrolled.get_layer(f"stage1_unit{j + 2}")
        weights = {}
        for sub in layer.layers:
            for w in sub.weights:
                weights[f"{sub.name[len(layer.name) + 1:]}/{w.name}"] = w.numpy()
        # Make BN parameters and statistics non-trivial so that a wrong
        # mapping shows in the outputs.
        rng = np.random.default_rng(j)
        for name in weights:
            if name.startswith(("bn", "shortcut_bn")):
                weights[name] = rng.uniform(0.5, 1.5, weights[name].shape).astype("float32")
        for sub in layer.layers:
            for w in sub.weights:
                w.assign(weights[f"{sub.name[len(layer.name) + 1:]}/{w.name}"])
        stack.set_unit_weights(j, weights)
    return unrolled, looped, stack


def _loss_and_grads(model, x, y):
    return value_and_grad(model, mse(y), x)


def _sum_of_squares(tensors):
    return sum(float(np.sum(np.square(np.asarray(g, "float32")))) for g in tensors)


def _assert_equal_forms(unrolled, looped, stack, x, target):
    np.testing.assert_allclose(looped(x, training=False), unrolled(x, training=False),
                               rtol=1e-5, atol=1e-5)
    loss_u, grads_u, out_u = _loss_and_grads(unrolled, x, target)
    loss_l, grads_l, out_l = _loss_and_grads(looped, x, target)
    np.testing.assert_allclose(out_l, out_u, rtol=1e-5, atol=1e-5)
    assert abs(float(loss_l) - float(loss_u)) < 1e-5
    for j in range(stack.num_units):
        layer = unrolled.get_layer(f"stage1_unit{j + 2}")
        by_name = {f"{sub.name[len(layer.name) + 1:]}/{w.name}": g
                   for sub in layer.layers for w in sub.trainable_weights
                   for w2, g in zip(unrolled.trainable_variables, grads_u) if w2 is w}
        stacked = {name: g for (name, v) in stack.stacked_variables().items()
                   for v2, g in zip(looped.trainable_variables, grads_l) if v2 is v}
        assert set(stacked) == set(by_name)
        for name, g in by_name.items():
            np.testing.assert_allclose(stacked[name][j], g, rtol=1e-4, atol=1e-5,
                                       err_msg=f"unit {j} {name}")
        expected = {f"{sub.name[len(layer.name) + 1:]}/{w.name}": w.numpy()
                    for sub in layer.layers for w in sub.non_trainable_weights}
        got = stack.unit_weights(j)
        for name, value in expected.items():
            np.testing.assert_allclose(got[name], value, rtol=1e-5, atol=1e-6,
                                       err_msg=f"unit {j} {name}")


def test_the_cases_meet_every_pair_of_ordering_shortcut_and_block():
    every = [(u, s, b) for u in UNITS for s in SHORTCUTS for b in BLOCKS]
    assert pairs(ORDERING_SHORTCUT_BLOCK) == pairs(every)


@pytest.mark.parametrize("unit, shortcut, block", ORDERING_SHORTCUT_BLOCK)
def test_every_shortcut_ordering_and_block_equals_unrolled(unit, shortcut, block):
    """Each Fig. 2 shortcut x Fig. 4 ordering, and each block with each of
    them: outputs, gradients (stacked weights unit by unit, incl. gates and
    1x1 shortcuts) and BN moving statistics of the loop equal those of the
    unrolled units."""
    filters = 16 if block == "bottleneck" else 4
    unrolled, looped, stack = _pair(unit, block, num_units=2, filters=filters,
                                    shortcut=shortcut, size=4)
    assert looped.count_params() == unrolled.count_params()
    rng = np.random.default_rng(1)
    x = rng.normal(size=(3, 4, 4, filters)).astype("float32")
    _assert_equal_forms(unrolled, looped, stack, x,
                        rng.normal(size=x.shape).astype("float32"))


@pytest.mark.parametrize("recompute", ["none", "bn_relu", "unit"])
@pytest.mark.parametrize("shortcut", ["exclusive_gating", "conv1x1", "dropout"])
def test_stochastic_depth_and_recompute_with_every_kind_of_addition(shortcut, recompute):
    # Per-unit drop rates as a tensor in the loop; the random masks of both
    # forms come from the same seeds.
    unrolled, looped, stack = _pair("original" if shortcut == "conv1x1" else
                                    "full_preactivation", "basic", num_units=3,
                                    shortcut=shortcut, rates=[0.2, 0.5, 0.0],
                                    recompute=recompute)
    rng = np.random.default_rng(2)
    x = rng.normal(size=(8, 6, 6, 8)).astype("float32")
    _assert_equal_forms(unrolled, looped, stack, x,
                        rng.normal(size=x.shape).astype("float32"))
    # The masks were drawn: dropping F of some examples changes the output.
    keep_all = np.asarray(looped(x, training=False))
    assert not np.allclose(np.asarray(looped(x, training=True)), keep_all, atol=1e-3)


@pytest.mark.parametrize("unit", UNITS)
@pytest.mark.parametrize("block", ["basic", "bottleneck", "single"])
def test_outputs_gradients_and_bn_statistics_equal_unrolled(unit, block):
    filters = 16 if block == "bottleneck" else 8
    unrolled, looped, stack = _pair(unit, block, filters=filters)
    assert looped.count_params() == unrolled.count_params()
    rng = np.random.default_rng(0)
    x = rng.normal(size=(4, 6, 6, filters)).astype("float32")
    _assert_equal_forms(unrolled, looped, stack, x,
                        rng.normal(size=x.shape).astype("float32"))
    # The training call moved the moving statistics (checked equal above).
    for j in range(stack.num_units):
        moving = {k: v for k, v in stack.unit_weights(j).items() if "moving" in k}
        assert any(not np.allclose(v, 1.0) for v in moving.values())


def test_inference_gradients_equal_unrolled():
    # training=False runs the moving statistics through an automatically
    # differentiated loop (for input saliency, frozen-BN fine-tuning).
    unrolled, looped, _ = _pair("original", "basic")
    x = np.random.default_rng(2).normal(size=(2, 6, 6, 8)).astype("float32")
    grads, saliency = [], []
    for model in (unrolled, looped):
        def loss(out):
            return ops.sum(ops.square(out))
        grads.append(value_and_grad(model, loss, x, training=False)[1])
        saliency.append(value_and_grad(model, loss, x, training=False, sources="inputs")[1])
    np.testing.assert_allclose(saliency[1], saliency[0], rtol=1e-4, atol=1e-5)
    total = [_sum_of_squares(gs) for gs in grads]
    assert total[0] > 0
    np.testing.assert_allclose(total[1], total[0], rtol=1e-4)


@pytest.mark.parametrize("recompute", ["bn_relu", "unit"])
def test_recompute_gives_the_same_gradients(recompute):
    unrolled, looped, stack = _pair("full_preactivation", "bottleneck", filters=16,
                                    recompute=recompute)
    assert ResidualStack.from_config(stack.get_config()).recompute == recompute
    rng = np.random.default_rng(1)
    x = rng.normal(size=(2, 6, 6, 16)).astype("float32")
    target = rng.normal(size=x.shape).astype("float32")
    _, grads_u, _ = _loss_and_grads(unrolled, x, target)
    _, grads_l, _ = _loss_and_grads(looped, x, target)
    total_u, total_l = _sum_of_squares(grads_u), _sum_of_squares(grads_l)
    assert total_u > 0
    np.testing.assert_allclose(total_l, total_u, rtol=1e-4)


@tensorflow_only
@pytest.mark.parametrize("shortcut", ["identity", "exclusive_gating", "conv1x1", "dropout"])
def test_graph_size_does_not_grow_with_units(shortcut):
    import tensorflow as tf

    def ops_in_graph(num_units):
        layer = ResidualStack(16, num_units, block="bottleneck", shortcut=shortcut)
        layer.build((None, 6, 6, 16))
        fn = tf.function(lambda x: layer(x, training=True))
        graph = fn.get_concrete_function(tf.TensorSpec((2, 6, 6, 16))).graph
        return len(graph.get_operations())

    assert ops_in_graph(3) == ops_in_graph(40)


def _equations(jaxpr):
    """The equations of a jaxpr and of the jaxprs inside it (scan bodies,
    remat), in order."""
    for equation in jaxpr.eqns:
        yield equation
        for value in equation.params.values():
            for inner in value if isinstance(value, (tuple, list)) else (value,):
                inner = getattr(inner, "jaxpr", inner)
                if hasattr(inner, "eqns"):
                    yield from _equations(inner)


def _count_equations(jaxpr):
    return sum(1 for _ in _equations(jaxpr))


@jax_only
@pytest.mark.parametrize("recompute", ["none", "bn_relu", "unit"])
@pytest.mark.parametrize("shortcut", ["identity", "exclusive_gating", "conv1x1", "dropout"])
def test_jax_training_program_does_not_grow_with_units(shortcut, recompute):
    # One scanned body whatever the depth: the jaxpr of a training step
    # (forward and gradient) has the same size for 3 and 40 units.
    import jax

    def equations(num_units):
        # Stochastic depth with the dropout shortcut; the identity runs x + F.
        rates = [0.1] * num_units if shortcut == "dropout" else None
        layer = ResidualStack(8, num_units, shortcut=shortcut, recompute=recompute,
                              stochastic_depth_rates=rates, seed=1)
        layer.build((None, 6, 6, 8))
        trainable = [v.value for v in layer.trainable_variables]
        non_trainable = [v.value for v in layer.non_trainable_variables]

        def loss(trainable, x):
            y, _ = layer.stateless_call(trainable, non_trainable, x, training=True)
            return ops.sum(y)

        jaxpr = jax.make_jaxpr(jax.grad(loss))(trainable, np.zeros((2, 6, 6, 8), "float32"))
        return _count_equations(jaxpr.jaxpr)

    assert equations(3) == equations(40)


@jax_only
@pytest.mark.parametrize("recompute", ["none", "bn_relu", "unit"])
@pytest.mark.parametrize("block", ["basic", "bottleneck"])
def test_jax_loop_keeps_no_bfloat16_stack_on_cpu(block, recompute):
    # XLA:CPU writes a bfloat16 slice of a stack by converting the whole
    # stack, at every unit (time quadratic in depth: looped bfloat16
    # ResNet-1001 spent half its step there).  In mixed_bfloat16 the values
    # the forward scan keeps for the backward pass are float32 or uint16 bits
    # (the first scan of the gradient's jaxpr is the forward one; the stacked
    # bfloat16 weights are its inputs, whose slices JAX does not stack again).
    import jax

    if jax.default_backend() != "cpu":
        pytest.skip("the kept values are widened on CPUs only")
    layer = ResidualStack(8, 5, block=block, recompute=recompute, dtype="mixed_bfloat16")
    layer.build((None, 6, 6, 8))
    trainable = [v.value for v in layer.trainable_variables]
    non_trainable = [v.value for v in layer.non_trainable_variables]

    def loss(trainable, x):
        y, _ = layer.stateless_call(trainable, non_trainable, x, training=True)
        return ops.sum(ops.cast(y, "float32"))

    x = ops.cast(np.random.default_rng(0).normal(size=(2, 6, 6, 8)), "bfloat16")
    jaxpr = jax.make_jaxpr(jax.grad(loss))(trainable, x)
    forward = next(e for e in _equations(jaxpr.jaxpr) if e.primitive.name == "scan")
    kept = forward.outvars[forward.params["num_carry"]:]
    assert {str(v.aval.dtype) for v in kept} & {"bfloat16", "float16"} == set()
    assert any(v.aval.shape[1:] == (2, 6, 6, 8) for v in kept)  # activations are kept


@tensorflow_only
@pytest.mark.parametrize("shortcut", ["exclusive_gating", "conv1x1"])
def test_training_graph_of_a_shortcut_stack_does_not_grow(shortcut):
    import tensorflow as tf

    def op_count(num_units):
        layer = ResidualStack(8, num_units, shortcut=shortcut, unit="original")
        layer.build((None, 6, 6, 8))

        @tf.function
        def step(x):
            with tf.GradientTape() as tape:
                loss = tf.reduce_sum(layer(x, training=True))
            return tape.gradient(loss, layer.trainable_weights)

        graph_def = step.get_concrete_function(
            tf.TensorSpec((2, 6, 6, 8))).graph.as_graph_def()
        return len(graph_def.node) + sum(len(f.node_def) for f in graph_def.library.function)

    assert op_count(20) == op_count(40)


def test_shortcut_weights_are_stacked_per_unit():
    gated = ResidualStack(8, 5, shortcut="exclusive_gating", gate_bias_init=-3.0)
    gated.build((None, 6, 6, 8))
    named = gated.stacked_variables()
    assert tuple(named["gate/kernel"].shape) == (5, 1, 1, 8, 8)
    assert named["gate/kernel"].dtype == "float32"
    np.testing.assert_array_equal(named["gate/bias"].numpy(), -3.0)
    projected = ResidualStack(8, 5, shortcut="conv1x1", unit="original")
    projected.build((None, 6, 6, 8))
    assert {n for n in projected.stacked_variables() if n.startswith("shortcut")} == {
        "shortcut_conv/kernel", "shortcut_bn/gamma", "shortcut_bn/beta",
        "shortcut_bn/moving_mean", "shortcut_bn/moving_variance"}
    preact = ResidualStack(8, 5, shortcut="conv1x1", unit="full_preactivation")
    preact.build((None, 6, 6, 8))
    assert [n for n in preact.stacked_variables() if n.startswith("shortcut")] == [
        "shortcut_conv/kernel"]
    # 1 unit of 8 channels: 2 convs 3x3 + 2 BN (gamma, beta) + the 1x1 shortcut.
    assert preact.count_params() == 5 * (2 * 9 * 64 + 2 * 4 * 8 + 64)


@tensorflow_only
def test_weight_gradients_written_per_unit_not_summed_over_the_stack():
    # The backward loop sets each unit's slice of a weight gradient
    # (TensorListSetItem); slicing the stacked tensor instead would add a
    # dense gradient of the whole stack in every iteration (StridedSliceGrad
    # followed by a sum), O(num_units^2) work per step.
    import tensorflow as tf

    layer = ResidualStack(16, 5, block="bottleneck")
    layer.build((None, 6, 6, 16))

    @tf.function
    def step(x):
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(layer(x, training=True))
        return tape.gradient(loss, layer.trainable_weights)

    graph_def = step.get_concrete_function(tf.TensorSpec((2, 6, 6, 16))).graph.as_graph_def()
    op_types = {node.op for node in graph_def.node}
    for function in graph_def.library.function:
        op_types.update(node.op for node in function.node_def)
    assert "TensorListSetItem" in op_types
    assert "StridedSliceGrad" not in op_types


def test_keras_round_trip(tmp_path):
    _, looped, stack = _pair("full_preactivation", "bottleneck", filters=16)
    path = tmp_path / "stack.keras"
    looped.save(path)
    loaded = keras.models.load_model(path, safe_mode=True)
    x = np.random.default_rng(2).normal(size=(2, 6, 6, 16)).astype("float32")
    np.testing.assert_allclose(loaded(x, training=False), looped(x, training=False),
                               rtol=1e-6, atol=1e-6)
    config = loaded.layers[-1].get_config()
    assert config["num_units"] == 3 and config["block"] == "bottleneck"


def test_stacked_kernels_initialised_per_unit():
    layer = ResidualStack(16, 50, block="bottleneck")
    layer.build((None, 8, 8, 16))
    kernel = layer.conv_kernels[1].numpy()  # (50, 3, 3, 4, 4)
    assert kernel.shape == (50, 3, 3, 4, 4)
    # He normal, fan-out = 3*3*4: std sqrt(2/36) in every unit, units differ.
    np.testing.assert_allclose(kernel.std(), np.sqrt(2 / 36), rtol=0.1)
    np.testing.assert_allclose(kernel[7].std(), np.sqrt(2 / 36), rtol=0.3)
    assert not np.allclose(kernel[0], kernel[1])
    first = layer.conv_kernels[0].numpy()  # (50, 1, 1, 16, 4): fan-out 4
    np.testing.assert_allclose(first.std(), np.sqrt(2 / 4), rtol=0.1)


@pytest.mark.parametrize("kwargs, match", [
    (dict(filters=8, num_units=0), "num_units"),
    (dict(filters=8, num_units=2, unit="post"), "unit"),
    (dict(filters=8, num_units=2, block="triple"), "block"),
    (dict(filters=8, num_units=2, kernel_size=2), "kernel_size"),
    (dict(filters=8, num_units=2, recompute="yes"), "recompute='yes'.*'bn_relu'"),
    (dict(filters=8, num_units=2, gate_bias_init=-1.0), "gate_bias_init=-1.0 does not apply"),
    (dict(filters=8, num_units=2, shortcut="dropout", shortcut_scale=0.5),
     "shortcut_scale=0.5 does not apply to shortcut='dropout'"),
    (dict(filters=8, num_units=2, stochastic_depth_rates=[0.1]), "one per unit"),
    (dict(filters=8, num_units=2, stochastic_depth_rates=[0.1, 1.0]),
     "stochastic_depth_rates=1.0"),
])
def test_bad_arguments(kwargs, match):
    with pytest.raises(ValueError, match=match):
        ResidualStack(**kwargs)


@pytest.mark.parametrize("shortcut", SHORTCUTS)
def test_shortcut_config_round_trip(shortcut):
    stack = ResidualStack(8, 3, shortcut=shortcut, stochastic_depth_rates=[0.0, 0.1, 0.2],
                          seed=4, **SHORTCUT_ARGS[shortcut])
    config = stack.get_config()
    assert {k for k in ("shortcut_scale", "scale_residual", "gate_bias_init",
                        "shortcut_dropout_rate") if k in config} == set(SHORTCUT_ARGS[shortcut])
    assert ResidualStack.from_config(config).get_config() == config


def test_input_channels_must_match_filters():
    with pytest.raises(ValueError, match="filters=8"):
        ResidualStack(8, 2)(keras.Input((6, 6, 4)))
    with pytest.raises(ValueError, match="rank|dimensions|channels"):
        ResidualStack(8, 2)(keras.Input((36, 8)))


def test_mixed_precision_computes_in_bfloat16_with_float32_statistics():
    _, looped, stack = _pair("full_preactivation", "bottleneck", filters=16)
    x = np.random.default_rng(3).normal(size=(2, 6, 6, 16)).astype("float32")
    expected = looped(x, training=False)
    try:
        keras.mixed_precision.set_global_policy("mixed_bfloat16")
        config = stack.get_config()
        config.pop("dtype")
        mixed = ResidualStack.from_config(config)
        mixed.build((None, 6, 6, 16))
        for name, variable in mixed.stacked_variables().items():
            variable.assign(stack.stacked_variables()[name])
        got = mixed(x, training=False)
        out = mixed(x, training=True)
    finally:
        keras.mixed_precision.set_global_policy("float32")
    assert got.dtype == "bfloat16" and out.dtype == "bfloat16"
    assert mixed.bn_weights[0][2].dtype == "float32"
    np.testing.assert_allclose(np.asarray(got, "float32"), expected, rtol=0.05, atol=0.1)


def test_bn_relu_recompute_in_bfloat16_gives_the_gradients_of_keeping_everything():
    # TensorFlow: the recomputed BN-ReLU output is computed in the compute
    # dtype from the same input and moments, so the bfloat16 gradients match
    # (float32 ones are checked against the unrolled model above).  JAX: XLA
    # rounds a rematerialised bfloat16 program differently, so both are
    # compared with the float32 gradients instead.
    x = np.random.default_rng(3).normal(size=(2, 6, 6, 16)).astype("float32")
    grads = {}
    try:
        for policy, recompute in (("float32", "none"), ("mixed_bfloat16", "none"),
                                  ("mixed_bfloat16", "bn_relu")):
            keras.mixed_precision.set_global_policy(policy)
            keras.utils.set_random_seed(0)
            stack = ResidualStack(16, 3, block="bottleneck", recompute=recompute)
            stack.build((None, 6, 6, 16))
            grads[policy, recompute] = [np.asarray(g, "float32") for g in value_and_grad(
                stack, lambda y: ops.sum(ops.square(ops.cast(y, "float32"))), x)[1]]
    finally:
        keras.mixed_precision.set_global_policy("float32")
    assert len(grads["mixed_bfloat16", "none"]) == len(grads["mixed_bfloat16", "bn_relu"]) == 9
    for i, expected in enumerate(grads["mixed_bfloat16", "none"]):
        got = grads["mixed_bfloat16", "bn_relu"][i]
        assert float(np.max(np.abs(expected))) > 0
        if BACKEND == "tensorflow":
            np.testing.assert_allclose(got, expected, rtol=1e-3, atol=1e-3)
        else:
            exact = grads["float32", "none"][i]
            for g in (got, expected):
                assert np.linalg.norm(g - exact) < 0.5 * np.linalg.norm(exact)


def test_stochastic_depth_in_the_loop_under_mixed_precision():
    # The per-unit rates are a float32 tensor; the masks are drawn in bfloat16.
    try:
        keras.mixed_precision.set_global_policy("mixed_bfloat16")
        stack = ResidualStack(8, 3, stochastic_depth_rates=[0.1, 0.2, 0.5], seed=1)
        stack.build((None, 6, 6, 8))
        x = np.random.default_rng(0).normal(size=(4, 6, 6, 8)).astype("float32")
        grads = value_and_grad(stack, lambda y: ops.sum(ops.cast(y, "float32")), x)[1]
    finally:
        keras.mixed_precision.set_global_policy("float32")
    assert all(g is not None and np.all(np.isfinite(np.asarray(g, "float32"))) for g in grads)


def test_gated_stack_with_biased_convolutions_has_the_units_parameters():
    # MNIST ResNets give their convolutions biases; the gate has exactly one.
    unrolled = ResidualUnit(8, shortcut="exclusive_gating", use_bias=True)
    unrolled.build((None, 6, 6, 8))
    stack = ResidualStack(8, 3, shortcut="exclusive_gating", use_bias=True)
    stack.build((None, 6, 6, 8))
    assert stack.count_params() == 3 * unrolled.count_params()
    assert [n for n in stack.stacked_variables() if n.startswith("gate")] == [
        "gate/kernel", "gate/bias"]


_FALLBACK_PROGRAM = """
import sys
import keras
import numpy as np
from keras_identity.layers import ResidualStack
from keras_identity.layers.residual import _jax_loop

if sys.argv[1] == "autodiff":  # the control: JAX's own gradient convolutions
    _jax_loop.conv = lambda x, kernel: keras.ops.conv(x, kernel, padding="same")
model = keras.Sequential([
    keras.Input((6, 6, 8)),
    ResidualStack(8, 2, block="basic"),
    ResidualStack(8, 2, block="bottleneck", unit="original", shortcut="conv1x1",
                  recompute="bn_relu"),
    ResidualStack(8, 2, shortcut="exclusive_gating", gate_bias_init=-1.0, recompute="unit"),
    keras.layers.GlobalAveragePooling2D(), keras.layers.Dense(3)])
model.compile("sgd", keras.losses.SparseCategoricalCrossentropy(from_logits=True),
              jit_compile=True)
model.fit(np.ones((4, 6, 6, 8), "float32"), np.zeros((4,), "int32"), epochs=1, verbose=0)
"""


@jax_only
def test_no_convolution_of_a_looped_training_step_falls_back_on_xla_cpu(tmp_path):
    # XLA:CPU logs each convolution it compiles on its unoptimised fallback;
    # the control (JAX's own gradient convolutions in the scan body) shows
    # that the log is read.
    import subprocess
    import sys

    script = tmp_path / "step.py"
    script.write_text(_FALLBACK_PROGRAM)
    env = dict(os.environ, KERAS_BACKEND="jax", JAX_PLATFORMS="cpu", TF_CPP_MIN_LOG_LEVEL="0",
               TF_CPP_VMODULE="thunk_emitter=2")
    env.pop("JAX_COMPILATION_CACHE_DIR", None)  # compiled here, not read from the tests' cache
    fallbacks = {}
    for form in ("written", "autodiff"):
        run = subprocess.run([sys.executable, str(script), form], env=env, cwd=REPO,
                             capture_output=True, text=True, timeout=600)
        assert run.returncode == 0, run.stderr[-2000:]
        assert "thunk_emitter" in run.stderr
        fallbacks[form] = run.stderr.count("Falling back to unoptimized convolution")
    assert fallbacks["autodiff"] > 0
    assert fallbacks["written"] == 0


@jax_only
@pytest.mark.parametrize("kernel_size,dtype", [(1, "float32"), (2, "float32"), (3, "float32"),
                                               (5, "float32"), (3, "bfloat16")])
def test_loop_convolution_gradients_equal_jax_autodiff(kernel_size, dtype):
    # The loop body's convolution on CPUs writes its gradients itself (the
    # input's as a forward NHWC/HWIO convolution, the kernel's as one matrix
    # product per kernel offset, 1x1 convolutions as matrix products); they
    # equal JAX's own, on a non-square image and in bfloat16 too.
    import jax

    from keras_identity.layers.residual import _jax_loop

    rng = np.random.default_rng(kernel_size)
    x, kernel, upstream = (ops.cast(rng.normal(size=shape), dtype) for shape in
                           [(3, 7, 5, 4), (kernel_size, kernel_size, 4, 6), (3, 7, 5, 6)])

    def pullback(conv):
        y, vjp = jax.vjp(conv, x, kernel)
        return (y,) + vjp(upstream)

    written = pullback(_jax_loop.conv)
    autodiff = pullback(lambda x, k: ops.conv(x, k, padding="same"))
    tolerance = {"float32": 1e-4, "bfloat16": 0.25}[dtype]
    for got, expected in zip(written, autodiff):
        assert got.dtype == expected.dtype == dtype
        got, expected = (np.asarray(ops.cast(t, "float32")) for t in (got, expected))
        np.testing.assert_allclose(got, expected, rtol=tolerance / 10, atol=tolerance)
        assert float(np.max(np.abs(expected))) > 1

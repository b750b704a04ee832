"""_tf_loop: the written-out backward pass of looped Residual Units must be
the gradient TensorFlow's automatic differentiation gives; the Fig. 4
programs (orderings) it interprets."""

import os
import subprocess
import sys

import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")  # TensorFlow-only module

from keras_identity.layers.residual import _tf_batch_norm as loop_bn
from keras_identity.layers.residual import _tf_batch_parts as loop_parts
from keras_identity.layers.residual import _tf_loop as unit_loop
from keras_identity.layers.residual import check_recompute
from keras_identity.layers.residual.orderings import unit_program
from keras_identity.layers.residual import UNITS
from tests.backend import tensorflow_only
from tests.conftest import REPO

pytestmark = [tensorflow_only, pytest.mark.core_leg]

CONV = lambda i: ("conv", i)  # noqa: E731
BN = lambda i: ("bn", i)  # noqa: E731
RELU, ADD = ("relu",), ("add",)


def test_programs_follow_figure_4():
    assert unit_program("original", 2) == [
        CONV(0), BN(0), RELU, CONV(1), BN(1), ADD, RELU]
    assert unit_program("bn_after_addition", 2) == [
        CONV(0), BN(0), RELU, CONV(1), ADD, BN(1), RELU]
    assert unit_program("relu_before_addition", 2) == [
        CONV(0), BN(0), RELU, CONV(1), BN(1), RELU, ADD]
    assert unit_program("relu_only_preactivation", 2) == [
        RELU, CONV(0), BN(0), RELU, CONV(1), BN(1), ADD]
    assert unit_program("full_preactivation", 3) == [
        BN(0), RELU, CONV(0), BN(1), RELU, CONV(1), BN(2), RELU, CONV(2), ADD]
    assert unit_program("original", 1) == [CONV(0), BN(0), ADD, RELU]


def test_saved_layout_reuses_relu_outputs_as_convolution_inputs():
    program = unit_program("full_preactivation", 3)
    slots, kinds = unit_loop.saved_layout(program)
    # Per layer: the BN input, three BN reserves, the ReLU output (which the
    # convolution reads too).
    assert len(kinds) == 15
    assert kinds.count("statistics") == 9
    relu_slot = slots[program.index(RELU)]
    assert slots[program.index(CONV(0))] == relu_slot
    assert slots[-1] == ()


def test_bn_relu_recompute_keeps_half_the_feature_maps_of_a_bottleneck():
    # Pre-activation bottleneck with 16 channels and width 4: kept feature
    # channels per pixel are 16 (input) + 16 + 4 + 4 (ReLU outputs) + 4 + 4
    # (BN 2 and 3 inputs) = 48 without recomputation, 16 + 4 + 4 = 24 with
    # the BN-ReLU outputs recomputed; each recomputed BN keeps its two
    # moments (float32 vectors) instead.
    program = unit_program("full_preactivation", 3)
    x = tf.random.normal((2, 5, 5, 16))
    kernels = [tf.random.normal(s) for s in [(1, 1, 16, 4), (3, 3, 4, 4), (1, 1, 4, 16)]]
    bns = [(tf.ones(c), tf.zeros(c)) for c in (16, 4, 4)]
    channels = {}
    for recompute in ("none", "bn_relu"):
        slots, kinds = unit_loop.saved_layout(program, recompute)
        _, _, saved = unit_loop.forward(program, slots, x, kernels, [None] * 3, bns, 1e-5)
        channels[recompute] = sum(saved[i].shape[-1] for i, kind in enumerate(kinds)
                                  if kind == "features")
        if recompute == "bn_relu":
            assert kinds.count("recomputed") == 3 and kinds.count("statistics") == 9 + 6
            assert [slots[k] for k, step in enumerate(program) if step == RELU] == [
                slots[program.index(CONV(i))] for i in range(3)]
    assert channels == {"none": 48, "bn_relu": 24}


def test_check_recompute():
    assert [check_recompute(r) for r in ("none", "bn_relu", "unit")] == ["none", "bn_relu",
                                                                          "unit"]
    with pytest.raises(ValueError, match="recompute='all' is not valid.*'none', 'bn_relu', "
                                         "'unit'"):
        check_recompute("all")
    for value in (True, False, None):
        with pytest.raises(ValueError, match=f"recompute={value} is not valid"):
            check_recompute(value)


def _unit_weights(program, num_layers, channels, use_bias, rng):
    kernels = [tf.constant(rng.normal(scale=0.3, size=(3, 3, channels, channels)),
                           tf.float32) for _ in range(num_layers)]
    biases = [tf.constant(rng.normal(size=channels), tf.float32) if use_bias else None
              for _ in range(num_layers)]
    bns = [(tf.constant(rng.uniform(0.5, 1.5, channels), tf.float32),
            tf.constant(rng.normal(size=channels), tf.float32)) for _ in range(num_layers)]
    return kernels, biases, bns


@pytest.mark.parametrize("recompute", ["none", "bn_relu"])
@pytest.mark.parametrize("unit", UNITS)
@pytest.mark.parametrize("num_layers", [1, 2, 3])
def test_backward_equals_automatic_differentiation(unit, num_layers, recompute):
    rng = np.random.default_rng(num_layers)
    program = unit_program(unit, num_layers)
    slots, kinds = unit_loop.saved_layout(program, recompute)
    kernels, biases, bns = _unit_weights(program, num_layers, 4, True, rng)
    x = tf.constant(rng.normal(size=(3, 5, 5, 4)), tf.float32)
    upstream = tf.constant(rng.normal(size=(3, 5, 5, 4)), tf.float32)
    sources = [x] + kernels + biases + [w for pair in bns for w in pair]
    with tf.GradientTape() as tape:
        tape.watch(sources)
        y, moments, saved = unit_loop.forward(program, slots, x, kernels, biases, bns, 1e-5)
        loss = tf.reduce_sum(y * upstream)
    expected = tape.gradient(loss, sources)
    # What the forward loop would keep: the backward pass recomputes the rest.
    saved = {i: t for i, t in saved.items() if kinds[i] != "recomputed"}
    assert len(saved) == len(kinds) - kinds.count("recomputed")
    # A ReLU directly after a BN: one per layer, but none after the last BN
    # of "original" (the addition comes between) nor before the first
    # convolution of "relu_only_preactivation" (no BN before it).
    per_layer = num_layers - (unit in ("original", "relu_only_preactivation"))
    assert kinds.count("recomputed") == (per_layer if recompute == "bn_relu" else 0)
    dx, dkernels, dbiases, dbns, _ = unit_loop.backward(program, slots, saved, upstream,
                                                     kernels, biases, bns, 1e-5)
    got = [dx] + dkernels + dbiases + [g for pair in dbns for g in pair]
    assert len(moments) == num_layers
    for index, (g, e) in enumerate(zip(got, expected)):
        assert float(tf.reduce_max(tf.abs(e))) > 0
        np.testing.assert_allclose(g, e, rtol=1e-4, atol=1e-4, err_msg=f"source {index}")


@pytest.mark.parametrize("recompute, parts, fused, affine, batch", [
    ("none", 1, False, False, 2), ("bn_relu", 1, False, False, 2), ("unit", 1, False, False, 2),
    ("none", 3, False, False, 2), ("bn_relu", 2, False, False, 2), ("none", 1, True, False, 2),
    ("none", 2, True, False, 2), ("unit", 3, True, False, 2), ("none", 1, False, True, 2),
    ("bn_relu", 2, True, True, 2), ("unit", 2, True, True, 2), ("none", 3, True, True, 2),
    ("none", 2, True, True, 5), ("bn_relu", 3, False, True, 7), ("unit", 2, False, True, 1),
    ("bn_relu", 2, True, True, 1)])
def test_loop_gradient_equals_automatic_differentiation_of_the_units(recompute, parts, fused,
                                                                      affine, batch,
                                                                      monkeypatch):
    # parts > 1: the forward convolutions split along the batch, as with one
    # thread per operation (batch 2 in 3 parts: fewer examples than parts,
    # whole; with the affine form, copies of the batch, below).
    # fused: the last convolution adds the shortcut (oneDNN's fused sum).
    # affine: BN as two matrix products and a depthwise convolution (the AVX2
    # class); with parts > 1 the units run in parts along the batch, BN's
    # moments and gradient over all of them (batch 5 in 2 parts and 7 in 3:
    # unequal parts; fewer examples than parts: copies of the batch).
    monkeypatch.setattr(loop_parts, "conv_parts", lambda: parts)
    monkeypatch.setattr(unit_loop, "fuse_addition", lambda: fused)
    monkeypatch.setattr(loop_bn, "affine_batch_norm", lambda in_parts=False: affine)
    rng = np.random.default_rng(0)
    num_units, num_layers = 3, 2
    program = unit_program("full_preactivation", num_layers)
    slots, _ = unit_loop.saved_layout(program)
    units = [_unit_weights(program, num_layers, 4, False, rng) for _ in range(num_units)]
    kernels = [tf.stack([u[0][i] for u in units]) for i in range(num_layers)]
    gammas = [tf.stack([u[2][i][0] for u in units]) for i in range(num_layers)]
    betas = [tf.stack([u[2][i][1] for u in units]) for i in range(num_layers)]
    x = tf.constant(rng.normal(size=(batch, 5, 5, 4)), tf.float32)
    upstream = tf.constant(rng.normal(size=(batch, 5, 5, 4)), tf.float32)
    sources = [x] + kernels + gammas + betas

    with tf.GradientTape() as tape:
        tape.watch(sources)
        t, expected_moments = x, []
        for j in range(num_units):
            t, moments, _ = unit_loop.forward(
                program, slots, t, [k[j] for k in kernels], [None] * num_layers,
                [(g[j], b[j]) for g, b in zip(gammas, betas)], 1e-5)
            expected_moments.append(moments)
        expected_loss = tf.reduce_sum(t * upstream)
    expected = tape.gradient(expected_loss, sources)

    with tf.GradientTape() as tape:
        tape.watch(sources)
        y, stats = unit_loop.train_loop(program, x, kernels, [None] * num_layers,
                                        list(zip(gammas, betas)), 1e-5, recompute=recompute)
        loss = tf.reduce_sum(y * upstream)
    got = tape.gradient(loss, sources)
    np.testing.assert_allclose(loss, expected_loss, rtol=1e-5)
    for index, (g, e) in enumerate(zip(got, expected)):
        np.testing.assert_allclose(g, e, rtol=1e-4, atol=1e-4, err_msg=f"source {index}")
    for layer, (mean, variance) in enumerate(stats):
        assert mean.shape == (num_units, 4)
        for j in range(num_units):
            np.testing.assert_allclose(mean[j], expected_moments[j][layer][0], atol=1e-5)
            np.testing.assert_allclose(variance[j], expected_moments[j][layer][1],
                                       rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("recompute", ["none", "bn_relu", "unit"])
def test_training_graph_keeps_only_the_saved_layout(recompute, monkeypatch):
    # The forward loop pushes exactly the tensors of saved_layout (15 for a
    # pre-activation bottleneck: 6 feature maps and 9 BN reserves; with
    # bn_relu 3 feature maps, 9 reserves and 6 moments; with unit recompute
    # only the unit's input) and the
    # backward loop pops them; automatic differentiation of the loop would
    # keep every intermediate it meets (about seventy pushes per unit).  The
    # graph's size does not depend on the number of units.
    program = unit_program("full_preactivation", 3)
    rng = np.random.default_rng(0)
    # On any CPU class.
    monkeypatch.setattr(loop_bn, "affine_batch_norm", lambda in_parts=False: False)

    def op_types(num_units):
        units = [_unit_weights(program, 3, 4, False, rng) for _ in range(num_units)]
        stacked = ([tf.stack([u[0][i] for u in units]) for i in range(3)],
                   [tf.stack([u[2][i][0] for u in units]) for i in range(3)],
                   [tf.stack([u[2][i][1] for u in units]) for i in range(3)])

        @tf.function
        def step(x):
            with tf.GradientTape() as tape:
                tape.watch(stacked[0])
                y, _ = unit_loop.train_loop(program, x, stacked[0], [None] * 3,
                                            list(zip(stacked[1], stacked[2])), 1e-5,
                                            recompute=recompute)
                loss = tf.reduce_sum(y)
            return tape.gradient(loss, stacked[0])

        graph_def = step.get_concrete_function(
            tf.TensorSpec((2, 5, 5, 4))).graph.as_graph_def()
        nodes = list(graph_def.node)
        for function in graph_def.library.function:
            nodes.extend(function.node_def)
        return [node.op for node in nodes]

    ops = op_types(20)
    assert "FusedBatchNormGradV3" in ops and "Conv2DBackpropFilter" in ops
    expected = {"none": 15, "bn_relu": 18, "unit": 1}[recompute]
    assert ops.count("TensorListPushBack") == ops.count("TensorListPopBack") == expected
    # bn_relu: the three BN-ReLU outputs are computed again in the backward loop.
    assert ops.count("FusedBatchNormV3") == 3 * (1 + (recompute != "none"))
    assert len(ops) == len(op_types(40))


@pytest.mark.parametrize("parts", [2, 3])
def test_a_convolution_split_along_the_batch_is_the_whole_convolution(parts):
    rng = np.random.default_rng(1)
    kernel = tf.constant(rng.normal(size=(3, 3, 4, 6)), tf.float32)
    bias = tf.constant(rng.normal(size=(6,)), tf.float32)
    split = tf.function(lambda x: loop_parts.convolution(x, kernel, bias, parts),
                        input_signature=[tf.TensorSpec([None, 5, 5, 4], tf.float32)])
    for batch in (1, 2, 5, 16):  # fewer examples than parts: one whole convolution
        x = tf.constant(rng.normal(size=(batch, 5, 5, 4)), tf.float32)
        np.testing.assert_allclose(split(x), loop_parts.convolution(x, kernel, bias), rtol=1e-5,
                                   atol=1e-5)


@pytest.mark.parametrize("parts", [1, 2, 3])
def test_a_convolution_that_adds_the_shortcut_is_the_convolution_plus_the_shortcut(parts):
    rng = np.random.default_rng(2)
    kernel = tf.constant(rng.normal(size=(1, 1, 4, 6)), tf.float32)
    bias = tf.constant(rng.normal(size=(6,)), tf.float32)
    zero = tf.zeros([6])
    for b in (None, bias):
        fused = tf.function(lambda x, s: loop_parts.convolution(x, kernel, b, parts, (s, zero)),
                            input_signature=[tf.TensorSpec([None, 5, 5, 4], tf.float32),
                                             tf.TensorSpec([None, 5, 5, 6], tf.float32)])
        for batch in (1, 2, 5, 16):
            x = tf.constant(rng.normal(size=(batch, 5, 5, 4)), tf.float32)
            shortcut = tf.constant(rng.normal(size=(batch, 5, 5, 6)), tf.float32)
            expected = loop_parts.convolution(x, kernel, b) + shortcut
            np.testing.assert_allclose(fused(x, shortcut), expected, rtol=1e-5, atol=1e-5)


def _onednn_log_of_a_step(module, choice, **env):
    """``(<module>.<choice>(), oneDNN's log of the second training step)`` of
    a looped bottleneck ResNet-29 at batch 4, in a fresh process with oneDNN's
    kernels and its log on (and ``env``)."""
    probe = (
        "import numpy as np, keras, tensorflow as tf\n"
        "import keras_identity as ki\n"
        f"from keras_identity.layers.residual import {module}\n"
        f"print('CHOICE', {module}.{choice}(), flush=True)\n"
        "model = ki.models.preact_resnet(29, block='bottleneck', stage_mode='scan')\n"
        "model.compile(keras.optimizers.SGD(0.1), loss='sparse_categorical_crossentropy')\n"
        "x, y = np.random.rand(4, 32, 32, 3).astype('float32'), np.arange(4)\n"
        "model.train_on_batch(x, y)\n"
        "print('STEP', flush=True)\n"
        "model.train_on_batch(x, y)\n"
        "print('END', flush=True)\n")
    done = subprocess.run([sys.executable, "-c", probe], cwd=REPO, text=True,
                          capture_output=True, timeout=300,
                          env=dict(os.environ, KERAS_BACKEND="tensorflow", ONEDNN_VERBOSE="1",
                                   TF_ENABLE_ONEDNN_OPTS="1", **env))
    assert done.returncode == 0, done.stderr[-2000:]
    out = done.stdout
    return "CHOICE True" in out, out[out.index("STEP"):out.index("END")]


def test_onednn_runs_the_shortcut_addition_inside_the_convolution():
    # In a fresh process with oneDNN's kernels on (the default on AVX-512
    # CPUs) and its log on: each identity unit's last convolution of a
    # training step carries oneDNN's sum post-op (Grappler fused the zero
    # bias and the addition into it), the others do not.
    fusing, step = _onednn_log_of_a_step("_tf_loop", "fuse_addition")
    if not fusing:
        pytest.skip("TensorFlow runs Eigen's kernels here (no oneDNN)")
    convs = [line for line in step.splitlines()
             if ",convolution," in line and ",forward_training," in line]
    fused = [line for line in convs if "attr-post-ops:sum" in line]
    # ResNet-29: 3 units a stage, the first with a projection: 6 identity units.
    assert len(fused) == 6, "\n".join(convs)
    assert len(convs) > len(fused)


@pytest.mark.parametrize("unit", UNITS)
@pytest.mark.parametrize("use_bias", [False, True])
def test_the_fused_addition_changes_no_ordering(unit, use_bias):
    # Every Fig. 4 ordering with the addition done by the convolution before
    # it, where one is (Fig. 4(b), (d), (e)): the same output, moments and
    # saved tensors as the plain unit; the steps after the addition still run.
    rng = np.random.default_rng(3)
    program = unit_program(unit, 2)
    slots, _ = unit_loop.saved_layout(program)
    kernels, biases, bns = _unit_weights(program, 2, 4, use_bias, rng)
    x = tf.constant(rng.normal(size=(3, 5, 5, 4)), tf.float32)
    plain = unit_loop.forward(program, slots, x, kernels, biases, bns, 1e-5)
    fused = unit_loop.forward(program, slots, x, kernels, biases, bns, 1e-5,
                              fused_addition=tf.zeros([4]))
    _assert_same_unit(fused, plain, variance_atol=1e-5)


def _assert_same_unit(got, plain, variance_atol):
    """Two :func:`forward` results of a 2-layer unit: the same output, BN
    moments and saved tensors' slots."""
    np.testing.assert_allclose(got[0], plain[0], rtol=1e-5, atol=1e-5)
    assert len(got[1]) == len(plain[1]) == 2
    for (m1, v1), (m2, v2) in zip(got[1], plain[1]):
        np.testing.assert_allclose(m1, m2, rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(v1, v2, rtol=1e-5, atol=variance_atol)
    assert sorted(got[2]) == sorted(plain[2])


@pytest.mark.parametrize("unit", UNITS)
@pytest.mark.parametrize("parts", [1, 2])
def test_affine_batch_norm_changes_no_ordering(unit, parts):
    # Every Fig. 4 ordering with its training-mode BN computed as the
    # AVX2 class computes it (batch moments by matrix products, the
    # normalisation and a ReLU after it as a depthwise convolution): the same
    # output, moments, saved tensors and BN reserves the gradient reads; with
    # the convolutions split too.
    rng = np.random.default_rng(4)
    program = unit_program(unit, 2)
    slots, _ = unit_loop.saved_layout(program)
    kernels, biases, bns = _unit_weights(program, 2, 4, False, rng)
    x = tf.constant(rng.normal(2.0, 3.0, size=(3, 5, 5, 4)), tf.float32)
    plain = unit_loop.forward(program, slots, x, kernels, biases, bns, 1e-5)
    affine = unit_loop.forward(program, slots, x, kernels, biases, bns, 1e-5, parts=parts,
                               affine_bn=True)
    _assert_same_unit(affine, plain, variance_atol=1e-4)
    for slot in plain[2]:
        if plain[2][slot].shape.num_elements():  # reserve 3 is empty in both
            np.testing.assert_allclose(affine[2][slot], plain[2][slot], rtol=1e-4, atol=1e-4)
    # At inference, with moving statistics.
    moving = [(g, b, tf.constant(rng.normal(size=4), tf.float32),
               tf.constant(rng.uniform(0.5, 4.0, 4), tf.float32)) for g, b in bns]
    plain = unit_loop.forward(program, slots, x, kernels, biases, moving, 1e-5, training=False)
    affine = unit_loop.forward(program, slots, x, kernels, biases, moving, 1e-5,
                               training=False, affine_bn=True)
    np.testing.assert_allclose(affine[0], plain[0], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("affine", [False, True])
def test_the_inference_loop_is_the_units_with_moving_statistics(affine, monkeypatch):
    monkeypatch.setattr(loop_bn, "affine_batch_norm", lambda in_parts=False: affine)
    rng = np.random.default_rng(5)
    num_units, num_layers = 3, 3
    program = unit_program("full_preactivation", num_layers)
    slots, _ = unit_loop.saved_layout(program)
    units = [_unit_weights(program, num_layers, 4, False, rng) for _ in range(num_units)]
    moving = [[(g, b, tf.constant(rng.normal(size=4), tf.float32),
                tf.constant(rng.uniform(0.5, 4.0, 4), tf.float32)) for g, b in u[2]]
              for u in units]
    x = tf.constant(rng.normal(size=(2, 5, 5, 4)), tf.float32)
    expected = x
    for j in range(num_units):
        expected, _, _ = unit_loop.forward(program, slots, expected, units[j][0],
                                           [None] * num_layers, moving[j], 1e-5, training=False)
    stack = lambda values: tf.stack(values)  # noqa: E731
    kernels = [stack([u[0][i] for u in units]) for i in range(num_layers)]
    bns = [tuple(stack([m[i][k] for m in moving]) for k in range(4)) for i in range(num_layers)]
    got = unit_loop.inference_loop(program, x, kernels, [None] * num_layers, bns, 1e-5)
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_the_affine_form_replaces_the_fused_op_in_float32_only(dtype, monkeypatch):
    # The graphs of a training step and of the inference loop with the
    # affine form on: float32 BN forward as depthwise convolutions (three a
    # pre-activation bottleneck unit, plus three recomputed with bn_relu),
    # no FusedBatchNormV3; the gradient still FusedBatchNormGradV3.  In
    # bfloat16 the fused op stays (forward and recomputed).
    monkeypatch.setattr(loop_bn, "affine_batch_norm", lambda in_parts=False: True)
    program = unit_program("full_preactivation", 3)
    rng = np.random.default_rng(6)
    units = [_unit_weights(program, 3, 4, False, rng) for _ in range(2)]
    kernels = [tf.cast(tf.stack([u[0][i] for u in units]), dtype) for i in range(3)]
    gammas = [tf.stack([u[2][i][0] for u in units]) for i in range(3)]
    betas = [tf.stack([u[2][i][1] for u in units]) for i in range(3)]

    def ops_of(function, *specs):
        graph_def = tf.function(function).get_concrete_function(*specs).graph.as_graph_def()
        nodes = list(graph_def.node)
        for library_function in graph_def.library.function:
            nodes.extend(library_function.node_def)
        return [node.op for node in nodes]

    def step(x):
        with tf.GradientTape() as tape:
            tape.watch(kernels)
            y, _ = unit_loop.train_loop(program, x, kernels, [None] * 3,
                                        list(zip(gammas, betas)), 1e-5, recompute="bn_relu")
            loss = tf.reduce_sum(tf.cast(y, tf.float32))
        return tape.gradient(loss, kernels)

    def infer(x):
        bns = [(g, b, tf.zeros_like(g), tf.ones_like(g)) for g, b in zip(gammas, betas)]
        return unit_loop.inference_loop(program, x, kernels, [None] * 3, bns, 1e-5)

    spec = tf.TensorSpec((2, 5, 5, 4), dtype)
    training, inference = ops_of(step, spec), ops_of(infer, spec)
    assert training.count("FusedBatchNormGradV3") == 3
    affine = dtype == "float32"
    assert training.count("DepthwiseConv2dNative") == (6 if affine else 0)
    assert training.count("FusedBatchNormV3") == (0 if affine else 6)
    assert inference.count("DepthwiseConv2dNative") == (3 if affine else 0)
    assert ("FusedBatchNormV3" in inference) is not affine


def test_units_run_in_parts_along_the_batch_with_the_affine_form(monkeypatch):
    # One operation per thread, two at once, and the affine form: the
    # identity units run in two parts along the batch from the loop's input
    # to its output.  Per pre-activation bottleneck unit: each convolution
    # and its two gradients twice, each BN's gradient twice (with its
    # depthwise correction), the feature maps kept per part (6 x 2 + 9 BN
    # statistics) and no concatenation but the loop's output and input
    # gradient.  Otherwise (oneDNN's BN, or a shortcut with weights) whole
    # units, their convolutions split.
    assert loop_parts.batch_parts(2, False, None) == 1
    assert loop_parts.batch_parts(2, True, object()) == 1
    assert loop_parts.batch_parts(1, True, None) == 1
    monkeypatch.setattr(loop_bn, "affine_batch_norm", lambda in_parts=False: True)
    monkeypatch.setattr(loop_parts, "conv_parts", lambda: 2)
    program = unit_program("full_preactivation", 3)
    rng = np.random.default_rng(7)
    units = [_unit_weights(program, 3, 4, False, rng) for _ in range(2)]
    kernels = [tf.stack([u[0][i] for u in units]) for i in range(3)]
    bns = [(tf.stack([u[2][i][0] for u in units]), tf.stack([u[2][i][1] for u in units]))
           for i in range(3)]

    @tf.function
    def step(x):
        with tf.GradientTape() as tape:
            tape.watch(kernels)
            y, _ = unit_loop.train_loop(program, x, kernels, [None] * 3, bns, 1e-5)
            loss = tf.reduce_sum(y)
        return tape.gradient(loss, kernels)

    graph_def = step.get_concrete_function(tf.TensorSpec((None, 5, 5, 4))).graph.as_graph_def()
    ops = [node.op for node in graph_def.node]
    for function in graph_def.library.function:
        ops.extend(node.op for node in function.node_def)
    assert ops.count("Conv2D") == 6
    assert ops.count("Conv2DBackpropFilter") == ops.count("Conv2DBackpropInput") == 6
    assert ops.count("FusedBatchNormGradV3") == 6
    assert ops.count("DepthwiseConv2dNative") == 12
    assert ops.count("TensorListPushBack") == ops.count("TensorListPopBack") == 21
    assert ops.count("ConcatV2") == 2
    # In graph mode, with a batch of 5 (unequal parts) and of 1 (copies).
    for batch in (5, 1):
        x = tf.constant(rng.normal(size=(batch, 5, 5, 4)), tf.float32)
        with tf.GradientTape() as tape:
            tape.watch([x] + kernels)
            t = x
            for j in range(2):
                t, _, _ = unit_loop.forward(program, unit_loop.saved_layout(program)[0], t,
                                            [k[j] for k in kernels], [None] * 3,
                                            [(g[j], b[j]) for g, b in bns], 1e-5)
            loss = tf.reduce_sum(t)
        for got, expected in zip(step(x), tape.gradient(loss, kernels)):
            np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("parts", [2, 3])
def test_units_in_parts_at_every_batch_size_with_static_and_dynamic_shapes(parts, monkeypatch):
    # A stream batched with drop_remainder (or fit/train_on_batch on arrays)
    # traces the step with a static batch size: the parts then have static,
    # unequal sizes where the parts do not divide the batch, copies below
    # `parts` examples.  Every batch size 1-17, each traced with its static
    # shape, and all through one trace of unknown batch size, must give the
    # gradient of automatic differentiation of the whole units.
    monkeypatch.setattr(loop_bn, "affine_batch_norm", lambda in_parts=False: True)
    monkeypatch.setattr(loop_parts, "conv_parts", lambda: parts)
    program = unit_program("full_preactivation", 2)
    slots, _ = unit_loop.saved_layout(program)
    rng = np.random.default_rng(parts)
    units = [_unit_weights(program, 2, 4, False, rng) for _ in range(2)]
    kernels = [tf.stack([u[0][i] for u in units]) for i in range(2)]
    bns = [(tf.stack([u[2][i][0] for u in units]), tf.stack([u[2][i][1] for u in units]))
           for i in range(2)]

    def loop_gradient(x, upstream):
        with tf.GradientTape() as tape:
            tape.watch([x] + kernels)
            y, _ = unit_loop.train_loop(program, x, kernels, [None] * 2, bns, 1e-5)
            loss = tf.reduce_sum(y * upstream)
        return tape.gradient(loss, [x] + kernels)

    def unit_gradient(x, upstream):
        with tf.GradientTape() as tape:
            tape.watch([x] + kernels)
            t = x
            for j in range(2):
                t, _, _ = unit_loop.forward(program, slots, t, [k[j] for k in kernels],
                                            [None] * 2, [(g[j], b[j]) for g, b in bns], 1e-5)
            loss = tf.reduce_sum(t * upstream)
        return tape.gradient(loss, [x] + kernels)

    dynamic = tf.function(loop_gradient).get_concrete_function(
        tf.TensorSpec((None, 5, 5, 4)), tf.TensorSpec((None, 5, 5, 4)))
    for batch in range(1, 18):
        x = tf.constant(rng.normal(size=(batch, 5, 5, 4)), tf.float32)
        upstream = tf.constant(rng.normal(size=(batch, 5, 5, 4)), tf.float32)
        expected = unit_gradient(x, upstream)
        static = tf.function(loop_gradient).get_concrete_function(
            tf.TensorSpec((batch, 5, 5, 4)), tf.TensorSpec((batch, 5, 5, 4)))
        for shapes, step in (("static", static), ("dynamic", dynamic)):
            for index, (g, e) in enumerate(zip(step(x, upstream), expected)):
                assert g.shape == e.shape
                np.testing.assert_allclose(g, e, rtol=1e-4, atol=1e-4,
                                           err_msg=f"{shapes} batch {batch}, source {index}")


def test_affine_batch_norm_is_chosen_where_onednn_stops_below_avx512(monkeypatch):
    from keras_identity import _cpu_kernels

    monkeypatch.setattr(_cpu_kernels, "onednn_enabled", lambda: True)
    monkeypatch.setattr(_cpu_kernels, "onednn_below_avx512", lambda: True)
    assert loop_bn.affine_batch_norm() is not bool(tf.config.list_physical_devices("GPU"))
    monkeypatch.setattr(_cpu_kernels, "onednn_below_avx512", lambda: False)
    assert not loop_bn.affine_batch_norm()
    # Units in parts along the batch: on any CPU with oneDNN's kernels.
    assert loop_bn.affine_batch_norm(in_parts=True) is not bool(
        tf.config.list_physical_devices("GPU"))
    monkeypatch.setattr(_cpu_kernels, "onednn_below_avx512", lambda: True)
    monkeypatch.setattr(_cpu_kernels, "onednn_enabled", lambda: False)
    assert not loop_bn.affine_batch_norm()
    assert not loop_bn.affine_batch_norm(in_parts=True)


def test_onednn_below_avx512_runs_bn_as_a_depthwise_convolution_with_its_relu():
    # In a fresh process with oneDNN capped at AVX2 (the AVX2 class's
    # kernels): a training step's forward BNs run as depthwise convolutions
    # carrying the ReLU after them (Grappler fused it), none as oneDNN's BN;
    # the backward BNs stay oneDNN's.
    affine, step = _onednn_log_of_a_step("_tf_batch_norm", "affine_batch_norm", ONEDNN_MAX_CPU_ISA="AVX2")
    if not affine:
        pytest.skip("TensorFlow runs Eigen's kernels here, or a CPU without x86 AVX2")
    lines = step.splitlines()
    depthwise = [line for line in lines if ",convolution," in line and "_dw" in line
                 and ",forward_training," in line]
    bn = [line for line in lines if ",batch_normalization," in line]
    forward = [line for line in bn if ",forward_training," in line]
    backward = [line for line in bn if ",backward," in line]
    # ResNet-29: 3 bottleneck units a stage, the first with a projection
    # (a layer of its own), so 6 looped units of 3 BN-ReLU each.
    assert len(depthwise) == 18, "\n".join(depthwise)
    assert all("eltwise_relu" in line for line in depthwise), depthwise[0]
    # oneDNN's forward BN only outside the loop (the three projection units'
    # three and the last BN); its backward BN for all 28.
    assert (len(forward), len(backward)) == (10, 28)


# A program in the README's old order: TensorFlow imported (here with Eigen's
# kernels, as TensorFlow chooses them itself on the AVX2 class) before
# keras_identity, the variable then gone, as in a user's process.
SLOW_ORDER = (
    "import os\n"
    "os.environ['TF_ENABLE_ONEDNN_OPTS'] = '0'\n"
    "import tensorflow as tf, keras\n"
    "del os.environ['TF_ENABLE_ONEDNN_OPTS']\n"
    "import keras_identity as ki\n")
FAST_ORDER = "import keras_identity as ki\nimport keras\n"
TWO_STEPS = (
    "import numpy as np\n"
    "model = ki.models.preact_resnet(20, stage_mode='scan')\n"
    "model.compile(keras.optimizers.SGD(0.1), loss='sparse_categorical_crossentropy')\n"
    "x, y = np.random.rand(2, 32, 32, 3).astype('float32'), np.arange(2)\n"
    "model.train_on_batch(x, y)\n"
    "model.train_on_batch(x, y)\n"
    "model.predict(x, verbose=0)\n"
    "print('END', flush=True)\n")


@pytest.mark.parametrize("order", ["slow", "fast"])
def test_training_on_eigen_after_an_early_import_is_said_once(order):
    # TensorFlow fixes its kernels when imported; a looped model's first
    # training step says so once, in one line naming the remedy and the cost,
    # where keras_identity came too late to choose oneDNN's (and never in the
    # fast order).
    code = (SLOW_ORDER if order == "slow" else FAST_ORDER) + TWO_STEPS
    environ = {k: v for k, v in os.environ.items()
               if k not in ("TF_ENABLE_ONEDNN_OPTS", "KERAS_IDENTITY_CHOSE_ONEDNN_OPTS")}
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO, text=True,
                          capture_output=True, timeout=300,
                          env=dict(environ, KERAS_BACKEND="tensorflow", TF_CPP_MIN_LOG_LEVEL="1"))
    assert done.returncode == 0 and "END" in done.stdout, done.stderr[-2000:]
    said = [line for line in done.stderr.splitlines() if "Eigen CPU kernels" in line]
    avx2_x86 = unit_loop._cpu_kernels._x86() and "avx2" in unit_loop._cpu_kernels.cpu_flags()
    if order == "fast" or not avx2_x86:
        assert said == []
        return
    line, = said  # once, in two steps and a prediction
    assert "imported before keras_identity" in line
    assert "import keras_identity before keras and tensorflow" in line
    assert "TF_ENABLE_ONEDNN_OPTS=1" in line
    assert unit_loop._cpu_kernels.EIGEN_TRAINING_COST in line

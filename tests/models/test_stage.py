import keras

from keras_identity.models import residual_stage


def test_stage_names_strides_and_first_unit_overrides():
    inputs = keras.Input((16, 16, 16))
    out = residual_stage(inputs, stage=2, num_units=3, filters=32, strides=2,
                         unit_kwargs=dict(unit="full_preactivation"),
                         first_unit_kwargs=dict(preactivation="shared"),
                         stochastic_depth_rates=[0.1, 0.2, 0.3])
    model = keras.Model(inputs, out)
    units = [model.get_layer(f"stage2_unit{i}") for i in (1, 2, 3)]
    assert [u.strides for u in units] == [2, 1, 1]
    assert [u.preactivation for u in units] == ["shared", "residual", "residual"]
    assert [u.stochastic_depth_rate for u in units] == [0.1, 0.2, 0.3]
    assert out.shape == (None, 8, 8, 32)


# --- looped ("scan") stages ----------------------------------------------------

import numpy as np  # noqa: E402
import pytest  # noqa: E402

import keras_identity as ki  # noqa: E402
from tests.backend import BACKEND  # noqa: E402
from keras_identity.layers import ResidualStack  # noqa: E402
from keras_identity.layers import ResidualUnit  # noqa: E402
from keras_identity.models import transfer_weights  # noqa: E402



def _trainable(model):
    return sum(int(np.prod(w.shape)) for w in model.trainable_weights)


def test_scan_stage_names_and_shapes():
    inputs = keras.Input((16, 16, 16))
    out = residual_stage(inputs, stage=2, num_units=5, filters=32, strides=2,
                         unit_kwargs=dict(unit="full_preactivation"),
                         first_unit_kwargs=dict(preactivation="shared"), stage_mode="scan")
    model = keras.Model(inputs, out)
    assert [l.name for l in model.layers][1:] == ["stage2_unit1", "stage2_units2to5"]
    stack = model.get_layer("stage2_units2to5")
    assert stack.num_units == 4 and stack.first_unit == 2
    assert out.shape == (None, 8, 8, 32)


@pytest.mark.parametrize("depth, expected", [(164, 1_703_258), (1001, 10_327_706)])
def test_scan_models_have_the_papers_parameter_counts(depth, expected):
    model = ki.models.preact_resnet(depth, stage_mode="scan")
    assert _trainable(model) == expected
    # The graph does not grow with depth: 3 units and 3 stacks at any depth.
    assert len([l for l in model.layers if isinstance(l, ResidualUnit)]) == 3
    assert len([l for l in model.layers if isinstance(l, ResidualStack)]) == 3


def test_auto_mode_loops_deep_stages_only():
    deep = ki.models.preact_resnet(164)
    assert isinstance(deep.get_layer("stage2_units2to18"), ResidualStack)
    shallow = ki.models.resnet(20)
    assert isinstance(shallow.get_layer("stage2_unit3"), ResidualUnit)
    # Every shortcut of Fig. 2 is looped, with the same parameter count.
    for shortcut in ("exclusive_gating", "conv1x1", "dropout"):
        looped = ki.models.resnet(164, shortcut=shortcut)
        assert isinstance(looped.get_layer("stage2_units2to18"), ResidualStack)
        assert _trainable(looped) == _trainable(
            ki.models.resnet(164, shortcut=shortcut, stage_mode="unrolled"))
    sd = ki.models.preact_resnet(164, stochastic_depth_rate=0.5)
    stack = sd.get_layer("stage3_units2to18")
    assert stack.stochastic_depth_rates[0] == pytest.approx(0.5 * 38 / 54)
    assert stack.stochastic_depth_rates[-1] == pytest.approx(0.5)


@pytest.mark.parametrize("unit", ["full_preactivation", "original"])
def test_transfer_weights_both_ways_same_outputs(unit):
    kwargs = dict(unit=unit, input_shape=(8, 8, 3), seed=0)
    unrolled = ki.models.resnet(29, stage_mode="unrolled", **kwargs)
    looped = ki.models.resnet(29, stage_mode="scan", seed=1,
                              **{k: v for k, v in kwargs.items() if k != "seed"})
    assert _trainable(unrolled) == _trainable(looped)
    x = np.random.default_rng(0).normal(size=(3, 8, 8, 3)).astype("float32")
    assert not np.allclose(unrolled(x), looped(x))
    transfer_weights(unrolled, looped)
    np.testing.assert_allclose(looped(x, training=False), unrolled(x, training=False),
                               rtol=1e-5, atol=1e-6)
    back = ki.models.resnet(29, stage_mode="unrolled", seed=5,
                            **{k: v for k, v in kwargs.items() if k != "seed"})
    transfer_weights(looped, back)
    for a, b in zip(unrolled.weights, back.weights):
        np.testing.assert_array_equal(a.numpy(), b.numpy())


def test_transfer_weights_rejects_different_networks():
    a = ki.models.preact_resnet(29, stage_mode="scan", input_shape=(8, 8, 3))
    b = ki.models.preact_resnet(38, stage_mode="scan", input_shape=(8, 8, 3))
    with pytest.raises(ValueError, match="transfer_weights"):
        transfer_weights(a, b)


def _both_forms(builder, depth, **kwargs):
    """The unrolled and the looped form of one network, with the same weights."""
    unrolled = builder(depth, stage_mode="unrolled", **kwargs)
    looped = builder(depth, stage_mode="scan", **kwargs)
    transfer_weights(unrolled, looped)
    return unrolled, looped


def _loop_bn_differs():
    if BACKEND != "tensorflow":
        return False
    from keras_identity.layers.residual import _tf_batch_norm, _tf_batch_parts

    return _tf_batch_norm.affine_batch_norm(in_parts=_tf_batch_parts.conv_parts() > 1)


# Through fit (training flag, seeds, moving statistics, the optimizer): the
# identity, a gate, a projection and the random masks; every ordering x
# shortcut is compared layer by layer in tests/layers/residual/test_stack.py.
@pytest.mark.parametrize("unit, kwargs", [
    ("full_preactivation", {}),
    # Gates: the loop's written gate gradient and the layers' automatic one
    # round differently (weights agree to 1e-6 after a step); at learning rate
    # 0.1 on this 8-image batch the training is chaotic enough to grow that
    # to 1e-3 in the losses within four steps, so these train at 1e-3.
    ("full_preactivation", dict(shortcut="exclusive_gating", gate_bias_init=-2.0,
                                learning_rate=1e-3)),
    ("original", dict(shortcut="conv1x1")),
    ("full_preactivation", dict(shortcut="dropout", shortcut_dropout_rate=0.2)),
    # Stochastic depth at 0.5 makes the training as chaotic as the gates: on
    # some CPUs the forms' predictions drift 5e-3 apart by lr 0.1 (the
    # losses still agree to 1e-4), so it trains at 1e-3 too.
    ("full_preactivation", dict(stochastic_depth_rate=0.5, learning_rate=1e-3)),
])
def test_scan_model_trains_like_unrolled_with_fit(unit, kwargs):
    # Same seed for both forms: the random masks (dropout shortcut,
    # stochastic depth) of unrolled unit k and looped unit k are the same.
    kwargs = dict(input_shape=(8, 8, 3), unit=unit, seed=0, **kwargs)
    learning_rate = kwargs.pop("learning_rate", 0.1)
    # JAX: XLA compiles each form's whole step and fuses them differently, so
    # the forms round differently in every case (weights agree to 1e-7 after
    # a step); "original" with 1x1 shortcuts grows such differences ~500-fold
    # per step on ResNet-29's 8x8 inputs, where it was measured (a
    # perturbation of 1e-7 in the unrolled model's weights does the same), so
    # JAX compares one epoch of two steps at the gates' learning rate.  The
    # comparison runs on ResNet-20, which loops 3 units a stage as -29 does.
    # TensorFlow below AVX-512 with oneDNN: the loop's BN takes its depthwise
    # form (_tf_batch_norm.affine_batch_norm) and the layers keep oneDNN's, so the
    # forms round differently there too (relative 1e-6 a forward pass).
    rounds_differently = BACKEND == "jax" or _loop_bn_differs()
    epochs = 1 if rounds_differently else 2
    if rounds_differently:
        learning_rate = 1e-3
    unrolled, looped = _both_forms(ki.models.resnet, 20, **kwargs)
    rng = np.random.default_rng(0)
    x = rng.normal(size=(16, 8, 8, 3)).astype("float32")
    y = rng.integers(0, 10, size=16)
    losses = []
    for model in (unrolled, looped):
        model.compile(keras.optimizers.SGD(learning_rate, momentum=0.9),
                      loss="sparse_categorical_crossentropy")
        losses.append(model.fit(x, y, batch_size=8, epochs=epochs, shuffle=False,
                                verbose=0).history["loss"])
    np.testing.assert_allclose(losses[1], losses[0], rtol=1e-4)
    # Called directly: predict would trace each form once more.
    np.testing.assert_allclose(keras.ops.convert_to_numpy(looped(x, training=False)),
                               keras.ops.convert_to_numpy(unrolled(x, training=False)),
                               rtol=1e-3, atol=1e-5)


@pytest.mark.skipif(BACKEND != "tensorflow", reason="the TensorFlow loop's split along the batch")
def test_scan_model_trains_in_parts_at_odd_batches_like_unrolled(monkeypatch):
    # With one thread per operation (2 cores, small batches) the looped
    # identity units run in parts along the batch; train_on_batch and fit on
    # arrays trace the step with a static batch size, which 2 parts do not
    # divide at an odd batch.  Same losses and predictions as the unrolled
    # form (automatic differentiation of whole units).
    from keras_identity.layers.residual import _tf_batch_norm, _tf_batch_parts

    monkeypatch.setattr(_tf_batch_parts, "conv_parts", lambda: 2)
    monkeypatch.setattr(_tf_batch_norm, "affine_batch_norm", lambda in_parts=False: True)
    unrolled, looped = _both_forms(ki.models.preact_resnet, 20, input_shape=(8, 8, 3), seed=0)
    rng = np.random.default_rng(0)
    x = rng.normal(size=(14, 8, 8, 3)).astype("float32")
    y = rng.integers(0, 10, size=14)
    losses = []
    for model in (unrolled, looped):
        model.compile(keras.optimizers.SGD(1e-3, momentum=0.9),
                      loss="sparse_categorical_crossentropy")
        steps = [float(model.train_on_batch(x[:b], y[:b])) for b in (3, 5, 7, 1)]
        history = model.fit(x, y, batch_size=7, epochs=1, shuffle=False, verbose=0)
        losses.append(steps + history.history["loss"])
    np.testing.assert_allclose(losses[1], losses[0], rtol=1e-4)
    np.testing.assert_allclose(looped.predict(x, batch_size=5, verbose=0),
                               unrolled.predict(x, batch_size=5, verbose=0),
                               rtol=1e-3, atol=1e-5)


@pytest.mark.parametrize("recompute", ["none", "bn_relu", "unit"])
def test_scan_model_trains_with_xla(recompute):
    model = ki.models.preact_resnet(20, stage_mode="scan", recompute=recompute,
                                    input_shape=(8, 8, 3), seed=0)
    assert model.get_layer("stage1_units2to3").recompute == recompute
    model.compile(keras.optimizers.SGD(0.01), loss="sparse_categorical_crossentropy",
                  jit_compile=True)
    rng = np.random.default_rng(0)
    x = rng.normal(size=(8, 8, 8, 3)).astype("float32")
    y = rng.integers(0, 10, size=8)
    loss = model.fit(x, y, batch_size=8, epochs=3, verbose=0).history["loss"]
    assert np.all(np.isfinite(loss)) and loss[-1] < loss[0]


@pytest.mark.needs_tensorflow
def test_scan_model_keras_and_savedmodel_round_trip(tmp_path):
    import tensorflow as tf

    model = ki.models.preact_resnet(29, stage_mode="scan", input_shape=(8, 8, 3), seed=0)
    x = np.random.default_rng(0).normal(size=(2, 8, 8, 3)).astype("float32")
    expected = model.predict(x, verbose=0)
    model.save(tmp_path / "m.keras")
    loaded = keras.models.load_model(tmp_path / "m.keras", safe_mode=True)
    np.testing.assert_allclose(loaded.predict(x, verbose=0), expected, rtol=1e-5, atol=1e-6)
    model.export(str(tmp_path / "saved"), verbose=False)
    served = tf.saved_model.load(str(tmp_path / "saved"))
    np.testing.assert_allclose(served.serve(x).numpy(), expected, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("kwargs, match", [
    (dict(stage_mode="looped"), "stage_mode"),
    (dict(stage_mode="scan", gate_bias_init=-2.0), "gate_bias_init=-2.0 does not apply to "
     "shortcut='identity'"),
    (dict(shortcut="exclusive_gating", shortcut_scale=0.5), "shortcut_scale=0.5 does not "
     "apply to shortcut='exclusive_gating'; it is an argument of shortcut='constant_scaling'"),
    (dict(stage_mode="unrolled", recompute="unit"), "recompute='unit'.*unrolled"),
    (dict(stage_mode="unrolled", recompute="bn_relu"), "recompute='bn_relu'.*unrolled"),
    (dict(recompute="activations"), "recompute='activations' is not valid"),
    (dict(recompute=True), "recompute=True is not valid"),
])
def test_bad_stage_mode_arguments(kwargs, match):
    with pytest.raises(ValueError, match=match):
        ki.models.resnet(29, **kwargs)


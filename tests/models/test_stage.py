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

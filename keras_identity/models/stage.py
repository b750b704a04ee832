"""The one place where models create their residual units.

Every ResNet builder adds its stages through :func:`residual_stage`, so the
way a stage of ``num_units`` units is realised (one layer per unit today)
can change without touching the builders.
"""

from keras_identity.layers.residual_unit import ResidualUnit


def residual_stage(x, *, stage, num_units, filters, strides, unit_kwargs,
                   first_unit_kwargs=None, stochastic_depth_rates=None):
    """Adds stage ``stage`` (1-based) of ``num_units`` residual units to ``x``.

    Args:
        x: the stage's input (a KerasTensor of a functional model).
        stage: the stage's number, used in the layer names
            (``stage2_unit3``; the unit's weight layers are
            ``stage2_unit3_conv1`` ...).
        num_units: units in the stage.
        filters: output channels of every unit.
        strides: stride of the first unit; the others keep the size.
        unit_kwargs: :class:`ResidualUnit` arguments shared by all units.
        first_unit_kwargs: overrides for the first unit (the unit that changes
            shape, and that may share its pre-activation).
        stochastic_depth_rates: one drop rate per unit, or ``None``.

    Returns:
        The stage's output.
    """
    for index in range(num_units):
        kwargs = dict(unit_kwargs)
        if index == 0 and first_unit_kwargs:
            kwargs.update(first_unit_kwargs)
        if stochastic_depth_rates is not None:
            kwargs["stochastic_depth_rate"] = stochastic_depth_rates[index]
        x = ResidualUnit(filters, strides=strides if index == 0 else 1,
                         name=f"stage{stage}_unit{index + 1}", **kwargs)(x)
    return x

"""Learning-rate schedules of the papers' recipes."""

import math

import keras
from keras import ops


@keras.saving.register_keras_serializable(package="keras_identity")
class WarmupStepDecay(keras.optimizers.schedules.LearningRateSchedule):
    """Constant warm-up, then a base rate divided at fixed iterations.

    ``lr(step) = warmup_rate`` for ``step < warmup_steps``; afterwards
    ``base_rate * factor ** k`` where k counts the ``boundaries`` passed
    (CIFAR: 0.01 for 400 iterations, then 0.1, /10 at 32k and 48k).
    With ``warmup="linear"`` the rate instead ramps linearly from
    ``warmup_rate`` to ``base_rate`` (large-batch ImageNet, Goyal et al.).
    """

    def __init__(self, base_rate, boundaries, factor=0.1, warmup_steps=0, warmup_rate=None,
                 warmup="constant"):
        self.base_rate = float(base_rate)
        self.boundaries = [int(b) for b in boundaries]
        self.factor = float(factor)
        self.warmup_steps = int(warmup_steps)
        self.warmup_rate = self.base_rate if warmup_rate is None else float(warmup_rate)
        if warmup not in ("constant", "linear"):
            raise ValueError(f"warmup={warmup!r} is not valid; expected 'constant' or "
                             f"'linear'.")
        self.warmup = warmup

    def __call__(self, step):
        step = ops.cast(step, "float32")
        passed = sum(ops.cast(step >= b, "float32") for b in self.boundaries) \
            if self.boundaries else ops.zeros(())
        rate = self.base_rate * ops.power(self.factor, passed)
        if self.warmup_steps:
            if self.warmup == "linear":
                fraction = ops.minimum(step / float(self.warmup_steps), 1.0)
                warm = self.warmup_rate + (self.base_rate - self.warmup_rate) * fraction
            else:
                warm = ops.full((), self.warmup_rate)
            rate = ops.where(step < self.warmup_steps, warm, rate)
        return rate

    def get_config(self):
        return dict(base_rate=self.base_rate, boundaries=self.boundaries, factor=self.factor,
                    warmup_steps=self.warmup_steps, warmup_rate=self.warmup_rate,
                    warmup=self.warmup)


@keras.saving.register_keras_serializable(package="keras_identity")
class ExponentialDecay(keras.optimizers.schedules.LearningRateSchedule):
    """``lr(step) = base_rate * decay ** (step / decay_steps)`` (Highway paper,
    Sec. 3.1: "an exponentially decaying learning rate")."""

    def __init__(self, base_rate, decay, decay_steps):
        self.base_rate = float(base_rate)
        self.decay = float(decay)
        self.decay_steps = max(1, int(decay_steps))

    def __call__(self, step):
        step = ops.cast(step, "float32")
        return self.base_rate * ops.power(self.decay, step / float(self.decay_steps))

    def get_config(self):
        return dict(base_rate=self.base_rate, decay=self.decay, decay_steps=self.decay_steps)


@keras.saving.register_keras_serializable(package="keras_identity")
class WarmupCosineDecay(keras.optimizers.schedules.LearningRateSchedule):
    """A linear warm-up, then cosine annealing to ``final_rate`` at ``total_steps``.

    ``lr(step)`` ramps from ``warmup_rate`` to ``base_rate`` over
    ``warmup_steps`` (Goyal et al. 2017), then is
    ``final + (base - final) (1 + cos(pi t)) / 2`` with ``t`` the fraction of
    the remaining steps passed (Loshchilov & Hutter 2017, Eq. 5, one cycle
    without restarts); the ``cifar_cosine`` recipe's schedule.
    """

    def __init__(self, base_rate, total_steps, warmup_steps=0, warmup_rate=None,
                 final_rate=0.0):
        self.base_rate = float(base_rate)
        self.total_steps = int(total_steps)
        self.warmup_steps = int(warmup_steps)
        if self.total_steps < 1:
            raise ValueError(f"total_steps={total_steps!r} is not valid; expected >= 1.")
        if not 0 <= self.warmup_steps < self.total_steps:
            raise ValueError(f"warmup_steps={warmup_steps!r} is not valid; expected 0 <= "
                             f"warmup_steps < total_steps={total_steps!r}.")
        self.warmup_rate = self.base_rate if warmup_rate is None else float(warmup_rate)
        self.final_rate = float(final_rate)

    def __call__(self, step):
        step = ops.cast(step, "float32")
        span = float(self.total_steps - self.warmup_steps)
        fraction = ops.clip((step - self.warmup_steps) / span, 0.0, 1.0)
        rate = self.final_rate + 0.5 * (self.base_rate - self.final_rate) * (
            1.0 + ops.cos(math.pi * fraction))
        if self.warmup_steps:
            ramp = ops.minimum(step / float(self.warmup_steps), 1.0)
            warm = self.warmup_rate + (self.base_rate - self.warmup_rate) * ramp
            rate = ops.where(step < self.warmup_steps, warm, rate)
        return rate

    def get_config(self):
        return dict(base_rate=self.base_rate, total_steps=self.total_steps,
                    warmup_steps=self.warmup_steps, warmup_rate=self.warmup_rate,
                    final_rate=self.final_rate)


def from_recipe(recipe, plan):
    """The Keras ``LearningRateSchedule`` of a recipe (a
    :class:`keras_identity.recipes.Recipe`) resolved for one run
    (``plan``, :func:`keras_identity.recipes.resolve`)."""
    if recipe.schedule == "exponential":
        return ExponentialDecay(plan.learning_rate, recipe.exponential_decay,
                                plan.data_epoch_steps)
    if recipe.schedule == "cosine":
        if plan.warmup_steps and plan.warmup != "linear":
            raise ValueError(f"recipe {recipe.name!r}: a cosine schedule ramps its warm-up "
                             f"linearly; warmup={plan.warmup!r} is not valid.")
        return WarmupCosineDecay(plan.learning_rate, plan.total_steps, plan.warmup_steps,
                                 plan.warmup_rate)
    return WarmupStepDecay(plan.learning_rate, plan.boundaries, recipe.decay_factor,
                           plan.warmup_steps, plan.warmup_rate, plan.warmup)

"""The gate-bias hyper-model.

He et al. (2016), Sec. 3.1: "we conduct hyper-parameter search on the initial
value of b_g in the range of 0 to -10 with a decrement step of -1 on the
training set by cross-validation"; Srivastava et al. (2015) treat the
transform-gate bias as a hyper-parameter (searched between -1 and -10 in
their MNIST study).
"""

import dataclasses

import keras_tuner

from keras_identity.layers.residual import GATED_SHORTCUTS
from keras_identity.models import registry
from keras_identity.training import trainer

DEFAULT_GATE_BIASES = tuple(float(b) for b in range(0, -11, -1))  # 0, -1, ..., -10


def check_tunable(config):
    """Raises ``ConfigError`` unless ``config``'s model has a gate bias to tune."""
    family = config.family
    if family in ("resnet", "preact_resnet"):
        shortcut = config.model_kwargs.get("shortcut")
        if shortcut not in GATED_SHORTCUTS:
            raise trainer.ConfigError(
                f"shortcut={shortcut!r} has no gate bias to tune; expected one of "
                f"{', '.join(repr(s) for s in GATED_SHORTCUTS)}.")
    elif family != "highway_net":
        raise trainer.ConfigError(
            f"model={config.model!r} has no gate bias to tune; expected a ResNet with a gated "
            f"shortcut or highway_net.")


class GateBiasHyperModel(keras_tuner.HyperModel):
    """Builds ``config``'s model with the initial gate bias drawn from the space.

    The space holds ``gate_bias_init`` (b_g of gated ResNet shortcuts, b_T of
    highway layers) with the values ``gate_biases`` (default: exactly the
    paper's 0, -1, ..., -10), and optionally ``learning_rate``,
    ``weight_decay`` and ``depth`` choices.

    Args:
        config: a :class:`TrainConfig` naming the model, dataset and recipe.
        data: the :class:`ImageDataset` the models are built for.
        recipe, schedule: the resolved training recipe of a trial.
        gate_biases: values of b_g / b_T.
        learning_rates, weight_decays, depths: optional extra choices.
    """

    def __init__(self, config, data, recipe, schedule, gate_biases=DEFAULT_GATE_BIASES,
                 learning_rates=None, weight_decays=None, depths=None, normalization=None,
                 **kwargs):
        super().__init__(**kwargs)
        check_tunable(config)
        if not gate_biases:
            raise ValueError("gate_biases is empty; expected at least one value.")
        self.config = config
        self.data = data
        self.recipe = recipe
        self.schedule = schedule
        # The training set's Normalization: each trial's model includes it
        # and takes pixel values (None: the model takes normalised inputs).
        self.normalization = normalization
        self.gate_biases = [float(b) for b in gate_biases]
        self.learning_rates = [float(v) for v in learning_rates or []]
        self.weight_decays = [float(v) for v in weight_decays or []]
        self.depths = [int(v) for v in depths or []]
        for depth in self.depths:
            dataclasses.replace(config, depth=depth).validate()

    def declare(self, hp):
        """Declares the space on ``hp``; returns the chosen values."""
        values = {"gate_bias_init": hp.Choice("gate_bias_init", self.gate_biases,
                                               ordered=True)}
        if self.learning_rates:
            values["learning_rate"] = hp.Choice("learning_rate", self.learning_rates)
        if self.weight_decays:
            values["weight_decay"] = hp.Choice("weight_decay", self.weight_decays)
        if self.depths:
            values["depth"] = hp.Choice("depth", self.depths)
        return values

    def trial_config(self, hp):
        """The :class:`TrainConfig` of the trial ``hp`` describes (the gate
        bias goes to the builder as b_g or b_T, see
        ``keras_identity.models.registry.kwargs_from_flags``)."""
        values = self.declare(hp)
        model_kwargs = dict(self.config.model_kwargs)
        model_kwargs.update(registry.kwargs_from_flags(
            self.config.model, gate_bias_init=values.pop("gate_bias_init")))
        return dataclasses.replace(self.config, model_kwargs=model_kwargs, **values)

    def build(self, hp):
        config = self.trial_config(hp)
        schedule = self.schedule
        if config.learning_rate is not None:
            schedule = dataclasses.replace(schedule, learning_rate=config.learning_rate)
        model = trainer.build_model(config, self.data, seed=config.seed,
                                    normalization=self.normalization)
        return trainer.compile_model(model, trainer.make_optimizer(self.recipe, schedule,
                                                                   config),
                                     config.jit_compile)

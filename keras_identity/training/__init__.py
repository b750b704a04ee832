"""Training: the configuration, schedules, the optimizer, strategies and the loop (the
papers' recipes it runs: :mod:`keras_identity.recipes`)."""

from keras_identity.training.fit_loop import TrainingDiverged
from keras_identity.training.checkpoints import Checkpointer
from keras_identity.training.checkpoints import WriteError
from keras_identity.training.optimizers import MomentumSGD
from keras_identity.training.plots import plot_history
from keras_identity.training.plots import plot_errors
from keras_identity.training.plots import plot_runs
from keras_identity.training.preemption import STOP_STATUS
from keras_identity.training.preemption import Stopped
from keras_identity.training.schedules import ExponentialDecay
from keras_identity.training.schedules import WarmupCosineDecay
from keras_identity.training.schedules import WarmupStepDecay
from keras_identity.training.strategies import get_strategy
from keras_identity.training.config import ConfigError
from keras_identity.training.config import TrainConfig
from keras_identity.training.trained_model import build_model
from keras_identity.training.trained_model import build_optimizer
from keras_identity.training.trained_model import compile_model
from keras_identity.training.trainer import prepare
from keras_identity.training.trainer import train

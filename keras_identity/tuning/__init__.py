"""Keras Tuner search of the initial gate bias, with the paper's protocol."""

from keras_identity.tuning.hypermodel import DEFAULT_GATE_BIASES
from keras_identity.tuning.hypermodel import GateBiasHyperModel
from keras_identity.tuning.search import TUNERS
from keras_identity.tuning.search import SearchConfig
from keras_identity.tuning.search import run_search

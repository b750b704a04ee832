"""Keras Tuner searches with the papers' protocols: the gate bias (He et al.
2016, Sec. 3.1) and the random search of the highway depth study (Srivastava
et al. 2015, Sec. 3.1)."""

from keras_identity.tuning.hypermodel import DEFAULT_GATE_BIASES
from keras_identity.tuning.hypermodel import Range
from keras_identity.tuning.hypermodel import TrainingHyperModel
from keras_identity.tuning.hypermodel import parse_range
from keras_identity.tuning.config import OBJECTIVES
from keras_identity.tuning.config import TUNERS
from keras_identity.tuning.config import SearchConfig
from keras_identity.tuning.progress import SearchStopped
from keras_identity.tuning.search import TrialsFailed
from keras_identity.tuning.search import run_search

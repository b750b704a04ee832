"""Analysis tools: signal propagation, highway gates and lesions, shattered gradients,
deleting residual units."""

from keras_identity.analysis.deletion import deletion_study
from keras_identity.analysis.deletion import plot_deletions

from keras_identity.analysis.gates import GateStatistics
from keras_identity.analysis.gates import error_rate
from keras_identity.analysis.gates import gate_statistics
from keras_identity.analysis.gates import lesion_study
from keras_identity.analysis.gates import plot_gate_statistics
from keras_identity.analysis.gates import plot_lesions
from keras_identity.analysis.propagation import Propagation
from keras_identity.analysis.propagation import plot_propagation
from keras_identity.analysis.propagation import signal_propagation
from keras_identity.analysis.propagation import unit_layers
from keras_identity.analysis.shattered import autocorrelation
from keras_identity.analysis.shattered import feedforward_1d
from keras_identity.analysis.shattered import input_gradients
from keras_identity.analysis.shattered import shattering_study

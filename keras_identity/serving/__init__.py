"""SavedModel export for TF Serving, and checks of its request contract
(TensorFlow's SavedModel: this package needs TensorFlow on every backend)."""

from keras_identity import _tensorflow

_tensorflow.require("exporting or serving a SavedModel (keras_identity.serving)")

from keras_identity.serving.export import export_saved_model
from keras_identity.serving.export import next_version
from keras_identity.serving.signatures import SIGNATURES
from keras_identity.serving.signatures import make_serving_functions

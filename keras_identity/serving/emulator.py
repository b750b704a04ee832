"""Runs a SavedModel the way TF Serving does, to check the serving contract
on machines without ``tensorflow_model_server``.

TF Serving loads a SavedModel version into a TF1-style session (tag
``serve``), looks a request's ``signature_name`` up in the SignatureDefs,
checks each input tensor's dtype against the signature, feeds the tensors
by their graph names and fetches the outputs.  :class:`ServingEmulator` does
the same with ``tf.compat.v1``; :mod:`keras_identity.serving.server` adds the
REST API's JSON formats on top.

TF Serving also turns XLA off unless it is started with
``--xla_cpu_compilation_enabled=true`` (its ``main`` calls TensorFlow's
``DisableXlaCompilation``): a SavedModel whose graph XLA must compile (a
``jit_compile=True`` function, such as ``keras-identity-export
--jit_compile``'s, or the ``XlaCallModule`` of a JAX-backend export) answers
its first request with ``XLA compilation disabled``, and fails to load where
it has warm-up requests.  The emulator refuses such a version unless it is
given the same switch.
"""

import os
import re

import numpy as np
import tensorflow as tf

from keras_identity.serving import warmup as warmup_lib

InvalidArgument = tf.errors.InvalidArgumentError


def latest_version(model_base_path):
    """TF Serving's default version policy: the highest numbered subdirectory."""
    versions = [int(n) for n in os.listdir(model_base_path) if re.fullmatch(r"\d+", n)]
    if not versions:
        raise ValueError(f"{model_base_path} holds no numbered SavedModel versions.")
    return max(versions)


def needs_xla(graph_def):
    """What of ``graph_def`` (a ``GraphDef`` with its function library)
    TensorFlow must compile with XLA to run it: a set naming ``"jit_compile"``
    for a function or call marked ``_XlaMustCompile``
    (``tf.function(jit_compile=True)``) and the ``Xla*`` operations found,
    such as jax2tf's ``XlaCallModule``, which have no kernel outside XLA;
    empty if none."""
    def marked(attrs):
        return "_XlaMustCompile" in attrs and attrs["_XlaMustCompile"].b

    functions = graph_def.library.function
    nodes = [*graph_def.node, *(node for f in functions for node in f.node_def)]
    found = {node.op for node in nodes if node.op.startswith("Xla")}
    if any(marked(node.attr) for node in nodes) or any(marked(f.attr) for f in functions):
        found.add("jit_compile")
    return found


def describe_xla(parts):
    """Words for :func:`needs_xla`'s set: ``"a jit_compile=True function and
    a JAX-backend export's XlaCallModule"``."""
    return " and ".join(
        "a jit_compile=True function" if part == "jit_compile" else
        f"a JAX-backend export's {part}" if part == "XlaCallModule" else part
        for part in sorted(parts))


class XlaDisabledError(ValueError):
    """A version that XLA must compile, refused as TF Serving started
    without ``--xla_cpu_compilation_enabled=true`` fails it; ``parts``: what
    of it XLA compiles (:func:`needs_xla`)."""

    def __init__(self, version_dir, parts):
        self.parts = parts
        super().__init__(
            f"{version_dir} runs its model through XLA ({describe_xla(parts)}): TF Serving "
            f"serves it only when started with --xla_cpu_compilation_enabled=true "
            f"(the emulator: xla_cpu_compilation_enabled=True).")


def _invalid(message):
    return InvalidArgument(None, None, message)


class ServingEmulator:
    """One SavedModel version, served as TF Serving serves it.

    ``xla_cpu_compilation_enabled``: TF Serving's flag of that name; without
    it a version that :func:`needs_xla` is refused (:class:`XlaDisabledError`,
    a ``ValueError``), as TF Serving fails its requests.  ``needs_xla``: what
    of the version XLA compiles (:func:`needs_xla`).
    """

    def __init__(self, version_dir, xla_cpu_compilation_enabled=False):
        if not isinstance(xla_cpu_compilation_enabled, bool):
            raise ValueError(f"xla_cpu_compilation_enabled={xla_cpu_compilation_enabled!r} is "
                             f"not valid; expected True or False.")
        self.version_dir = version_dir
        self.graph = tf.Graph()
        self.session = tf.compat.v1.Session(graph=self.graph)
        from tensorflow.python.util import deprecation

        with self.graph.as_default(), deprecation.silence():
            meta_graph = tf.compat.v1.saved_model.loader.load(
                self.session, [tf.saved_model.SERVING], version_dir)
        self.signature_defs = {name: sig for name, sig in meta_graph.signature_def.items()
                               if not name.startswith("__")}
        self.needs_xla = needs_xla(meta_graph.graph_def)
        if self.needs_xla and not xla_cpu_compilation_enabled:
            self.session.close()
            raise XlaDisabledError(version_dir, self.needs_xla)

    def close(self):
        self.session.close()

    def signature(self, name):
        name = name or "serving_default"
        if name not in self.signature_defs:
            raise _invalid(f"Serving signature name: \"{name}\" not found in signature def")
        return self.signature_defs[name]

    def input_dtypes(self, signature_name):
        sig = self.signature(signature_name)
        return {key: tf.dtypes.as_dtype(info.dtype) for key, info in sig.inputs.items()}

    def run(self, signature_name, inputs):
        """Runs a signature on ``{input name: ndarray or TensorProto}``.

        Returns ``{output name: ndarray}``.  Raises ``InvalidArgumentError``
        (as TF Serving reports it) for unknown/missing inputs, a dtype other
        than the signature's, or a failure inside the graph (e.g. corrupt
        image bytes, a wrong image size).
        """
        sig = self.signature(signature_name)
        unknown = set(inputs) - set(sig.inputs)
        missing = set(sig.inputs) - set(inputs)
        if unknown or missing:
            raise _invalid(f"input names {sorted(inputs)} do not match the signature's "
                           f"{sorted(sig.inputs)}")
        feed = {}
        for index, (key, info) in enumerate(sorted(sig.inputs.items())):
            value = inputs[key]
            if hasattr(value, "dtype") and not isinstance(value, np.ndarray):
                value = tf.make_ndarray(value)  # a TensorProto
            value = np.asarray(value)
            expected = tf.dtypes.as_dtype(info.dtype)
            got = tf.dtypes.as_dtype(value.dtype) if value.dtype != object else tf.string
            if got != expected:
                raise _invalid(f"Expects arg[{index}] to be {expected.name} but "
                               f"{got.name} is provided")
            expected_shape = tf.TensorShape(info.tensor_shape)
            if not expected_shape.is_compatible_with(value.shape):
                raise _invalid(f"input {key!r} has shape {tuple(value.shape)}, which does not "
                               f"match the signature's {expected_shape}")
            feed[info.name] = value
        names = sorted(sig.outputs)
        values = self.session.run([sig.outputs[n].name for n in names], feed)
        return dict(zip(names, values))

    def predict(self, request):
        """Answers a ``tensorflow_serving.apis.predict_pb2.PredictRequest``."""
        predict_pb2, _ = warmup_lib.serving_apis()
        outputs = self.run(request.model_spec.signature_name, dict(request.inputs))
        response = predict_pb2.PredictResponse()
        response.model_spec.CopyFrom(request.model_spec)
        for name, value in outputs.items():
            if request.output_filter and name not in request.output_filter:
                continue
            response.outputs[name].CopyFrom(tf.make_tensor_proto(value))
        return response

    def replay_warmup(self):
        """Runs every warm-up request; returns the responses."""
        return [self.predict(r) for r in warmup_lib.read_warmup(self.version_dir)]

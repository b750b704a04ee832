"""Which convolution kernels TensorFlow runs on the CPU: oneDNN's or Eigen's.

TensorFlow reads ``TF_ENABLE_ONEDNN_OPTS`` once, when it is first imported;
unset, it turns its oneDNN kernels on only on CPUs with AVX512_VNNI,
AVX512_BF16, AVX_VNNI or AMX and runs Eigen's elsewhere (the common AVX2
class: AMD EPYC Zen 2/3, many cloud VMs, older Xeons).  Measured on a 2-core
AVX2 EPYC (docs/performance.md, "TensorFlow's CPU kernels"):

* training: oneDNN trains the looped pre-activation ResNet-164 2.1x and
  ResNet-1001 1.4x faster than Eigen (fit's step, batch 64 and 16);
* inference: oneDNN makes batch-1 serving of the same SavedModel about 10x
  slower.  Grappler fuses each inference-mode BN-ReLU into the convolution
  before it (``_FusedConv2D`` with ``FusedBatchNorm, Relu``); oneDNN runs that
  as a GEMM convolution with four binary post-ops, which takes 13-60x a plain
  convolution of the same shape on AVX2, while Eigen folds the BN into its
  output kernel.

So each path chooses (:func:`choose`), before TensorFlow is imported, unless
the user set ``TF_ENABLE_ONEDNN_OPTS`` (theirs always wins):

* ``"training"`` -- keras-identity-train/-tune, the experiment programs, the
  benchmarks, and a Python program that imports keras_identity: oneDNN on
  (evaluation inside a training run goes with the run's choice);
* ``"inference"`` -- keras-identity-export (its warm-up replay) and
  keras-identity-serve: TensorFlow's own choice for the CPU (Eigen on AVX2).

This module imports nothing but the standard library, so keras_identity's
``__init__`` and the programs can call it before Keras (and TensorFlow) is
imported; :func:`describe` reads the state TensorFlow actually took.
"""

import os
import platform
import sys

VARIABLE = "TF_ENABLE_ONEDNN_OPTS"
# The value keras_identity set, so that a child process (a benchmark's worker,
# a server a test starts) tells an inherited choice of ours from the user's.
MARK = "KERAS_IDENTITY_CHOSE_ONEDNN_OPTS"
PATHS = ("training", "inference")
# The CPU features on which TensorFlow turns oneDNN on by itself (x86 Linux).
_TENSORFLOW_ONEDNN_FEATURES = ("avx512_vnni", "avx512_bf16", "avx_vnni", "amx_tile",
                               "amx_bf16", "amx_int8")

# Why the variable has its value: set by whom (see choose); None until chosen.
_reason = None


def cpu_flags():
    """The CPU's feature flags (``/proc/cpuinfo``; empty where there is none)."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("flags"):
                    return frozenset(line.split(":", 1)[1].split())
    except OSError:
        pass
    return frozenset()


def tensorflow_default(flags=None):
    """Whether TensorFlow turns its oneDNN kernels on by itself on this CPU."""
    flags = cpu_flags() if flags is None else flags
    return any(feature in flags for feature in _TENSORFLOW_ONEDNN_FEATURES)


def _x86():
    return platform.machine().lower() in ("x86_64", "amd64")


def choose(path):
    """Sets ``TF_ENABLE_ONEDNN_OPTS`` for ``path`` (``"training"`` or
    ``"inference"``) unless it is set already or TensorFlow is already
    imported (then nothing can change).  Returns the value in effect (a
    string, or ``None`` for TensorFlow's own choice).

    Only x86 CPUs with AVX2 are chosen for: elsewhere (ARM, whose TensorFlow
    builds make their own choice; CPUs without AVX2) TensorFlow decides.
    """
    global _reason
    if path not in PATHS:
        raise ValueError(f"path={path!r} is not valid; expected one of: {', '.join(PATHS)}")
    if _reason is not None:  # chosen already in this process: the first choice stands
        return os.environ.get(VARIABLE)
    if user_set():
        _reason = "set by you"
        return os.environ[VARIABLE]
    if "tensorflow" in sys.modules:
        _reason = "TensorFlow was imported before keras_identity chose"
        return None
    flags = cpu_flags()
    if not _x86() or "avx2" not in flags:
        _reason = "TensorFlow's own choice for this CPU"
        os.environ.pop(VARIABLE, None)  # an inherited choice of ours
        os.environ.pop(MARK, None)
        return None
    if tensorflow_default(flags):
        value, _reason = "1", "TensorFlow's own choice for this CPU"
    elif path == "training":
        value = "1"
        _reason = f"keras_identity's choice for training on AVX2; {VARIABLE}=0 for Eigen"
    else:
        value = "0"
        _reason = (f"keras_identity's choice for serving on AVX2, where oneDNN's BN-fused "
                   f"convolutions are slow at small batches; {VARIABLE}=1 for oneDNN")
    os.environ[VARIABLE] = os.environ[MARK] = value
    return value


def user_set():
    """Whether ``TF_ENABLE_ONEDNN_OPTS`` is set and not by keras_identity
    (a value inherited from a process where keras_identity chose is ours)."""
    return VARIABLE in os.environ and os.environ[VARIABLE] != os.environ.get(MARK)


def set_kernels(onednn):
    """Sets the kernels as a user would (``TF_ENABLE_ONEDNN_OPTS``, not marked
    as keras_identity's choice), for the processes this one starts too; before
    TensorFlow is imported it decides this process's kernels as well."""
    global _reason
    os.environ[VARIABLE] = "1" if onednn else "0"
    os.environ.pop(MARK, None)
    if "tensorflow" not in sys.modules:
        _reason = "set by you"


def reason():
    """Why the kernels are what they are (None before :func:`choose`)."""
    return _reason


def onednn_enabled():
    """Whether TensorFlow runs its oneDNN kernels (None if TensorFlow is not
    imported: asking would import it and fix the choice)."""
    if "tensorflow" not in sys.modules:
        return None
    try:
        from tensorflow.python.util import _pywrap_util_port
    except ImportError:  # pragma: no cover - a TensorFlow without the query
        return None
    return bool(_pywrap_util_port.IsMklEnabled())


def kernels():
    """``"oneDNN"`` or ``"Eigen"``: the kernels TensorFlow's CPU ops run (None
    where TensorFlow is not imported)."""
    enabled = onednn_enabled()
    return None if enabled is None else ("oneDNN" if enabled else "Eigen")


def describe():
    """One line: the kernels TensorFlow's CPU ops run and why, e.g.
    ``TensorFlow CPU kernels: oneDNN (keras_identity's choice for training:
    ...)``; None where TensorFlow is not imported (the JAX route)."""
    name = kernels()
    if name is None:
        return None
    why = _reason or ("set by you" if user_set() else "TensorFlow's own choice for this CPU")
    return f"TensorFlow CPU kernels: {name} ({why})"

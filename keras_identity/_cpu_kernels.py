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

**The user's value.**  TensorFlow 2.21 reads only ``0``, ``1``, ``false`` or ``true``,
in any case (no spaces, not empty); any other value it ignores with a warning, making
its own choice (``_pywrap_util_port.IsMklEnabled()`` says so).  :func:`choose` refuses
such a value before TensorFlow's import (:func:`invalid_setting`'s line: the programs
exit 2); where TensorFlow was imported first, :func:`describe` says what it did.

**Whose value it is.**  A value in the environment carries no author: a
user's ``TF_ENABLE_ONEDNN_OPTS=1`` is the same string as ours, and no mark
beside it can say who set the variable last.  So keras_identity keeps its
choice out of the environment that the processes it starts inherit:

* :func:`choose` puts it there for TensorFlow to read, and keras_identity's
  import takes it out again (:func:`release`): on TensorFlow's backend
  TensorFlow has read it by then; on another (JAX, whose tf.data imports
  TensorFlow later, if at all) it is put back only while TensorFlow is being
  imported.  A process that imported keras_identity starts its children (a
  server, a shell, a tool) with the environment the user gave it: each
  chooses for its own path, and a value the user sets for it is the user's;
* a program that wants its children to run its choice chooses again for
  the same path, which puts the choice back (benchmarks.run: its workers
  import Keras, and so TensorFlow, before keras_identity).  There it is
  marked ``KERAS_IDENTITY_CHOSE_ONEDNN_OPTS="<value>:<pid>"``, the value set
  and the process that set it; a process takes the variable for
  keras_identity's only when it equals the mark's value and the mark names
  this process or its parent.  A mark that names any other process came
  through one in between (a shell, another program), where a user may have
  exported the variable: it proves nothing, and the variable is the user's.

What no mark can tell apart: a process holding a choice of ours in its
environment (between :func:`choose` and keras_identity's import, or after
choosing again) that passes that same value to a child explicitly, itself
or through a shell that replaces itself with the command.  That child takes
it for ours and chooses for its own path; any other value is the user's.

**Quiet imports.**  A TensorFlow that turns oneDNN on writes ``oneDNN custom
operations are on ...`` (with absl's ``WARNING: All log messages before
absl::InitializeLog() is called are written to STDERR``) once per copy of its
logging, before that reads ``TF_CPP_MIN_LOG_LEVEL``, so neither the level nor the
variable (``=1`` prints it too) keeps it off a program's first screen.
:func:`choose` has TensorFlow's first import apply that level to those lines (its
later messages obey it already); at the default level (0) nothing is filtered.

This module imports only the standard library, so keras_identity's ``__init__`` and
the programs (through keras_identity_cli._preload, without that ``__init__``, which
imports Keras) call it before Keras and TensorFlow are imported.
"""

import importlib.abc
import os
import platform
import re
import sys
import tempfile

VARIABLE = "TF_ENABLE_ONEDNN_OPTS"
# "<value>:<pid>": see the module's docstring, "Whose value it is".
MARK = "KERAS_IDENTITY_CHOSE_ONEDNN_OPTS"
PATHS = ("training", "inference")
# The values TensorFlow reads (any case); it ignores every other one.
VALUES = ("0", "1", "false", "true")
# The CPU features on which TensorFlow turns oneDNN on by itself (x86 Linux).
_TENSORFLOW_ONEDNN_FEATURES = ("avx512_vnni", "avx512_bf16", "avx_vnni", "amx_tile",
                               "amx_bf16", "amx_int8")

# The reason where TensorFlow was imported before choose ran (its kernels are
# then its own choice, fixed at its import).
IMPORTED_FIRST = "TensorFlow was imported before keras_identity chose"
# What Eigen's kernels cost in training where oneDNN's could have run: fit's
# step on a 2-core AVX2 EPYC, float32 (docs/performance.md, "TensorFlow's CPU
# kernels"; benchmarks/results/avx2_cpu_kernels.json).
EIGEN_TRAINING_COST = "ResNet-164 at 0.48x and ResNet-1001 at 0.73x oneDNN's speed"

# Why the variable has its value: set by whom (see choose); None until chosen.
_reason = None
# The value keras_identity chose (None: TensorFlow's own, or the user's) and
# the path it chose for.
_chosen = None
_path = None
# Taken out of the environment (release) before TensorFlow's import: put back
# while TensorFlow is imported.
_pending = False


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


def cores():
    """The CPU cores this process may run on (its affinity, else all)."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


def tensorflow_default(flags=None):
    """Whether TensorFlow turns its oneDNN kernels on by itself on this CPU."""
    flags = cpu_flags() if flags is None else flags
    return any(feature in flags for feature in _TENSORFLOW_ONEDNN_FEATURES)


def _x86():
    return platform.machine().lower() in ("x86_64", "amd64")


def _chosen_for(flags):
    """Whether keras_identity chooses the kernels on a CPU with ``flags``:
    x86 with AVX2 (elsewhere TensorFlow decides)."""
    return _x86() and "avx2" in flags


def _understood(value):
    """Whether TensorFlow reads ``value`` (else it ignores it)."""
    return value.isascii() and value.lower() in VALUES


def invalid_setting():
    """The line that refuses a ``TF_ENABLE_ONEDNN_OPTS`` TensorFlow would
    ignore (e.g. ``junk``, empty, `` 0``); None where it is unset or valid."""
    value = os.environ.get(VARIABLE)
    if value is None or _understood(value) or _ours():
        return None
    return (f"{VARIABLE}={value!r} is not valid; expected 0 or false (Eigen's kernels), "
            f"1 or true (oneDNN's), in any case, or unset for the choice of "
            f"keras_identity and TensorFlow")


def _ours():
    """Whether ``TF_ENABLE_ONEDNN_OPTS`` holds a choice of keras_identity's:
    equal to the mark's value, the mark set by this process or its parent
    (see the module's docstring for what the mark can and cannot prove)."""
    value, _, pid = os.environ.get(MARK, "").rpartition(":")
    if VARIABLE not in os.environ or os.environ[VARIABLE] != value:
        return False
    return pid.isdigit() and int(pid) in (os.getpid(), os.getppid())


def _export(value):
    os.environ[VARIABLE] = value
    os.environ[MARK] = f"{value}:{os.getpid()}"


def choose(path):
    """Sets ``TF_ENABLE_ONEDNN_OPTS`` for ``path`` (``"training"`` or
    ``"inference"``) unless the user set it or TensorFlow is already
    imported (then nothing can change).  Returns the value in effect (a
    string, or ``None`` for TensorFlow's own choice).  Raises ValueError
    (:func:`invalid_setting`) for a value TensorFlow would ignore.

    Only x86 CPUs with AVX2 are chosen for (elsewhere, ARM builds included,
    TensorFlow decides).  A process's first choice stands; choosing again for
    the same path puts it back where :func:`release` took it out, for the
    processes this one starts."""
    global _reason, _chosen, _path, _pending
    if path not in PATHS:
        raise ValueError(f"path={path!r} is not valid; expected one of: {', '.join(PATHS)}")
    if "tensorflow" not in sys.modules:
        _quiet_tensorflow_import()
    if _reason is not None:  # chosen already in this process: the first choice stands
        if path == _path and _chosen is not None and VARIABLE not in os.environ:
            _export(_chosen)  # released: back for the children
            _pending = False
        return os.environ.get(VARIABLE, _chosen)
    if VARIABLE in os.environ and not _ours():
        os.environ.pop(MARK, None)  # a mark inherited from elsewhere proves nothing
        if "tensorflow" in sys.modules:
            _reason = _users_reason()
            return os.environ[VARIABLE]
        problem = invalid_setting()
        if problem:
            raise ValueError(problem)
        _reason = "set by you"
        return os.environ[VARIABLE]
    if "tensorflow" in sys.modules:
        _reason = IMPORTED_FIRST
        return None
    flags = cpu_flags()
    if not _chosen_for(flags):
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
    _chosen, _path = value, path
    _export(value)
    return value


def release():
    """Takes this process's choice (not a user's) out of the environment, so that
    its children choose for themselves; keras_identity's import calls it, after
    Keras's.  Returns whether there was a choice of ours to take out."""
    global _pending
    if not _ours():
        return False
    os.environ.pop(VARIABLE)
    os.environ.pop(MARK)
    _pending = "tensorflow" not in sys.modules and _chosen is not None
    return True


def user_set():
    """Whether ``TF_ENABLE_ONEDNN_OPTS`` is set and not by keras_identity
    (see the module's docstring: whose value it is)."""
    return VARIABLE in os.environ and not _ours()


def set_kernels(onednn):
    """Sets the kernels as a user would (``TF_ENABLE_ONEDNN_OPTS``, not marked
    as keras_identity's choice), for the processes this one starts too; before
    TensorFlow is imported it decides this process's kernels as well."""
    global _reason, _chosen
    os.environ[VARIABLE] = "1" if onednn else "0"
    os.environ.pop(MARK, None)
    _chosen = None
    if "tensorflow" not in sys.modules:
        _reason = "set by you"


def reason():
    """Why the kernels are what they are (None before :func:`choose`)."""
    return _reason


def _users_reason():
    value = os.environ[VARIABLE]
    if _understood(value):
        return "set by you"
    return (f"{VARIABLE}={value!r} is not a value TensorFlow reads, so it made its own "
            f"choice for this CPU")


def training_notice():
    """One line for a training step on Eigen's kernels where keras_identity
    would have chosen oneDNN's (an x86 AVX2 CPU, no choice of the user's) but
    TensorFlow, imported first (a program that imported Keras or TensorFlow
    before keras_identity), fixed its kernels for the process then; None
    otherwise (also where TensorFlow is not imported)."""
    if _reason != IMPORTED_FIRST or user_set() or onednn_enabled() is not False:
        return None
    if not _chosen_for(cpu_flags()):
        return None
    return (f"TensorFlow trains on its Eigen CPU kernels here, since it was imported "
            f"before keras_identity and fixed its kernels then; on this CPU they train "
            f"{EIGEN_TRAINING_COST}: import keras_identity before keras and tensorflow, or "
            f"set {VARIABLE}=1 before they are imported (in a notebook, restart it)")


def bfloat16_notice(flags=None, tensorflow_kernels=None):
    """One line for ``mixed_bfloat16`` training on an x86 CPU where bfloat16 is
    emulated, slower than float32: a CPU without AVX512_BF16 and AMX-BF16;
    or, on TensorFlow (``tensorflow_kernels``: :func:`kernels`' answer), its
    Eigen kernels, or oneDNN capped below those instructions
    (:func:`onednn_isa_cap`).  None elsewhere (also where the CPU's flags
    cannot be read, or off x86)."""
    flags = cpu_flags() if flags is None else flags
    if not _x86() or not flags:
        return None
    cap = (onednn_isa_cap() or "").strip().upper()
    capped = cap not in ("", "ALL", "DEFAULT") and not cap.startswith((
        "AVX512_CORE_BF16", "AVX512_CORE_FP16", "AVX512_CORE_AMX", "AVX10"))
    if not flags & {"avx512_bf16", "amx_bf16"}:
        why = "this CPU has neither AVX512_BF16 nor AMX"
    elif tensorflow_kernels == "Eigen":
        why = "TensorFlow runs its Eigen kernels, which do not use them"
    elif tensorflow_kernels == "oneDNN" and capped:
        why = f"oneDNN is capped at {cap}, below them"
    else:
        return None
    return (f"note: --precision=mixed_bfloat16 on a CPU without bfloat16 instructions ({why}): "
            f"bfloat16 is emulated and trains slower than float32 here; --precision=float32 "
            f"is the faster choice on this CPU")


def onednn_isa_cap():
    """The cap on oneDNN's instruction sets, ``ONEDNN_MAX_CPU_ISA`` (or its
    older name ``DNNL_MAX_CPU_ISA``), as set; None where neither is."""
    return os.environ.get("ONEDNN_MAX_CPU_ISA") or os.environ.get("DNNL_MAX_CPU_ISA") or None


def onednn_avx512(flags=None):
    """Whether oneDNN may run its AVX-512 kernels here: an x86 CPU with
    AVX-512 (F, BW, VL, DQ: oneDNN's ``avx512_core``) whose oneDNN is not
    capped below it (:func:`onednn_isa_cap`: ``SSE41``, ``AVX``, ``AVX2``
    and its VNNI forms)."""
    flags = cpu_flags() if flags is None else flags
    if not (_x86() and {"avx512f", "avx512bw", "avx512vl", "avx512dq"} <= flags):
        return False
    cap = (onednn_isa_cap() or "").strip().upper()
    return not (cap.startswith("SSE") or (cap.startswith("AVX") and not (
        cap.startswith("AVX512") or cap.startswith("AVX10"))))


def onednn_below_avx512(flags=None):
    """Whether oneDNN runs its AVX2 kernels here: an x86 CPU with AVX2 whose
    oneDNN cannot use AVX-512 (:func:`onednn_avx512`), e.g. an AMD EPYC Zen
    2/3 or ``ONEDNN_MAX_CPU_ISA=AVX2``."""
    flags = cpu_flags() if flags is None else flags
    return _chosen_for(flags) and not onednn_avx512(flags)


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
    ...)``; None where TensorFlow is not imported."""
    name = kernels()
    if name is None:
        return None
    why = _reason or (_users_reason() if user_set() else
                      "TensorFlow's own choice for this CPU")
    return f"TensorFlow CPU kernels: {name} ({why})"


# ------------------------------------------------------- TensorFlow's import
# absl's line before the first message of a copy of TensorFlow's logging that
# nobody initialised, and the header of such a message ("I0000 00:00:17...
# 4412 port.cc:153] ..."): its first letter is its severity.
_ABSL_BANNER = b"WARNING: All log messages before absl::InitializeLog() is called are written"
_HEADER = re.compile(rb"([IWEF])\d{4} [\d:.]+\s+\d+ \S+:\d+\] ")
_SEVERITIES = b"IWEF"


def _log_level():
    """``TF_CPP_MIN_LOG_LEVEL`` as TensorFlow reads it (0 unless a number)."""
    try:
        return int(os.environ.get("TF_CPP_MIN_LOG_LEVEL", "0"))
    except ValueError:
        return 0


def filter_early_logs(data, level):
    """``data`` (what TensorFlow wrote to stderr while it was imported)
    without the messages below ``level`` that it wrote before its logging
    read ``TF_CPP_MIN_LOG_LEVEL``, and without absl's line announcing them;
    every other line as it is.  Level 0: ``data`` unchanged."""
    if level <= 0:
        return data
    kept = []
    for line in data.splitlines(keepends=True):
        if line.startswith(_ABSL_BANNER):
            continue
        header = _HEADER.match(line)
        if header and _SEVERITIES.index(header.group(1)) < min(level, 3):
            continue
        kept.append(line)
    return b"".join(kept)


class _QuietLoader:
    """TensorFlow's own loader, run with the choice back in the environment
    where :func:`release` took it out before, and with stderr (the file
    descriptor: its C++ code writes there) caught and written back filtered
    (:func:`filter_early_logs`)."""

    def __init__(self, loader):
        self.loader = loader

    def __getattr__(self, name):
        return getattr(self.loader, name)

    def create_module(self, spec):
        return self.loader.create_module(spec)

    def exec_module(self, module):
        global _pending
        _uninstall()
        module.__loader__ = module.__spec__.loader = self.loader  # TensorFlow's own
        put_back = _pending and VARIABLE not in os.environ  # see release
        _pending = False
        if put_back:
            _export(_chosen)
        try:
            self._exec_quietly(module)
        except BaseException:  # not imported: the next try is handled the same way
            _pending = put_back
            _quiet_tensorflow_import()
            raise
        finally:
            if put_back and _ours():
                os.environ.pop(VARIABLE)
                os.environ.pop(MARK)

    def _exec_quietly(self, module):
        level = _log_level()
        saved = None
        if level > 0:
            try:
                sys.stderr.flush()
                saved = os.dup(2)
            except (OSError, AttributeError, ValueError):  # no stderr to catch
                saved = None
        if saved is None:
            return self.loader.exec_module(module)
        with tempfile.TemporaryFile() as caught:
            os.dup2(caught.fileno(), 2)
            try:
                self.loader.exec_module(module)
            finally:
                try:
                    sys.stderr.flush()
                except (AttributeError, ValueError):
                    pass
                os.dup2(saved, 2)
                os.close(saved)
                caught.seek(0)
                rest = filter_early_logs(caught.read(), level)
                if rest:
                    os.write(2, rest)


class _TensorFlowFinder(importlib.abc.MetaPathFinder):
    """Finds ``tensorflow`` as the other finders do, with its loader wrapped
    in a :class:`_QuietLoader` (once: the first import removes this finder)."""

    def find_spec(self, name, path=None, target=None):
        if name != "tensorflow":
            return None
        for finder in list(sys.meta_path):
            find = getattr(finder, "find_spec", None)
            if finder is self or find is None:
                continue
            spec = find(name, path, target)
            if spec is not None:
                if spec.loader is not None and hasattr(spec.loader, "exec_module"):
                    spec.loader = _QuietLoader(spec.loader)
                return spec
        return None


_FINDER = _TensorFlowFinder()


def _quiet_tensorflow_import():
    if _FINDER not in sys.meta_path:
        sys.meta_path.insert(0, _FINDER)


def _uninstall():
    try:
        sys.meta_path.remove(_FINDER)
    except ValueError:
        pass

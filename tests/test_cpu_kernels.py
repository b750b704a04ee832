"""TensorFlow's CPU kernels, chosen per path before TensorFlow is imported
(keras_identity/_cpu_kernels.py): oneDNN for training, TensorFlow's own
choice for serving, the user's TF_ENABLE_ONEDNN_OPTS always first."""

import importlib.util
import os
import platform
import subprocess
import sys

import pytest

from keras_identity import _cpu_kernels as cpu_kernels
from tests.backend import backend_neutral
from tests.backend import default_route

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
AVX2_X86 = (platform.machine().lower() in ("x86_64", "amd64")
            and "avx2" in cpu_kernels.cpu_flags())
VARIABLE, MARK = cpu_kernels.VARIABLE, cpu_kernels.MARK
# A process that is neither this one nor its parent (a shell in between).
ELSEWHERE = max(os.getpid(), os.getppid()) + 1


@pytest.fixture
def fresh(monkeypatch):
    """cpu_kernels as in a process where TensorFlow is not imported yet (the
    variables are restored afterwards, whether they were set or not)."""
    for name in (VARIABLE, MARK):
        monkeypatch.setenv(name, "")  # recorded, so that teardown restores it
        monkeypatch.delenv(name)
    for name in ("_reason", "_chosen", "_path"):
        monkeypatch.setattr(cpu_kernels, name, None)
    monkeypatch.setattr(cpu_kernels, "_pending", False)
    monkeypatch.setattr(sys, "meta_path", list(sys.meta_path))  # choose's import hook
    monkeypatch.delitem(sys.modules, "tensorflow", raising=False)
    monkeypatch.setattr(cpu_kernels, "cpu_flags", lambda: frozenset({"avx2", "fma"}))
    monkeypatch.setattr(cpu_kernels, "_x86", lambda: True)
    return monkeypatch


def _new_process(monkeypatch):
    """The module's state as in a process started now (same environment)."""
    for name in ("_reason", "_chosen", "_path"):
        monkeypatch.setattr(cpu_kernels, name, None)
    monkeypatch.delitem(sys.modules, "tensorflow", raising=False)


def test_training_turns_onednn_on_and_serving_keeps_tensorflows_choice(fresh):
    # On AVX2 without the features TensorFlow turns oneDNN on for:
    assert cpu_kernels.choose("training") == "1"
    assert os.environ[VARIABLE] == "1"
    assert os.environ[MARK] == f"1:{os.getpid()}"
    assert cpu_kernels.choose("inference") == "1"  # the process's first choice stands
    fresh.setattr(cpu_kernels, "_reason", None)
    fresh.delenv(VARIABLE)
    assert cpu_kernels.choose("inference") == "0"  # AVX2 only: TensorFlow's own is Eigen
    fresh.setattr(cpu_kernels, "_reason", None)
    fresh.delenv(VARIABLE)
    fresh.setattr(cpu_kernels, "cpu_flags", lambda: frozenset({"avx2", "avx512_bf16"}))
    assert cpu_kernels.choose("inference") == "1"  # where TensorFlow turns it on itself


def test_the_users_setting_wins_and_an_inherited_choice_of_ours_does_not(fresh):
    fresh.setenv(VARIABLE, "0")
    assert cpu_kernels.choose("training") == "0"
    assert cpu_kernels.reason() == "set by you"
    # A child of a process that holds our "1" in its environment (benchmarks.run's
    # workers) inherits it with its mark, naming the parent: ours, so a server
    # chooses for itself.
    _new_process(fresh)
    fresh.setenv(VARIABLE, "1")
    fresh.setenv(MARK, f"1:{os.getppid()}")
    assert not cpu_kernels.user_set()
    assert cpu_kernels.choose("inference") == "0"
    with pytest.raises(ValueError, match="path='serving' is not valid; expected one of"):
        cpu_kernels.choose("serving")
    # A program that sets the kernels itself (benchmarks.serving_latency --onednn)
    # sets them as the user would: its children keep them.
    _new_process(fresh)
    cpu_kernels.set_kernels(True)
    assert cpu_kernels.user_set() and MARK not in os.environ
    assert cpu_kernels.choose("inference") == "1"


def test_a_users_value_equal_to_our_choice_is_the_users(fresh):
    # K08/K11/K15: a process imports keras_identity (our "1" for training) and
    # TensorFlow reads it; then it starts a server with the user's
    # TF_ENABLE_ONEDNN_OPTS=1.  The choice left the environment once read, so
    # nothing of ours reaches the server: the 1 is the user's.
    assert cpu_kernels.choose("training") == "1"
    fresh.setitem(sys.modules, "tensorflow", object())
    assert cpu_kernels.release()
    assert VARIABLE not in os.environ and MARK not in os.environ
    _new_process(fresh)
    fresh.setenv(VARIABLE, "1")
    assert cpu_kernels.user_set()
    assert cpu_kernels.choose("inference") == "1"
    assert cpu_kernels.reason() == "set by you"
    # Where our mark still lingers, naming a process that is not this one's
    # parent (a shell in between, where the user exported the variable), it
    # proves nothing: the user's, and the stale mark is dropped.
    _new_process(fresh)
    fresh.setenv(MARK, f"1:{ELSEWHERE}")
    assert cpu_kernels.user_set()
    assert cpu_kernels.choose("inference") == "1"
    assert cpu_kernels.reason() == "set by you" and MARK not in os.environ
    # A mark that is not ours to read (another format) proves nothing either.
    for mark in ("1", "1:", "1:x", ""):
        fresh.setenv(MARK, mark)
        assert cpu_kernels.user_set(), mark


def test_a_program_passes_its_choice_on_by_choosing_again(fresh):
    # benchmarks.run: keras_identity's import chose and released; the program
    # chooses again for its workers, which import TensorFlow before keras_identity.
    assert cpu_kernels.choose("training") == "1"
    fresh.setitem(sys.modules, "tensorflow", object())
    cpu_kernels.release()
    assert cpu_kernels.choose("inference") == "1" and VARIABLE not in os.environ
    assert cpu_kernels.choose("training") == "1"
    assert os.environ[VARIABLE] == "1" and os.environ[MARK] == f"1:{os.getpid()}"
    assert not cpu_kernels.user_set()
    # Nothing is released that the user set.
    cpu_kernels.set_kernels(False)
    assert not cpu_kernels.release() and os.environ[VARIABLE] == "0"


@pytest.mark.parametrize("value", ["junk", "", " 0", "0 ", "yes", "on", "2"])
def test_a_value_tensorflow_would_ignore_is_refused(fresh, value):
    # K02/K05/K06: TensorFlow reads 0, 1, false and true in any case; any other
    # value it ignores (with a warning) and makes its own choice.
    fresh.setenv(VARIABLE, value)
    line = (f"{VARIABLE}={value!r} is not valid; expected 0 or false (Eigen's kernels), 1 "
            f"or true (oneDNN's), in any case, or unset for the choice of keras_identity "
            f"and TensorFlow")
    assert cpu_kernels.invalid_setting() == line
    with pytest.raises(ValueError) as raised:
        cpu_kernels.choose("training")
    assert str(raised.value) == line
    # Where TensorFlow was imported first, the line says what it did.
    _new_process(fresh)
    fresh.setitem(sys.modules, "tensorflow", object())
    assert cpu_kernels.choose("training") == value
    assert cpu_kernels.reason() == (f"{VARIABLE}={value!r} is not a value TensorFlow "
                                    f"reads, so it made its own choice for this CPU")


@pytest.mark.parametrize("value", ["0", "1", "false", "TRUE", "False", "tRuE"])
def test_the_values_tensorflow_reads_are_the_users(fresh, value):
    fresh.setenv(VARIABLE, value)
    assert cpu_kernels.invalid_setting() is None
    assert cpu_kernels.choose("inference") == value
    assert cpu_kernels.reason() == "set by you"


def test_nothing_is_chosen_off_x86_or_after_tensorflow(fresh):
    fresh.setattr(cpu_kernels, "_x86", lambda: False)
    assert cpu_kernels.choose("training") is None
    assert VARIABLE not in os.environ
    fresh.setattr(cpu_kernels, "_reason", None)
    fresh.setattr(cpu_kernels, "_x86", lambda: True)
    fresh.setitem(sys.modules, "tensorflow", object())
    assert cpu_kernels.choose("training") is None
    assert "imported before" in cpu_kernels.reason()


EARLY_LOGS = (
    b"WARNING: All log messages before absl::InitializeLog() is called are written to "
    b"STDERR\n"
    b"I0000 00:00:1795696013.770935    4412 port.cc:153] oneDNN custom operations are on. "
    b"You may see slightly different numerical results ...\n"
    b"W0000 00:00:1795696043.658055    4641 port.cc:148] a warning\n"
    b"E0000 00:00:1795696043.658055    4641 port.cc:148] an error\n"
    b"F0000 00:00:1795696043.658055    4641 port.cc:148] a fatal error\n"
    b"/some/module.py:3: UserWarning: Python's own\n")


@pytest.mark.parametrize("level,kept", [(0, [0, 1, 2, 3, 4, 5]), (1, [2, 3, 4, 5]),
                                        (2, [3, 4, 5]), (3, [4, 5]), (9, [4, 5])])
def test_early_logs_obey_tensorflows_log_level(level, kept):
    lines = EARLY_LOGS.splitlines(keepends=True)
    assert cpu_kernels.filter_early_logs(EARLY_LOGS, level) == b"".join(
        lines[i] for i in kept)


def _combined_output(args, **env):
    environ = {k: v for k, v in os.environ.items() if k not in (VARIABLE, MARK)}
    environ.update(env)
    done = subprocess.run([sys.executable, *args], cwd=REPO, env=environ,
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                          timeout=300)
    return done.returncode, done.stdout.splitlines()


@default_route
@pytest.mark.needs_tensorflow
def test_a_refused_flag_is_the_programs_one_line_on_every_cpu():
    # TensorFlow writes "oneDNN custom operations are on" (and absl's line
    # before it) twice where oneDNN is on, whatever TF_CPP_MIN_LOG_LEVEL says:
    # on AVX-512 (TensorFlow's own choice) and under the training choice.
    code, lines = _combined_output(["-m", "keras_identity_cli.train", "--depth=-1"],
                                   TF_CPP_MIN_LOG_LEVEL="1")
    assert (code, lines) == (2, ["error: depth=-1 is not valid; expected an integer >= 1."])
    code, lines = _combined_output(["-m", "keras_identity_cli.serve",
                                    "--model_base_path=/nonexistent/pre164"],
                                   TF_CPP_MIN_LOG_LEVEL="3", TF_ENABLE_ONEDNN_OPTS="1")
    assert code == 2 and lines == ["error: model_base_path='/nonexistent/pre164' does not "
                                   "exist"], lines
    # A value TensorFlow would ignore: one line, before anything else.
    code, lines = _combined_output(["-m", "keras_identity_cli.train", "--depth=-1"],
                                   TF_CPP_MIN_LOG_LEVEL="2", TF_ENABLE_ONEDNN_OPTS=" 0")
    assert code == 2 and lines == [
        f"error: {VARIABLE}=' 0' is not valid; expected 0 or false (Eigen's kernels), 1 "
        f"or true (oneDNN's), in any case, or unset for the choice of keras_identity and "
        f"TensorFlow"], lines


def _kernels_in_a_new_process(code, **env):
    environ = {k: v for k, v in os.environ.items() if k not in (VARIABLE, MARK)}
    environ.update(KERAS_BACKEND="tensorflow", TF_CPP_MIN_LOG_LEVEL="3")
    environ.update(env)
    done = subprocess.run(
        [sys.executable, "-c", code + "\nfrom keras_identity import _cpu_kernels\n"
         "print(_cpu_kernels.describe())"], cwd=REPO, env=environ, capture_output=True,
        text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout.strip().splitlines()[-1]


def _servers_kernels(*envs):
    """The kernels of the servers that one process which imported
    keras_identity (on TensorFlow) starts one after the other, each with an
    ``env`` of ``envs`` added to its environment."""
    code = ("import os, subprocess, sys\n"
            "import keras_identity\n"
            "for env in %r:\n"
            "    print(subprocess.run([sys.executable, '-c', 'import keras_identity_cli.serve, "
            "keras_identity; from keras_identity import _cpu_kernels; "
            "print(_cpu_kernels.describe())'], env={**os.environ, **env}, "
            "capture_output=True, text=True, check=True).stdout.strip().splitlines()[-1])\n"
            "print('the parent')" % (list(envs),))
    environ = {k: v for k, v in os.environ.items() if k not in (VARIABLE, MARK)}
    environ.update(KERAS_BACKEND="tensorflow", TF_CPP_MIN_LOG_LEVEL="3")
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=environ,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    lines = done.stdout.strip().splitlines()
    assert lines[-1] == "the parent", lines
    return lines[-1 - len(envs):-1]


def _serving_choice():
    return "TensorFlow CPU kernels: " + (
        "oneDNN (TensorFlow's own choice" if cpu_kernels.tensorflow_default() else
        "Eigen (keras_identity's choice for serving")


# The processes of these tests import TensorFlow (KERAS_BACKEND=tensorflow)
# whatever the leg's backend: they run once, on the TensorFlow leg.
@backend_neutral
@pytest.mark.needs_tensorflow
@pytest.mark.skipif(not AVX2_X86, reason="an x86 CPU with AVX2")
def test_importing_the_library_trains_on_onednn_and_the_server_module_chooses_first():
    own = cpu_kernels.tensorflow_default()  # AVX-512 VNNI/BF16, AMX: oneDNN by itself
    line = _kernels_in_a_new_process("import keras_identity")
    assert line.startswith("TensorFlow CPU kernels: oneDNN (" + (
        "TensorFlow's own choice" if own else "keras_identity's choice for training")), line
    line = _kernels_in_a_new_process("import keras_identity", TF_ENABLE_ONEDNN_OPTS="0")
    assert line == "TensorFlow CPU kernels: Eigen (set by you)"
    # keras-identity-serve's module chooses before keras_identity is imported.
    line = _kernels_in_a_new_process("import keras_identity_cli.serve, keras_identity")
    assert line.startswith(_serving_choice()), line


@backend_neutral
@pytest.mark.needs_tensorflow
@pytest.mark.skipif(not AVX2_X86, reason="an x86 CPU with AVX2")
def test_a_server_started_by_the_library_keeps_tensorflows_choice():
    serving = _serving_choice()
    # A process that imported keras_identity (its choice read, and taken out of
    # the environment) starts a server: with the user's =1 it runs oneDNN, as
    # the user's; without, it chooses for serving.
    chosen_by_you, chosen = _servers_kernels({VARIABLE: "1"}, {})
    assert chosen_by_you == "TensorFlow CPU kernels: oneDNN (set by you)", chosen_by_you
    assert chosen.startswith(serving), chosen


@backend_neutral
@pytest.mark.needs_tensorflow
@pytest.mark.skipif(importlib.util.find_spec("jax") is None, reason="JAX is not installed")
def test_on_jax_the_choice_waits_for_tensorflows_import():
    # Serving on AVX2 (made so here): the choice is Eigen.  Keras on JAX does
    # not import TensorFlow; the choice leaves the environment with
    # keras_identity's import and is back only while TensorFlow imports.
    code = ("import os, sys\n"
            "from keras_identity_cli._preload import cpu_kernels\n"
            "cpu_kernels.cpu_flags = lambda: frozenset({'avx2', 'fma'})\n"
            "cpu_kernels.choose('inference')\n"
            "import keras_identity\n"
            "assert 'tensorflow' not in sys.modules\n"
            f"print(os.environ.get({VARIABLE!r}), os.environ.get({MARK!r}))\n"
            "import tensorflow\n"
            f"print(os.environ.get({VARIABLE!r}), cpu_kernels.describe())\n")
    code_, lines = _combined_output(["-c", code], KERAS_BACKEND="jax", JAX_PLATFORMS="cpu",
                                    TF_CPP_MIN_LOG_LEVEL="2")
    assert code_ == 0 and lines == [
        "None None",
        "None TensorFlow CPU kernels: Eigen (keras_identity's choice for serving on AVX2, "
        "where oneDNN's BN-fused convolutions are slow at small batches; "
        f"{VARIABLE}=1 for oneDNN)"], lines


@backend_neutral
@pytest.mark.needs_tensorflow
@pytest.mark.skipif(importlib.util.find_spec("jax") is None, reason="JAX is not installed")
def test_a_jax_run_names_no_tensorflow_kernels(tmp_path):
    # K12: a JAX run trains on XLA; TensorFlow (imported beside it) runs none
    # of its steps, and no line names its CPU kernels.
    code = ("import sys\n"
            "from keras_identity.training import TrainConfig, train\n"
            "lines = []\n"
            "train(TrainConfig(model='highway_net', depth=4, train_examples=100, "
            "test_examples=50, steps_per_epoch=1, batch_size=50, epochs=1, verbose=0, "
            f"model_dir={str(tmp_path / 'run')!r}), print_fn=lines.append)\n"
            "print('TensorFlow imported:', 'tensorflow' in sys.modules)\n"
            "print('\\n'.join('LINE ' + line for line in lines))\n")
    code_, lines = _combined_output(["-c", code], KERAS_BACKEND="jax", JAX_PLATFORMS="cpu",
                                    TF_CPP_MIN_LOG_LEVEL="2")
    assert code_ == 0, lines[-20:]
    assert "TensorFlow imported: True" in lines
    run = [line for line in lines if line.startswith("LINE ")]
    assert any("Keras backend jax" in line for line in run), run
    assert not [line for line in run if "TensorFlow CPU kernels" in line], run


def test_training_on_eigen_after_tensorflows_import_is_noticed_on_avx2(fresh):
    # TensorFlow imported first (its kernels fixed then) and running Eigen's:
    # the line names the cause, the remedy and the measured cost.
    fresh.setitem(sys.modules, "tensorflow", object())
    assert cpu_kernels.choose("training") is None
    fresh.setattr(cpu_kernels, "onednn_enabled", lambda: False)
    line = cpu_kernels.training_notice()
    assert line == (
        "TensorFlow trains on its Eigen CPU kernels here, since it was imported before "
        "keras_identity and fixed its kernels then; on this CPU they train ResNet-164 at "
        "0.48x and ResNet-1001 at 0.73x oneDNN's speed: import keras_identity before keras "
        "and tensorflow, or set TF_ENABLE_ONEDNN_OPTS=1 before they are imported (in a "
        "notebook, restart it)")
    # Not where TensorFlow runs oneDNN's kernels, nor off the AVX2 x86 class,
    # nor where the user chose the kernels, nor where keras_identity chose.
    fresh.setattr(cpu_kernels, "onednn_enabled", lambda: True)
    assert cpu_kernels.training_notice() is None
    fresh.setattr(cpu_kernels, "onednn_enabled", lambda: False)
    fresh.setattr(cpu_kernels, "cpu_flags", lambda: frozenset({"sse4_2"}))
    assert cpu_kernels.training_notice() is None
    fresh.setattr(cpu_kernels, "cpu_flags", lambda: frozenset({"avx2"}))
    fresh.setattr(cpu_kernels, "_x86", lambda: False)
    assert cpu_kernels.training_notice() is None
    fresh.setattr(cpu_kernels, "_x86", lambda: True)
    fresh.setenv(VARIABLE, "0")
    assert cpu_kernels.training_notice() is None
    fresh.delenv(VARIABLE)
    assert cpu_kernels.training_notice() == line
    fresh.setattr(cpu_kernels, "_reason", "keras_identity's choice for serving on AVX2")
    assert cpu_kernels.training_notice() is None


def test_onednn_avx512_reads_the_cpu_and_oneDNNs_cap(monkeypatch):
    avx512 = frozenset({"avx2", "avx512f", "avx512bw", "avx512vl", "avx512dq"})
    monkeypatch.setattr(cpu_kernels, "_x86", lambda: True)
    monkeypatch.delenv("ONEDNN_MAX_CPU_ISA", raising=False)
    monkeypatch.delenv("DNNL_MAX_CPU_ISA", raising=False)
    assert cpu_kernels.onednn_isa_cap() is None
    assert cpu_kernels.onednn_avx512(avx512)
    assert not cpu_kernels.onednn_avx512(frozenset({"avx2", "fma"}))
    assert not cpu_kernels.onednn_avx512(frozenset({"avx2", "avx512f"}))  # no avx512_core
    for cap, expected in [("AVX2", False), ("avx2_vnni", False), ("SSE41", False),
                          ("AVX", False), ("AVX512_CORE", True), ("AVX512_CORE_AMX", True),
                          ("AVX10_1_512", True), ("ALL", True)]:
        monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", cap)
        assert cpu_kernels.onednn_avx512(avx512) is expected, cap
    monkeypatch.delenv("ONEDNN_MAX_CPU_ISA")
    monkeypatch.setenv("DNNL_MAX_CPU_ISA", "AVX2")  # oneDNN's older name
    assert cpu_kernels.onednn_isa_cap() == "AVX2"
    assert not cpu_kernels.onednn_avx512(avx512)
    assert cpu_kernels.onednn_below_avx512(avx512)
    monkeypatch.delenv("DNNL_MAX_CPU_ISA")
    assert not cpu_kernels.onednn_below_avx512(avx512)
    assert cpu_kernels.onednn_below_avx512(frozenset({"avx2", "fma"}))
    assert not cpu_kernels.onednn_below_avx512(frozenset({"avx", "sse4_2"}))
    monkeypatch.setattr(cpu_kernels, "_x86", lambda: False)  # e.g. aarch64's oneDNN
    assert not cpu_kernels.onednn_avx512(avx512)
    assert not cpu_kernels.onednn_below_avx512(frozenset({"avx2"}))


def test_bfloat16_without_its_instructions_is_noticed(monkeypatch):
    """A CPU with neither AVX512_BF16 nor AMX (AVX2 EPYC, Cascade Lake), or on
    TensorFlow its Eigen kernels or oneDNN capped below them, gets the one
    line; the others none."""
    notice = cpu_kernels.bfloat16_notice
    monkeypatch.setattr(cpu_kernels, "_x86", lambda: True)
    monkeypatch.delenv("ONEDNN_MAX_CPU_ISA", raising=False)
    monkeypatch.delenv("DNNL_MAX_CPU_ISA", raising=False)
    cascade_lake = frozenset({"avx2", "avx512f", "avx512bw", "avx512vl", "avx512dq",
                              "avx512_vnni"})
    for kernels in ("oneDNN", "Eigen", None):  # None: JAX's XLA
        line = notice(cascade_lake, tensorflow_kernels=kernels)
        assert line.startswith("note: --precision=mixed_bfloat16 on a CPU without bfloat16 "
                               "instructions (this CPU has neither AVX512_BF16 nor AMX)")
        assert "--precision=float32" in line and "\n" not in line
    assert notice(frozenset({"avx2", "fma"}), tensorflow_kernels="oneDNN") is not None
    for flags in ({"avx512_bf16"}, {"amx_bf16", "amx_tile"}):
        assert notice(cascade_lake | flags, tensorflow_kernels="oneDNN") is None
        assert "its Eigen kernels" in notice(cascade_lake | flags, tensorflow_kernels="Eigen")
        for cap, noticed in [("AVX512_CORE", True), ("AVX2", True),
                             ("AVX512_CORE_BF16", False), ("AVX512_CORE_AMX", False),
                             ("ALL", False), ("DEFAULT", False)]:
            monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", cap)
            found = notice(cascade_lake | flags, tensorflow_kernels="oneDNN")
            assert (found is not None) is noticed, (flags, cap)
            if noticed:
                assert f"oneDNN is capped at {cap}, below them" in found
            # JAX's XLA does not read oneDNN's cap
            assert notice(cascade_lake | flags, tensorflow_kernels=None) is None
        monkeypatch.delenv("ONEDNN_MAX_CPU_ISA")
    assert notice(frozenset(), tensorflow_kernels="oneDNN") is None  # flags not readable
    monkeypatch.setattr(cpu_kernels, "_x86", lambda: False)
    assert notice(cascade_lake) is None

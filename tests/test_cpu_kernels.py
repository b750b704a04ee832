"""TensorFlow's CPU kernels, chosen per path before TensorFlow is imported
(keras_identity_cli/cpu_kernels.py): oneDNN for training, TensorFlow's own
choice for serving, the user's TF_ENABLE_ONEDNN_OPTS always first."""

import os
import platform
import subprocess
import sys

import pytest

from keras_identity_cli import cpu_kernels

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
AVX2_X86 = (platform.machine().lower() in ("x86_64", "amd64")
            and "avx2" in cpu_kernels.cpu_flags())


@pytest.fixture
def fresh(monkeypatch):
    """cpu_kernels as in a process where TensorFlow is not imported yet (the
    variables are restored afterwards, whether they were set or not)."""
    for name in (cpu_kernels.VARIABLE, cpu_kernels.MARK):
        monkeypatch.setenv(name, "")  # recorded, so that teardown restores it
        monkeypatch.delenv(name)
    monkeypatch.setattr(cpu_kernels, "_reason", None)
    monkeypatch.delitem(sys.modules, "tensorflow", raising=False)
    monkeypatch.setattr(cpu_kernels, "cpu_flags", lambda: frozenset({"avx2", "fma"}))
    monkeypatch.setattr(cpu_kernels, "_x86", lambda: True)
    return monkeypatch


def test_training_turns_onednn_on_and_serving_keeps_tensorflows_choice(fresh):
    # On AVX2 without the features TensorFlow turns oneDNN on for:
    assert cpu_kernels.choose("training") == "1"
    assert os.environ[cpu_kernels.VARIABLE] == "1"
    assert cpu_kernels.choose("inference") == "1"  # the process's first choice stands
    fresh.setattr(cpu_kernels, "_reason", None)
    fresh.delenv(cpu_kernels.VARIABLE)
    assert cpu_kernels.choose("inference") == "0"  # AVX2 only: TensorFlow's own is Eigen
    fresh.setattr(cpu_kernels, "_reason", None)
    fresh.delenv(cpu_kernels.VARIABLE)
    fresh.setattr(cpu_kernels, "cpu_flags", lambda: frozenset({"avx2", "avx512_bf16"}))
    assert cpu_kernels.choose("inference") == "1"  # where TensorFlow turns it on itself


def test_the_users_setting_wins_and_an_inherited_choice_of_ours_does_not(fresh):
    fresh.setenv(cpu_kernels.VARIABLE, "0")
    assert cpu_kernels.choose("training") == "0"
    assert cpu_kernels.reason() == "set by you"
    # A child of a training process (a server a test starts) inherits our "1"
    # with its mark: not the user's, so serving chooses for itself.
    fresh.setattr(cpu_kernels, "_reason", None)
    fresh.setenv(cpu_kernels.VARIABLE, "1")
    fresh.setenv(cpu_kernels.MARK, "1")
    assert cpu_kernels.choose("inference") == "0"
    with pytest.raises(ValueError, match="path='serving' is not valid; expected one of"):
        cpu_kernels.choose("serving")
    # A program that sets the kernels itself (benchmarks.serving_latency --onednn)
    # sets them as the user would: its children keep them.
    fresh.setattr(cpu_kernels, "_reason", None)
    cpu_kernels.set_kernels(True)
    assert cpu_kernels.user_set() and cpu_kernels.MARK not in os.environ
    assert cpu_kernels.choose("inference") == "1"


def test_nothing_is_chosen_off_x86_or_after_tensorflow(fresh):
    fresh.setattr(cpu_kernels, "_x86", lambda: False)
    assert cpu_kernels.choose("training") is None
    assert cpu_kernels.VARIABLE not in os.environ
    fresh.setattr(cpu_kernels, "_reason", None)
    fresh.setattr(cpu_kernels, "_x86", lambda: True)
    fresh.setitem(sys.modules, "tensorflow", object())
    assert cpu_kernels.choose("training") is None
    assert "imported before" in cpu_kernels.reason()


def _kernels_in_a_new_process(code, **env):
    environ = {k: v for k, v in os.environ.items()
               if k not in (cpu_kernels.VARIABLE, cpu_kernels.MARK)}
    environ.update(env, KERAS_BACKEND="tensorflow", TF_CPP_MIN_LOG_LEVEL="3")
    done = subprocess.run(
        [sys.executable, "-c", code + "\nfrom keras_identity_cli import cpu_kernels\n"
         "print(cpu_kernels.describe())"], cwd=REPO, env=environ, capture_output=True,
        text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout.strip().splitlines()[-1]


@pytest.mark.needs_tensorflow
@pytest.mark.skipif(not AVX2_X86, reason="an x86 CPU with AVX2")
def test_importing_the_library_trains_on_onednn_and_the_server_keeps_tensorflows_choice():
    own = cpu_kernels.tensorflow_default()  # AVX-512 VNNI/BF16, AMX: oneDNN by itself
    line = _kernels_in_a_new_process("import keras_identity")
    assert line.startswith("TensorFlow CPU kernels: oneDNN (" + (
        "TensorFlow's own choice" if own else "keras_identity's choice for training")), line
    line = _kernels_in_a_new_process("import keras_identity", TF_ENABLE_ONEDNN_OPTS="0")
    assert line == "TensorFlow CPU kernels: Eigen (set by you)"
    # keras-identity-serve's module chooses before keras_identity is imported.
    line = _kernels_in_a_new_process("import keras_identity_cli.serve, keras_identity")
    assert line.startswith("TensorFlow CPU kernels: " + (
        "oneDNN (TensorFlow's own choice" if own else
        "Eigen (keras_identity's choice for serving")), line

"""Every command and Python block of the README runs, or is named here with the
reason it cannot run in the test suite.

Python blocks run in order in one fresh process, with the substitutions of
``PYTHON_SUBSTITUTIONS`` (a tiny scale); shell commands run shortened (the
flags of ``SHORTENED`` appended: absl takes the last value of a flag).  Each
substitution must still find its text, so the README cannot drift from
what is tested.
"""

import configparser
import os
import re
import shlex
import subprocess
import sys

import pytest

from tests.backend import default_route
from tests.conftest import REPO
from tests.datasets import cifar_like_npz
from tests.programs import run_programs

README = os.path.join(REPO, "README.md")

# Commands that are not run, by their first words, and why.
NOT_RUN = {
    "pip install": "installs packages: CI's .ci/run runs the install, and "
                   "tests/packaging installs the built wheel into a fresh environment",
    "python -m pytest": "the test suite itself",
    "KERAS_BACKEND=jax python -m pytest": "the test suite itself, on JAX",
    "tensorflow_model_server": "no TF Serving binary is reachable here; "
                               "tests/export runs the same requests against keras-identity-serve",
    "curl": "needs a running server; tests/export posts the same REST body to "
            "keras-identity-serve",
    "python -m experiments.reproduce": "a claim takes hours; "
        "tests/experiments/test_reproduce.py runs --list, --results and a claim shortened",
}
NOT_RUN_FLAGS = {
    "--strategy=tpu": "needs a TPU; the notebook test runs the TPU route's CPU fallback",
}
# Appended to commands run here, so that each takes seconds.
SHORTENED = {
    "keras-identity-train": ["--train_steps=2", "--steps_per_epoch=2", "--batch_size=32",
                             "--train_examples=256", "--test_examples=64", "--verbose=2"],
    "keras-identity-tune": ["--epochs=1", "--gate_biases=-1,-2", "--train_examples=512",
                            "--batch_size=64", "--max_trials=2", "--verbose=0"],
    "keras-identity-export": [],
}
# A training or tuning command that names a depth runs at this one here
# (building ResNet-164 and -1001 and highway nets of 100 layers is tested in
# tests/models).
SHALLOW = "--depth=20"
PYTHON_SUBSTITUTIONS = [
    ('ki.data.load_dataset("cifar100")', 'ki.data.load_dataset("cifar100", data_dir=TINY_CIFAR100)'),
    ("preact_resnet(164, include_top=False", "preact_resnet(20, include_top=False"),
    ('weights="runs/pre164/model.keras"', "weights=BACKBONE"),
    ("epochs=5", "epochs=1"),
    ("model.fit(data.x_train, data.y_train, batch_size=128, epochs=1)",
     "model.fit(data.x_train[:2048], data.y_train[:2048], batch_size=128, epochs=1)"),
]


def _blocks(language):
    text = open(README).read()
    return re.findall(rf"```{language}\n(.*?)```", text, re.S)


def _commands():
    commands = []
    for block in _blocks("bash"):
        lines = block.replace("\\\n", " ").splitlines()
        for line in lines:
            line = line.split("  #")[0].strip()
            if line and not line.startswith("#") and not line.startswith('\\"'):
                commands.append(line)
    return commands


def _why_not_run(command):
    for prefix, reason in NOT_RUN.items():
        if command.startswith(prefix):
            return reason
    for flag, reason in NOT_RUN_FLAGS.items():
        if flag in command:
            return reason
    return None


def test_readme_is_a_short_guide():
    lines = open(README).read().splitlines()
    assert len(lines) <= 350
    dated = re.compile(r"(yesterday|this afternoon|earlier runs?|half an hour|"
                       r"\b20\d\d-\d\d-\d\d\b)", re.I)
    assert not [l for l in lines if dated.search(l)]


def test_every_readme_command_is_run_or_named():
    for command in _commands():
        name = command.split()[0]
        assert _why_not_run(command) or name in SHORTENED, (
            f"README command not covered by tests/test_readme.py: {command}")


def _console_modules():
    """``{console command: its module}``, from setup.cfg's entry points."""
    parser = configparser.ConfigParser()
    parser.read(os.path.join(REPO, "setup.cfg"))
    entries = parser["options.entry_points"]["console_scripts"].strip().splitlines()
    return {name.strip(): target.split(":")[0].strip()
            for name, target in (entry.split("=") for entry in entries)}


@default_route
def test_readme_commands_run(tmp_path, shared_dir):
    """Each distinct command the README runs, in its order, one after the
    other in one process (the console commands' own processes:
    tests/packaging/test_wheel.py and tests/experiments)."""
    runs = []
    for command in dict.fromkeys(_commands()):  # each distinct command once
        if _why_not_run(command):
            continue
        command = command.replace("../shared", shared_dir)
        args = shlex.split(command)
        args += SHORTENED[args[0]]
        if any(a.startswith("--depth=") for a in args):
            args.append(SHALLOW)
        runs.append((_console_modules()[args[0]], args[1:]))
    results = run_programs(runs, cwd=tmp_path, env={"KERAS_BACKEND": "tensorflow"})
    for (module, args), (code, stderr, _) in zip(runs, results):
        assert code == 0, f"{module} {' '.join(args)}\n{stderr[-3000:]}"
    assert [module for module, _ in runs].count("keras_identity_cli.train") == 3
    assert (tmp_path / "serving" / "pre164" / "1" / "saved_model.pb").exists()
    assert (tmp_path / "runs" / "tune_highway50" / "results.csv").exists()
    assert (tmp_path / "runs" / "search_highway100" / "results.csv").exists()


@default_route
def test_readme_python_blocks_run(tmp_path, rng):
    """The Quickstart, Layers, Models and Transfer-learning blocks, in one
    process; the transfer-learning example fine-tunes a tiny CIFAR-10
    backbone on a tiny CIFAR-100-like set."""
    cifar_like_npz(tmp_path / "cifar100.npz", 64, 32, classes=100, rng=rng)
    source = "\n".join(_blocks("python"))
    for old, new in PYTHON_SUBSTITUTIONS:
        assert old in source, f"the README no longer contains {old!r}"
        source = source.replace(old, new)
    prelude = f"""
import numpy as np
import keras, keras_identity as ki
TINY_CIFAR100 = {str(tmp_path / 'cifar100.npz')!r}
BACKBONE = {str(tmp_path / 'backbone.keras')!r}
pixels = np.random.default_rng(0).integers(0, 256, (64, 32, 32, 3)).astype("uint8")
ki.models.preact_resnet(20, include_preprocessing=True,
                        normalization=ki.data.Normalization.from_images("per_pixel_mean", pixels)
                        ).save(BACKBONE)
"""
    check = """
saved = keras.models.load_model("pre164_cifar100.keras")
source = keras.models.load_model(BACKBONE)
mean = saved.layers[1].get_layer("preprocessing").normalization.mean
np.testing.assert_array_equal(mean, source.get_layer("preprocessing").normalization.mean)
assert saved.output_shape == (None, 100)
print("README blocks ran")
"""
    script = tmp_path / "readme_blocks.py"
    script.write_text(prelude + source + check)
    result = subprocess.run([sys.executable, str(script)], cwd=tmp_path, text=True,
                            capture_output=True, timeout=900,
                            env=dict(os.environ, KERAS_BACKEND="tensorflow",
                                     PYTHONPATH=REPO))
    assert result.returncode == 0, result.stderr[-3000:]
    assert "README blocks ran" in result.stdout
    assert (tmp_path / "highway10_savedmodel" / "saved_model.pb").exists()


@pytest.mark.parametrize("command", sorted({c for c in _commands() if _why_not_run(c)}))
def test_commands_not_run_have_a_reason(command):
    assert len(_why_not_run(command)) > 20


def test_readme_lists_every_preset_as_the_registry_does():
    """The README's table of trained networks is ki.models.presets_table()'s."""
    import keras_identity as ki

    text = open(README).read()
    for line in ki.models.presets_table().splitlines():
        assert line in text, f"the README lacks the presets' row: {line}"

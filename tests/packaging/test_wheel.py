"""The distribution as a user gets it: a wheel installed into a fresh virtual
environment, its console commands run from outside the repository.

The fresh environment borrows the test environment's third-party packages
through a ``.pth`` file that lists their site-packages directory: a path line
in a ``.pth`` file does not run that directory's own ``.pth`` files, so the
editable install of keras_identity (a finder started by such a file) stays
out, and ``import keras_identity`` can only find the installed wheel.
"""

import configparser
import email.parser
import json
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import zipfile

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from tests.backend import default_route
from tests.conftest import REPO

pytestmark = default_route  # the wheel's programs run with KERAS_BACKEND=tensorflow

COMMANDS = {
    "keras-identity-train": "keras_identity_cli.train:run",
    "keras-identity-tune": "keras_identity_cli.tune:run",
    "keras-identity-export": "keras_identity_cli.export:run",
    "keras-identity-serve": "keras_identity_cli.serve:run",
}
# Left out of the copy of the repository the wheel is built from: what
# .gitignore keeps out of the repository, and its git and virtual environments
# (every .venv*: CI's other venvs install while the TensorFlow leg runs).
_TOP_LEVEL_NOT_COPIED = {".git", "build", "dist", "runs", "serving", "tmp", ".whl", ".gl",
                         ".pytest_cache"}


def _not_copied(directory, names):
    top = os.path.abspath(directory) == os.path.abspath(REPO)
    return [name for name in names
            if (top and (name in _TOP_LEVEL_NOT_COPIED or name.startswith(".venv")))
            or name == "__pycache__" or name.endswith((".egg-info", ".pyc"))]


def _environment(**extra):
    env = {key: value for key, value in os.environ.items()
           if key not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV")}
    env.update(PYTHONNOUSERSITE="1", KERAS_BACKEND="tensorflow", **extra)
    return env


def _run(args, cwd, timeout, env=None):
    return subprocess.run(args, cwd=cwd, env=env or _environment(), text=True,
                          capture_output=True, timeout=timeout)


def _tail(result, characters=3000):
    return f"exit {result.returncode}\n{(result.stdout + result.stderr)[-characters:]}"


@pytest.fixture(scope="module")
def wheel(tmp_path_factory):
    """The wheel ``pip wheel`` builds from a copy of the working tree.

    A copy, so that setuptools' build/ directory neither lands in the
    repository nor brings stale files of an earlier build into the wheel.
    """
    root = tmp_path_factory.mktemp("wheel")
    source = root / "source"
    shutil.copytree(REPO, source, ignore=_not_copied)
    # Build isolation installs pyproject.toml's build requirements from the
    # package index; without a network that step fails, and the test skips.
    env = _environment(PIP_DEFAULT_TIMEOUT="20", PIP_RETRIES="1")
    try:
        result = _run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w",
                       str(root / "dist"), str(source)], cwd=root, timeout=300, env=env)
    except subprocess.TimeoutExpired:
        pytest.skip("pip wheel took over 300 s (no access to the package index for the "
                    "build requirements?)")
    if result.returncode != 0 and "build dependencies" in result.stdout + result.stderr:
        pytest.skip("the wheel cannot be built here: pip could not install the build "
                    "requirements (setuptools, wheel) from the package index:\n"
                    + _tail(result, 1000))
    assert result.returncode == 0, _tail(result)
    (path,) = (root / "dist").glob("keras_identity-*.whl")
    return path


@pytest.fixture(scope="module")
def venv(wheel, tmp_path_factory):
    """A fresh virtual environment with the wheel installed; its bin directory."""
    root = tmp_path_factory.mktemp("venv")
    home = root / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(home)], check=True,
                   timeout=120)
    python = str(home / "bin" / "python")
    site = _run([python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                cwd=root, timeout=60).stdout.strip()
    outer = dict.fromkeys(sysconfig.get_paths()[key] for key in ("purelib", "platlib"))
    with open(os.path.join(site, "_outer_site_packages.pth"), "w") as f:
        f.write("".join(path + "\n" for path in outer))
    # pip comes from the outer site-packages; --ignore-installed, as that
    # directory also holds the editable keras_identity's metadata.
    result = _run([python, "-m", "pip", "install", "-q", "--no-deps", "--no-index",
                   "--ignore-installed", str(wheel)], cwd=root, timeout=300)
    assert result.returncode == 0, _tail(result)
    return home / "bin"


def test_wheel_ships_the_programs_and_mnist(wheel):
    with zipfile.ZipFile(wheel) as archive:
        names = set(archive.namelist())
        (entry_points,) = [n for n in names if n.endswith(".dist-info/entry_points.txt")]
        parser = configparser.ConfigParser()
        parser.read_string(archive.read(entry_points).decode())
    assert "keras_identity/data/mnist.npz" in names
    registry = json.loads(archive_registry(wheel))
    assert registry, "no presets in the wheel"
    for entry in registry:  # each preset's weights and card
        for file in (entry["file"], entry["file"].replace(".keras", ".md")):
            assert f"keras_identity/models/preset_files/{file}" in names
    for module in ("__init__", "_common", "machine", "train", "tune", "export", "serve"):
        assert f"keras_identity_cli/{module}.py" in names
    tops = {name.split("/", 1)[0] for name in names if not name.split("/", 1)[0]
            .endswith(".dist-info")}
    assert tops == {"keras_identity", "keras_identity_cli"}
    assert dict(parser["console_scripts"]) == COMMANDS


def archive_registry(wheel):
    with zipfile.ZipFile(wheel) as archive:
        return archive.read("keras_identity/models/preset_files/presets.json").decode()


def _requirement(text):
    requirement = Requirement(text)
    return (canonicalize_name(requirement.name), tuple(sorted(requirement.extras)),
            ",".join(sorted(str(s) for s in requirement.specifier)))


def test_wheel_metadata_matches_setup_cfg(wheel):
    config = configparser.ConfigParser()
    config.read(os.path.join(REPO, "setup.cfg"))

    def lines(value):
        return [line.strip() for line in value.splitlines() if line.strip()]

    expected = {None: {_requirement(r) for r in lines(config["options"]["install_requires"])}}
    for extra, value in config["options.extras_require"].items():
        expected[extra] = {_requirement(r) for r in lines(value)}
    with zipfile.ZipFile(wheel) as archive:
        (path,) = [n for n in archive.namelist() if n.endswith(".dist-info/METADATA")]
        metadata = email.parser.Parser().parsestr(archive.read(path).decode())
    found = {None: set()}
    for text in metadata.get_all("Requires-Dist"):
        marker = str(Requirement(text).marker or "")
        extra = re.fullmatch(r'extra == "([^"]+)"', marker)
        assert extra or not marker, f"unexpected marker in Requires-Dist: {text}"
        found.setdefault(extra and extra.group(1), set()).add(_requirement(text))
    assert set(metadata.get_all("Provides-Extra")) == set(expected) - {None}
    assert found == expected


def test_installed_wheel_not_the_repository_is_imported(venv, tmp_path):
    script = ("import importlib.util, json; print(json.dumps({name: getattr("
              "importlib.util.find_spec(name), 'origin', None) for name in "
              "('keras_identity', 'keras_identity_cli', 'keras', 'experiments', 'export', "
              "'benchmarks')}))")
    result = _run([str(venv / "python"), "-c", script], cwd=tmp_path, timeout=60)
    assert result.returncode == 0, _tail(result)
    origins = json.loads(result.stdout)
    site = _run([str(venv / "python"), "-c", "import sysconfig; "
                 "print(sysconfig.get_paths()['purelib'])"], cwd=tmp_path,
                timeout=60).stdout.strip()
    for name in ("keras_identity", "keras_identity_cli"):
        assert origins[name] == os.path.join(site, name, "__init__.py")
    assert origins["keras"]  # the borrowed third-party packages
    for name in ("experiments", "export", "benchmarks"):  # the repository's, not shipped
        assert not (origins[name] or "").startswith(os.path.abspath(REPO) + os.sep), origins
    result = _run([str(venv / "python"), "-c", "import experiments"], cwd=tmp_path, timeout=60)
    assert result.returncode != 0 and "No module named 'experiments'" in result.stderr
    for command in COMMANDS:
        assert os.access(venv / command, os.X_OK), command
    # A preset loads from the installed wheel, its sha256 checked.
    result = _run([str(venv / "python"), "-c", "import keras_identity as ki; "
                   "print(ki.models.highway_net(10, weights='mnist').count_params())"],
                  cwd=tmp_path, timeout=120)
    assert result.returncode == 0 and result.stdout.split()[-1] == "85660", _tail(result)


def test_console_commands_train_and_export_outside_the_repository(venv, tmp_path):
    # The default first run: the highway net on the built-in MNIST.
    result = _run([str(venv / "keras-identity-train"), "--epochs=1", "--steps_per_epoch=3",
                   "--train_examples=512", "--test_examples=256", "--batch_size=64",
                   "--verbose=2", f"--model_dir={tmp_path / 'run'}"], cwd=tmp_path,
                  timeout=600)
    assert result.returncode == 0, _tail(result)
    assert (tmp_path / "run" / "model.keras").is_file()
    card = json.loads((tmp_path / "run" / "model_card.json").read_text())
    assert card["package"]["commit"] is None and card["command"].startswith(
        "keras-identity-train --epochs=1 ")  # an installed wheel has no checkout
    result = _run([str(venv / "keras-identity-export"),
                   f"--model_path={tmp_path / 'run' / 'model.keras'}",
                   f"--export_dir={tmp_path / 'serving'}"], cwd=tmp_path, timeout=600)
    assert result.returncode == 0, _tail(result)
    assert os.listdir(tmp_path / "serving") == ["1"]
    assert (tmp_path / "serving" / "1" / "saved_model.pb").is_file()

"""experiments/colab_tpu.ipynb runs top to bottom on both routes (tiny,
offline, on the CPU), and its install cell picks the right packages for
each runtime."""

import os

import pytest

from tests.backend import default_route
from tests.conftest import REPO
from tests.datasets import cifar_like_npz

nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")

NOTEBOOK = os.path.join(REPO, "experiments", "colab_tpu.ipynb")
TINY = """ROUTE = {route!r}
PACKAGE = "unused"
DEPTH = 11
BATCH_PER_REPLICA = 32
TRAIN_STEPS = 2
DATA_DIR = {data_dir!r}
TRAIN_EXAMPLES = 256
MODEL_DIR = "runs/colab_tiny"
DRIVE = True
EXPORT_DIR = "serving/colab_tiny"
"""


def _install_functions():
    """The install cell's functions, without running its installs."""
    notebook = nbformat.read(NOTEBOOK, as_version=4)
    cell = next(c for c in notebook.cells if "def install_plan" in c.source)
    source = cell.source.split("RUNTIME, CHIPS, ACCELERATOR, PYTHON =")[0]
    namespace = {"PACKAGE": "keras_identity"}
    exec(source, namespace)
    return namespace


@pytest.mark.parametrize("route, kind, python, expected", [
    ("auto", "tpu", (3, 12), ("jax", ["keras_identity[jax]", "jax[tpu]>=0.10,<0.11"])),
    ("auto", "gpu", (3, 12), ("tensorflow", ["keras_identity[gpu]"])),
    ("auto", "cpu", (3, 11), ("tensorflow", ["keras_identity[cpu]"])),
    ("jax", "gpu", (3, 12), ("jax", ["jax[cuda12]>=0.10,<0.11"])),
    ("tensorflow", "tpu", (3, 11), ("tensorflow", [
        "tensorflow-tpu==2.19.0", "https://storage.googleapis.com/libtpu-tf-releases/index.html",
        "keras>=3.15,<4"])),
])
def test_install_plan_per_runtime(route, kind, python, expected):
    functions = _install_functions()
    resolved, commands = functions["install_plan"](route, kind, python)
    assert resolved == expected[0]
    for argument in expected[1]:
        assert argument in commands[0]
    assert not any("tensorflow-cpu" in a or a.startswith("tensorflow==") for a in commands[0])
    if resolved == "jax":  # trains without TensorFlow; the export cell adds it
        assert not any(a.startswith("tensorflow") and a != "tensorflow-datasets"
                       for command in commands for a in command)
        export = functions["EXPORT_PLAN"]
        assert export[0][0].startswith("tensorflow-cpu")
        assert export[-1][0] == "--no-deps" and export[-1][1].startswith("tensorflow-serving-api")
    else:
        assert commands[-1][0] == "--no-deps" and commands[-1][1].startswith(
            "tensorflow-serving-api")


def test_tensorflow_on_a_tpu_runtime_without_wheels_says_what_to_pick():
    plan = _install_functions()["install_plan"]
    with pytest.raises(RuntimeError, match=r"Python 3\.10-3\.12; this runtime has Python 3\.13.*"
                                           r"Runtime version.*ROUTE = 'jax'"):
        plan("tensorflow", "tpu", (3, 13))
    with pytest.raises(ValueError, match="ROUTE='torch'"):
        plan("torch", "tpu", (3, 12))


# Each route runs in a kernel of its own; the export cell needs TensorFlow (on
# Colab it installs it): run once, beside TensorFlow.
@default_route
@pytest.mark.parametrize("route", ["tensorflow", "jax"])
def test_notebook_runs_top_to_bottom(route, tmp_path):
    # A CIFAR-10-like set of 256 training and 64 test images: decoding the
    # shared JPEG copy and evaluating on its 10,000 test images would be most
    # of the test's time.
    data_dir = cifar_like_npz(tmp_path / "cifar10-like.npz", 256, 64)
    notebook = nbformat.read(NOTEBOOK, as_version=4)
    parameters = [c for c in notebook.cells if "parameters" in c.metadata.get("tags", [])]
    assert len(parameters) == 1
    parameters[0].source = TINY.format(route=route, data_dir=data_dir)
    client = nbclient.NotebookClient(notebook, timeout=600, kernel_name="python3",
                                     resources={"metadata": {"path": str(tmp_path)}})
    client.execute()
    text = "\n".join(out.get("text", "") for cell in notebook.cells if cell.cell_type == "code"
                     for out in cell.get("outputs", []))
    assert f"route: {route}" in text
    assert "keras_identity is installed; nothing to install" in text
    assert f"Keras {__import__('keras').__version__} {route}" in text
    if route == "jax":
        assert "devices: [CpuDevice(id=0)]" in text
    assert "test error" in text
    assert "3 warm-up requests replayed" in text
    # A JAX export runs its model through XLA: TF Serving needs its flag.
    assert ("serve with --xla_cpu_compilation_enabled=true" in text) is (route == "jax")
    assert "signature_def['serving_bytes']" in text
    assert (tmp_path / "runs" / "colab_tiny" / "curves.png").exists()
    assert (tmp_path / "serving" / "colab_tiny" / "1" / "saved_model.pb").exists()
    if route == "jax":
        # A restarted runtime (a fresh kernel) runs the notebook again, with a
        # longer run: the training cell resumes from MODEL_DIR's checkpoint.
        again = nbformat.read(NOTEBOOK, as_version=4)
        train_cell = next(i for i, c in enumerate(again.cells) if "train(config" in c.source)
        again.cells = again.cells[:train_cell + 1]
        next(c for c in again.cells if "parameters" in c.metadata.get("tags", [])).source = \
            TINY.format(route=route, data_dir=data_dir).replace(
                "TRAIN_STEPS = 2", "TRAIN_STEPS = 4")
        nbclient.NotebookClient(again, timeout=600, kernel_name="python3", resources={
            "metadata": {"path": str(tmp_path)}}).execute()
        text = "\n".join(out.get("text", "") for cell in again.cells
                         if cell.cell_type == "code" for out in cell.get("outputs", []))
        assert "model_dir: runs/colab_tiny" in text
        assert "resuming from the checkpoint at step 2 " in text and "after 4 steps" in text

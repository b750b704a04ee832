"""experiments/colab_tpu.ipynb runs top to bottom (tiny, offline, on the CPU)."""

import os

import pytest

from tests.conftest import REPO

nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")

TINY = """REPO_URL = "unused"
DEPTH = 11
BATCH_PER_REPLICA = 32
TRAIN_STEPS = 2
DATA_DIR = {data_dir!r}
TRAIN_EXAMPLES = 256
MODEL_DIR = "runs/colab_tiny"
EXPORT_DIR = "serving/colab_tiny"
"""


def test_notebook_runs_top_to_bottom(tmp_path, shared_dir):
    notebook = nbformat.read(os.path.join(REPO, "experiments", "colab_tpu.ipynb"), as_version=4)
    parameters = [c for c in notebook.cells if "parameters" in c.metadata.get("tags", [])]
    assert len(parameters) == 1
    parameters[0].source = TINY.format(data_dir=os.path.join(shared_dir, "data"))
    client = nbclient.NotebookClient(notebook, timeout=600, kernel_name="python3",
                                     resources={"metadata": {"path": str(tmp_path)}})
    client.execute()
    text = "\n".join(out.get("text", "") for cell in notebook.cells if cell.cell_type == "code"
                     for out in cell.get("outputs", []))
    assert "test error" in text
    assert "3 warm-up requests replayed" in text
    assert "signature_def['serving_bytes']" in text
    assert (tmp_path / "runs" / "colab_tiny" / "curves.png").exists()
    assert (tmp_path / "serving" / "colab_tiny" / "1" / "saved_model.pb").exists()

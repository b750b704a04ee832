"""benchmarks.input_pipeline: both routes' images/s on a JPEG folder it
makes from CIFAR-10 (tf.data where TensorFlow is installed), and bad flags."""

import os
import subprocess
import sys

import pytest

from keras_identity import _tensorflow
from tests.conftest import REPO
from tests.programs import run_refusals

pytest.importorskip("grain")


def _cli(*args):
    return subprocess.run([sys.executable, "-m", "benchmarks.input_pipeline", *args],
                          cwd=REPO, text=True, capture_output=True, timeout=600,
                          env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2"))


def _rows(stdout):
    header, _, *rows = [l for l in stdout.splitlines() if l.startswith("|")]
    titles = [c.strip() for c in header.strip("|").split("|")]
    return [dict(zip(titles, (c.strip() for c in row.strip("|").split("|")))) for row in rows]


def test_a_small_jpeg_folder_is_made_once_and_read_by_every_pipeline(tmp_path, shared_dir):
    folder = tmp_path / "jpegs"
    args = (f"--data_dir={os.path.join(shared_dir, 'data')}", f"--folder={folder}", "--images=8",
            "--image_size=64x48", "--batch_size=4", "--batches=2", "--warmup=1",
            "--repeats=1", "--workers=1,2")
    result = _cli(*args)
    assert result.returncode == 0, result.stderr[-2000:]
    assert "8 JPEGs of 64x48" in result.stdout and "Machine:" in result.stdout
    jpegs = sorted(p for p in folder.rglob("*.jpg"))
    assert len(jpegs) == 8 + 20 and (folder / "made-8-64x48").exists()
    assert len({p.parent.name for p in jpegs}) > 2  # classes drawn at random, not one
    rows = _rows(result.stdout)
    expected = ([("tf.data (TensorFlow route)", "1 threads")] * _tensorflow.available()
                + [("Grain processes (JAX route)", "1 processes")]
                + [("tf.data (TensorFlow route)", "2 threads")] * _tensorflow.available()
                + [("Grain processes (JAX route)", "2 processes"),
                   ("threads of one process (JAX route)", "2 threads")])
    assert [(r["pipeline"], r["workers"]) for r in rows] == expected
    assert all(float(r["images/s (median)"].replace(",", "")) > 0 for r in rows)
    before = jpegs[0].stat().st_mtime_ns
    assert _cli(*args[:-1], "--workers=1", "--pipelines=threads").returncode == 0
    assert jpegs[0].stat().st_mtime_ns == before  # the folder is reused


def test_a_folder_it_did_not_make_is_refused_not_trusted(tmp_path, shared_dir):
    """A folder holding other files, a tree made for another size, or one
    whose images went missing after its stamp: one line, and the stamp is
    not taken for the tree.  (The program's runs two by two in one process:
    its own process is tested above.)"""
    def args(folder, size="64x48"):
        return [f"--data_dir={os.path.join(shared_dir, 'data')}", f"--folder={folder}",
                "--images=8", f"--image_size={size}", "--batch_size=4", "--batches=1",
                "--warmup=1", "--repeats=1", "--workers=1", "--pipelines=threads"]
    other, folder = tmp_path / "other", tmp_path / "jpegs"
    other.mkdir()
    folder.mkdir()  # an empty folder is filled
    (other / "notes.txt").write_text("someone else's")
    (tmp_path / "jpegs.partial" / "train").mkdir(parents=True)  # an interrupted make's
    (code, stderr), (made, made_err) = run_refusals("benchmarks.input_pipeline",
                                                    [args(other), args(folder)])
    assert code != 0
    assert (f"--folder={other} is not the tree this benchmark makes for these flags "
            f"(other files, another --images/--image_size, or images missing): remove it or "
            f"give a new --folder") in stderr
    assert sorted(os.listdir(other)) == ["notes.txt"]
    assert made == 0, made_err[-2000:]
    assert sorted(os.listdir(folder)) == ["made-8-64x48", "train", "val"]
    assert not (tmp_path / "jpegs.partial").exists()
    next(folder.rglob("train/*/*.jpg")).unlink()
    (code, stderr), (code2, stderr2) = run_refusals("benchmarks.input_pipeline", [
        args(folder), args(folder, "32x24")])
    assert code != 0 and "is not the tree this benchmark makes" in stderr
    assert code2 != 0 and "train/ with 8 images, val/ and made-8-32x24 only" in stderr2


BAD_FLAGS = [
    ("--workers=0", "--workers='0' is not valid; expected positive numbers or all."),
    ("--pipelines=dali", "--pipelines=dali is not valid; expected some of: tf.data, grain, "
                         "threads."),
    ("--image_size=big", "--image_size='big' is not valid; expected WIDTHxHEIGHT"),
]


@pytest.fixture(scope="module")
def bad_flag_runs(tmp_path_factory):
    """Each of BAD_FLAGS's runs, all in one process."""
    folder = tmp_path_factory.mktemp("folder")
    return dict(zip([flag for flag, _ in BAD_FLAGS], run_refusals(
        "benchmarks.input_pipeline", [[flag, f"--folder={folder}"] for flag, _ in BAD_FLAGS])))


@pytest.mark.parametrize("flag, words", BAD_FLAGS)
def test_bad_flags_are_one_line(flag, words, bad_flag_runs):
    code, stderr = bad_flag_runs[flag]
    assert code != 0 and words in stderr
    assert "Traceback" not in stderr

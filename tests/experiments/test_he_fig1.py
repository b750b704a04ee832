"""experiments.he_fig1: Fig. 1's runs in turns, and the verdict on its statement."""

import subprocess
import sys

import numpy as np
import pytest

from experiments._curves import verdict
from tests.backend import default_route
from tests.conftest import REPO


def curve(*losses, every=25):
    return [{"step": every * (i + 1), "loss": loss, "test_error": 0.9}
            for i, loss in enumerate(losses)]


def test_verdict_needs_every_point_above_and_a_gap_beyond_the_seeds():
    common = [25, 50, 75, 100]
    curves = {"original": curve(9.0, 4.0, 3.0, 2.6), "preact": curve(2.3, 2.2, 2.1, 2.0)}
    seeds = {"original": curve(8.0, 3.9, 3.1, 2.7), "preact": curve(2.3, 2.2, 2.1, 2.05)}
    text = verdict(curves, seeds, common)
    assert text.startswith("reproduces at this scale: ")
    assert "at 4 of 4 logged points up to iteration 100 (gap at 100: +0.600)" in text
    assert "moves a net's loss by up to 0.100" in text and "separate the nets" in text
    # A gap that a second seed alone could close is not a reproduction.
    seeds["original"] = curve(8.0, 3.9, 3.1, 1.9)
    assert verdict(curves, seeds, common).startswith("does not show at 100 iterations")
    # Seeds that separate the nets early, a gap that shrinks below their spread later.
    closing = {"original": curve(9.0, 4.0, 3.0, 2.15), "preact": curve(2.3, 2.2, 2.1, 2.0)}
    early = {"original": curve(8.0, 3.5), "preact": curve(2.3, 2.2)}
    assert verdict(closing, early, common).startswith(
        "reproduces at 50 iterations, where the seeds separate the nets; at 100 the gap is "
        "within what a second seed moves a net: ")
    # The original below everywhere contradicts the statement.
    flipped = {"original": curves["preact"], "preact": curves["original"]}
    assert verdict(flipped, {"original": [], "preact": []}, common).startswith(
        "contradicted at this scale")
    assert verdict(curves, seeds, []) == "not run yet"


def run(*args):
    return subprocess.run([sys.executable, "-m", "experiments.he_fig1", *args], cwd=REPO,
                          text=True, capture_output=True, timeout=600)


@pytest.mark.parametrize("args, message", [
    (["--iterations=30"], "--iterations=30 is not valid; expected a multiple of "
                          "--interval=25"),
    (["--iterations=100", "--seed_iterations=200"], "--seed_iterations=200 is not valid; "
                                                    "expected at most --iterations=100"),
    (["--chunk=0"], "--chunk=0 is not valid; expected >= 1"),
    (["--iterations=200000"], "--iterations=200000 is not valid; expected at most the "
                              "schedule's 128,000 iterations at --batch_size=64 (0: all of "
                              "them)"),
])
def test_bad_flags_are_one_line(args, message):
    result = run(*args)
    assert result.returncode == 2
    assert result.stderr.strip().splitlines()[-1] == f"error: {message}"


@pytest.mark.slow  # an end-to-end run of the driver (minutes): -m slow
@default_route
def test_runs_take_turns_and_the_report_compares_equal_lengths(tmp_path):
    rng = np.random.default_rng(0)
    data = tmp_path / "cifar-like.npz"
    np.savez(data, x_train=rng.integers(0, 256, (256, 32, 32, 3), dtype=np.uint8),
             y_train=rng.integers(0, 10, 256), x_test=rng.integers(0, 256, (32, 32, 32, 3),
                                                                    dtype=np.uint8),
             y_test=rng.integers(0, 10, 32))
    result = run(f"--data_dir={data}", "--depth=11", "--batch_size=16", "--iterations=4",
                 "--seed_iterations=2", "--interval=2", "--chunk=2", "--test_examples=16",
                 f"--run_dir={tmp_path / 'runs'}", f"--report_dir={tmp_path}")
    assert result.returncode == 0, result.stderr[-2000:]
    order = [line.split(":")[0] for line in result.stdout.splitlines() if ": to iteration" in line]
    assert order == ["original seed 0", "preact seed 0", "original seed 1", "preact seed 1",
                     "original seed 0", "preact seed 0"]
    report = (tmp_path / "he_fig1_11.md").read_text()
    assert "- summary: ResNet-11, batch 16, first 4 iterations: training loss" in report
    assert "stopped after 4 of its" in report and "(the learning rate is the full " in report
    assert "--stop_at_step=4" in report and "he_fig1_11_curves.png" in report
    assert (tmp_path / "he_fig1_11_curves.png").exists()
    rows = [l for l in report.splitlines() if l.startswith("| 4 |")]
    assert len(rows) == 1 and rows[0].count(" - ") == 2   # seed 1 stopped at 2

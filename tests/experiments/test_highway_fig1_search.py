"""experiments.highway_fig1_search: both nets searched, the best retrained,
the report written with its summary line."""

import json
import subprocess
import sys

from tests.backend import default_route
from tests.conftest import REPO


@default_route
def test_smoke_run_searches_both_nets_and_reports(tmp_path):
    args = [sys.executable, "-m", "experiments.highway_fig1_search", "--depth=3", "--trials=2",
            "--epochs=1", "--retrain_epochs=1", "--train_examples=8000",
            f"--run_dir={tmp_path / 'runs'}", f"--report_dir={tmp_path}"]
    result = subprocess.run(args, cwd=REPO, text=True, capture_output=True, timeout=900)
    assert result.returncode == 0, result.stderr[-3000:]
    report = (tmp_path / "highway_fig1_search_mnist.md").read_text()
    assert "- summary: 3 layers, 2 trials per net: final training loss highway " in report
    assert ("trains 1 epochs on about 7,200 training images" in report and
            "a random 8,000 of MNIST's 60,000 training images (a smoke test)" in report)
    for net in ("highway-3", "plain-3"):
        row = next(line for line in report.splitlines() if line.startswith(f"| {net} |"))
        assert "| 2 (" in row and ("relu" in row or "tanh" in row)
    summaries = json.loads((tmp_path / "runs" / "summary.json").read_text())
    assert [s["net"] for s in summaries] == ["highway", "plain"]
    assert "b_T" in summaries[0]["best"] and "b_T" not in summaries[1]["best"]
    for s in summaries:
        assert len(s["curve"]) == 1 and s["retrain_loss"] > 0
        assert 0.0 < s["retrain_test_error"] < 0.85, s  # chance: 0.9
    assert (tmp_path / "highway_fig1_search_3.png").stat().st_size > 5000

"""keras-identity-tune killed mid-search and started again."""

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from tests.backend import default_route
from tests.conftest import REPO
from tests.programs import error_lines
from tests.programs import run_refusals


@pytest.mark.slow
@default_route
def test_interrupted_search_resumes_without_redoing_trials(tmp_path):
    """Slow (40-70 s on 2 cores: three trials of a 20-layer net, killed in the
    second).  What only it checks: keras-identity-tune killed (SIGKILL) while
    its second trial trains, then the same command.  In the default
    run: a search resumed without redoing its finished trials
    (tests/tuning/test_oracle.py), a trial's progress cut short while written
    run again (tests/tuning/test_progress.py), the search in a bucket
    continued on another machine (tests/tuning/test_staging.py)."""
    args = [sys.executable, "-m", "keras_identity_cli.tune", "--model=highway_net", "--depth=20",
            "--train_examples=12000", "--epochs=2", "--gate_biases=0,-3,-6", "--verbose=0",
            f"--model_dir={tmp_path}"]
    process = subprocess.Popen(args, cwd=REPO, stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT, text=True)
    times = tmp_path / "search" / "records_per_trial.json"
    deadline = time.time() + 300
    # Killed while the second trial trains (after Keras Tuner has written the
    # second trial's state: its files are not written atomically).
    while time.time() < deadline and process.poll() is None:
        if times.exists() and len(json.loads(times.read_text() or "{}")) >= 1 and \
                len(list((tmp_path / "search").glob("trial_*/trial.json"))) >= 2:
            time.sleep(1.0)
            break
        time.sleep(0.05)
    assert process.poll() is None, "the search ended before it could be interrupted"
    process.send_signal(signal.SIGKILL)
    process.wait()
    finished = json.loads(times.read_text())
    assert len(finished) == 1
    first_trial = next(iter(finished))
    stamp = os.path.getmtime(tmp_path / "search" / f"trial_{first_trial}" / "trial.json")
    result = subprocess.run(args, cwd=REPO, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-2000:]
    assert "continuing after 1 finished trials" in result.stdout
    assert os.path.getmtime(tmp_path / "search" / f"trial_{first_trial}" / "trial.json") == stamp
    rows = (tmp_path / "results.csv").read_text().splitlines()
    assert len(rows) == 4  # header + the three biases


def test_bad_flags(tmp_path):
    # One line each; the search's own checks (ranges with the grid, max_trials,
    # objectives, gate biases of plain nets) are tested in tests/tuning.
    cases = [
        (["--model=resnet", "--depth=20", "--dataset=cifar10"],
         ["model='resnet' has no gate bias to search"]),
        (["--gate_biases=a,b"], ["gate_biases=a,b"]),
        (["--learning_rates=0.1:1:2"], ["learning_rates='0.1:1:2'", "low:high"]),
        (["--gate_biases="], ["gate_biases is empty"]),
        (["--depth=10", "--depths=10,20"], ["--depth and --depths are exclusive"]),
        (["--tuner=hyperband", "--max_trials=3"], ["--max_trials does not apply"]),
        (["--retrain_epochs=3"], ["--retrain_epochs applies with --retrain_best"])]
    results = run_refusals("keras_identity_cli.tune",
                           [flags + [f"--model_dir={tmp_path}"] for flags, _ in cases])
    for (flags, words), (code, stderr) in zip(cases, results):
        lines = error_lines(stderr)
        assert code == 2 and len(lines) == 1 and "Traceback" not in stderr, (flags, stderr)
        for word in words:
            assert word in lines[0], (flags, lines[0])


def test_a_depth_the_builder_refuses_is_one_line_and_leaves_no_search(tmp_path):
    import subprocess
    import sys

    from tests.conftest import REPO

    done = subprocess.run([sys.executable, "-m", "keras_identity_cli.tune", "--depth=-1",
                           f"--model_dir={tmp_path / 'search'}"], cwd=REPO, text=True,
                          capture_output=True, timeout=300)
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert done.returncode == 2 and lines == [
        "error: depth=-1 is not valid; expected an integer >= 1."], done.stderr[-2000:]
    assert not (tmp_path / "search" / "search.json").exists()

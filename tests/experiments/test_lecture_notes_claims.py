"""The lecture notes' claims: experiments.veit_deletion, .degradation and
.looks_linear (their verdicts, bad flags, and a tiny run of each)."""

import subprocess
import sys

import numpy as np
import pytest

from experiments._curves import difference_margin
from experiments._curves import tail_mean
from tests.backend import default_route
from tests.conftest import REPO
from tests.programs import run_programs


def run(module, *args):
    return subprocess.run([sys.executable, "-m", f"experiments.{module}", *args], cwd=REPO,
                          text=True, capture_output=True, timeout=900)


def test_margin_is_two_standard_errors_of_a_difference():
    # p = 0.5 on 3200 images each: sqrt(2 * 0.25 / 3200) = 0.0125, twice that.
    assert difference_margin({"a": 0.4, "b": 0.6}, 3200) == pytest.approx(0.025)
    assert difference_margin([0.0, 0.0], 100) == pytest.approx(2 * np.sqrt(2 * 0.0099 / 100))
    rows = [{"train_error": e} for e in (0.9, 0.5, 0.4, 0.3)]
    assert tail_mean(rows, points=3) == pytest.approx(0.4)


def test_veit_verdict_and_smoothness():
    from experiments._verdicts import deletion_verdict as verdict
    from experiments._verdicts import smoothness

    residual = {"baseline": 0.02, "single": [0.025, 0.03, None, 0.035],
                "random": [[0.03, 0.03], [0.05, 0.07], [0.10, 0.12]]}
    plain = {"baseline": 0.05, "single": [0.9, 0.85, None, 0.88], "random": [[0.9]] * 3}
    text = verdict({"residual": residual, "plain": plain})
    assert text.startswith("reproduces at this scale: deleting one unit costs the residual "
                           "net +1.00 points of test error on average (worst +1.50) and the "
                           "plain net +82.67")
    assert verdict({"residual": plain, "plain": residual}).startswith("contradicted")
    assert verdict({"residual": residual, "plain": residual}).startswith("partly")
    rise, marks = smoothness(residual)
    assert rise == pytest.approx(0.05) and marks == pytest.approx({1: 0.03, 3: 0.11})


def test_veit_cifar_verdict_keeps_the_downsampling_units_apart():
    from experiments._verdicts import cifar_deletion_verdict as verdict
    from experiments._verdicts import downsampling_split as split

    study = {"baseline": 0.10, "single": [0.11, 0.30, 0.12, None, 0.50, 0.13],
             "changes_shape": [False, True, False, False, True, False]}
    assert split(study) == ([0.11, 0.12, 0.13], [0.30, 0.50])
    assert verdict(study) == ("reproduces: one unit that keeps the shape deleted costs +2.00 "
                              "points on average (worst +3.00), a downsampling unit +30.00")
    study["single"] = [0.11, 0.10, 0.12, None, 0.13, 0.13]
    assert verdict(study).startswith("partly (the downsampling units cost about as much)")
    study["single"] = [0.20, 0.30, 0.25, None, 0.50, 0.15]
    assert verdict(study).startswith("not at this depth: one unit that keeps the shape "
                                     "deleted costs +10.00")
    study["changes_shape"] = [True] * 6
    assert verdict(study).startswith("not measured")


def test_degradation_verdict_needs_gaps_beyond_sampling_noise():
    from experiments._verdicts import degradation_verdict as verdict

    errors = {"plain20": 0.30, "plain56": 0.40, "resnet20": 0.30, "resnet56": 0.29}
    assert verdict(errors, "20", "56", 9600, 200).startswith(
        "reproduces at this scale: going from 20 to 56 layers changes the plain nets' "
        "training error by +10.0 points and the ResNets' by -1.0 (two standard errors")
    errors["resnet56"] = 0.35
    assert verdict(errors, "20", "56", 9600, 200).startswith("partly")
    # Still above, but closing on the shallower net while the plain nets' gap does not.
    closing = {"plain": 0.10, "resnet": 0.20}
    assert verdict(errors, "20", "56", 9600, 200, closing).startswith(
        "reproduces at this scale (the deeper ResNet closing on the shallower")
    assert verdict(errors, "20", "56", 9600, 200, {"plain": 0.30, "resnet": 0.20}).startswith(
        "partly")   # the plain nets' gap closed too
    # The same gaps measured on 96 images are noise.
    assert verdict(errors, "20", "56", 96, 200).startswith(
        "does not show at 200 iterations")


def test_degradation_curves_name_where_a_net_leaves_chance():
    from experiments._verdicts import left_chance
    from experiments._verdicts import points_above

    deep = [{"step": 25 * i, "train_error": e} for i, e in
            enumerate([0.90, 0.89, 0.86, 0.84, 0.70], start=1)]
    shallow = [{"step": 25 * i, "train_error": e} for i, e in
               enumerate([0.85, 0.80, 0.87, 0.60], start=1)]
    assert left_chance(deep) == 100 and left_chance(shallow) == 50
    assert left_chance(deep, below=0.5) is None
    assert points_above(deep, shallow) == (3, 4)   # the 4 iterations both logged
    assert points_above(shallow, deep) == (1, 4)


def test_looks_linear_verdict():
    from experiments._verdicts import looks_linear_verdict as verdict

    errors = {"relu10": 0.10, "relu30": 0.60, "crelu_ll10": 0.10, "crelu_ll30": 0.12,
              "resnet10": 0.08, "resnet30": 0.11}
    assert verdict(errors, [10, 30], 3200).startswith(
        "reproduces at this scale: at depth 30 the looks-linear net's training error is "
        "+1.0 points from the ResNet's and the ReLU net's +48.0 from the looks-linear net's")
    errors["crelu_ll30"] = 0.60
    assert verdict(errors, [10, 30], 3200).startswith("contradicted")


_BAD_FLAGS = [
    ("degradation", ["--depths=20"], "--depths=20 is not valid; expected two depths 6n+2"),
    ("degradation", ["--depths=56,20"], "--depths=56,20 is not valid"),
    ("degradation", ["--iterations=30"], "--iterations=30 is not valid; expected a multiple "
                                         "of --interval=25"),
    ("degradation", ["--depths=20,x"], "--depths=20,x is not valid; expected two depths 6n+2"),
    ("degradation", ["--interval=0"], "--interval=0 is not valid; expected >= 1"),
    ("degradation", ["--test_examples=-1"], "--test_examples=-1 is not valid; expected >= 0"),
    ("degradation", ["extra"], "unexpected arguments ['extra']"),
    ("looks_linear", ["--depths=10,31"], "--depths=10,31 is not valid; expected two or more "
                                         "even depths"),
    ("looks_linear", ["--learning_rate=0"], "--learning_rate=0 is not valid; expected > 0"),
    ("looks_linear", ["--depths=10,30", "--gradient_depth=-1"],
     "--gradient_depth=-1 is not valid; expected >= 0"),
    ("looks_linear", ["--depths=10"], "--depths=10 is not valid; expected two or more even"),
    ("looks_linear", ["--iterations=100", "--interval=2"], "--iterations=100 is not valid; "
                                                           "expected at most the schedule's 60"),
    ("veit_deletion", ["--draws=0"], "--draws=0 is not valid; expected >= 1"),
    ("veit_deletion", ["--weights=nosuch"], "--weights=nosuch is not valid: neither net has "
                                            "a preset of that name"),
    ("highway_gates", ["--weights=nosuch"], "--weights=nosuch is not valid; expected a preset"),
    ("veit_deletion_cifar", ["--draws=0"], "--draws=0 is not valid; expected >= 1"),
    ("veit_deletion_cifar", ["--weights=mnist"], "--weights=mnist is not valid: no residual "
                                                 "net trained on CIFAR-10 has a preset"),
    ("veit_deletion", ["--train_steps=50"], "--train_steps=50 is not valid; expected a "
                                            "multiple of --interval=40"),
]


@pytest.fixture(scope="module")
def refusals():
    """Each case's (exit code, stderr): each program's ``run()`` once per
    case, all in one process (tests/programs.py)."""
    answers = run_programs([(f"experiments.{module}", args) for module, args, _ in _BAD_FLAGS],
                           one_process=True)
    return [(code, stderr) for code, stderr, _ in answers]


@pytest.mark.parametrize("case", range(len(_BAD_FLAGS)),
                         ids=[f"{m}{a[0]}" for m, a, _ in _BAD_FLAGS])
def test_bad_flags_are_one_line(refusals, case):
    code, stderr = refusals[case]
    assert code == 2
    assert stderr.strip().splitlines()[-1].startswith(f"error: {_BAD_FLAGS[case][2]}"), stderr


@pytest.fixture
def fake_data(tmp_path):
    rng = np.random.default_rng(0)
    mnist, cifar = tmp_path / "mnist.npz", tmp_path / "cifar.npz"
    np.savez(mnist, x_train=rng.integers(0, 256, (256, 28, 28), dtype=np.uint8),
             y_train=rng.integers(0, 10, 256),
             x_test=rng.integers(0, 256, (32, 28, 28), dtype=np.uint8),
             y_test=rng.integers(0, 10, 32))
    np.savez(cifar, x_train=rng.integers(0, 256, (256, 32, 32, 3), dtype=np.uint8),
             y_train=rng.integers(0, 10, 256),
             x_test=rng.integers(0, 256, (32, 32, 32, 3), dtype=np.uint8),
             y_test=rng.integers(0, 10, 32))
    return mnist, cifar


@pytest.mark.slow  # an end-to-end run of the driver (minutes): -m slow
@default_route
def test_degradation_runs_four_nets_and_reports(tmp_path, fake_data):
    _, cifar = fake_data
    result = run("degradation", f"--data_dir={cifar}", "--depths=8,14", "--iterations=4",
                 "--interval=2", "--batch_size=16", "--test_examples=16",
                 f"--run_dir={tmp_path / 'runs'}", f"--report_dir={tmp_path}")
    assert result.returncode == 0, result.stderr[-2000:]
    report = (tmp_path / "degradation_cifar10.md").read_text()
    assert "- summary: 4 iterations at batch 16, training error (last 6 iterations): plain-8 " \
           in report
    for label in ("plain-8", "plain-14", "ResNet-8", "ResNet-14"):
        assert f"| {label} | " in report
    assert "--shortcut_scale=0 --depth=14" in report and "--stop_at_step=4" in report
    assert (tmp_path / "degradation_cifar10.png").stat().st_size > 1000
    again = run("degradation", f"--data_dir={cifar}", "--depths=8,14", "--iterations=4",
                "--interval=2", "--batch_size=16", "--test_examples=16",
                f"--run_dir={tmp_path / 'runs'}", f"--report_dir={tmp_path}")
    assert again.returncode == 0 and ": to iteration" not in again.stdout   # nothing retrained


@pytest.mark.slow  # an end-to-end run of the driver (minutes): -m slow
@default_route
def test_looks_linear_runs_and_reports(tmp_path, fake_data):
    mnist, _ = fake_data
    result = run("looks_linear", f"--data_dir={mnist}", "--depths=4,6", "--iterations=2",
                 "--interval=2", "--test_examples=16", "--gradient_depth=3",
                 f"--run_dir={tmp_path / 'runs'}", f"--report_dir={tmp_path}")
    assert result.returncode == 0, result.stderr[-2000:]
    report = (tmp_path / "looks_linear_mnist.md").read_text()
    assert "| 6 | CReLU, looks-linear | 18,986 |" in report
    assert "| 6 | ReLU, He init | 19,606 |" in report
    assert "lag-1 autocorrelation of the input gradient is" in report
    assert '"kernel_initializer": "looks_linear"' in report
    # 2 of the schedule's 30 x 2 iterations, its /10 steps at 30 and 45.
    assert ("2 iterations (0.00 epochs): 3% of the schedule of 60 iterations, lr /10 at 30 "
            "and 45") in report


@pytest.mark.slow
def test_veit_deletion_runs_and_reports(tmp_path, fake_data):
    mnist, _ = fake_data
    result = run("veit_deletion", f"--data_dir={mnist}", "--train_steps=2", "--interval=2",
                 "--test_examples=16", "--draws=1", f"--run_dir={tmp_path / 'runs'}",
                 f"--report_dir={tmp_path}")
    assert result.returncode == 0, result.stderr[-2000:]
    report = (tmp_path / "veit_deletion_mnist.md").read_text()
    assert "25 basic units of 16 channels, 117,802 parameters" in report
    assert report.count("| stage1_unit") == 25


@pytest.mark.slow
def test_veit_deletion_studies_the_nets_that_have_a_preset(tmp_path, fake_data):
    """With --weights the ResNet is the preset trained to the end, not trained here."""
    mnist, _ = fake_data
    result = run("veit_deletion", f"--data_dir={mnist}", "--weights=mnist", "--train_steps=2",
                 "--interval=2", "--test_examples=16", "--draws=1",
                 f"--run_dir={tmp_path / 'runs'}", f"--report_dir={tmp_path}")
    assert result.returncode == 0, result.stderr[-2000:]
    assert not (tmp_path / "runs" / "residual" / "model.keras").exists()  # not trained here
    report = (tmp_path / "veit_deletion_mnist.md").read_text()
    assert ("the preset `resnet(depth=52, dataset='mnist', weights='mnist')`, trained to the "
            "end (20 epochs, 9,360 iterations of the `highway_mnist` recipe") in report
    assert "| ResNet (identity shortcuts) | 9360 (preset) |" in report
    assert report.count("| stage1_unit") == 25


@pytest.mark.slow
def test_veit_deletion_cifar_studies_the_cifar10_presets(tmp_path, shared_dir):
    """Both ResNet-20 presets, on the first 200 JPEG test images; a second run reuses them."""
    args = (f"--data_dir={shared_dir}/data", "--test_examples=200", "--draws=1",
            f"--run_dir={tmp_path / 'runs'}", f"--report_dir={tmp_path}")
    result = run("veit_deletion_cifar", *args)
    assert result.returncode == 0, result.stderr[-2000:]
    report = (tmp_path / "veit_deletion_cifar10.md").read_text()
    assert "resnet20: 9 units, 2 of them downsample" in report
    assert report.count("(downsamples) |") == 4 and "| stage3_unit3 | " in report  # 2 per net
    assert "- resnet20 (original, Fig. 4(a)): " in report
    assert "- preact_resnet20 (pre-activation, Fig. 4(e)): " in report
    cached = (tmp_path / "runs" / "resnet20" / "deletions.json").stat().st_mtime
    assert run("veit_deletion_cifar", *args).returncode == 0
    assert (tmp_path / "runs" / "resnet20" / "deletions.json").stat().st_mtime == cached

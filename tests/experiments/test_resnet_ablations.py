"""The verdict of experiments.resnet_ablations: a claimed difference counts
only when the seeds separate."""

import math

import pytest

from experiments.resnet_ablations import verdict


def rows(*errors):
    return [{"test_error": e, "loss": 1.0} for e in errors]


@pytest.mark.parametrize("case, claim, expected", [
    ((0.40, 0.42, 0.41), "worse", "reproduces"),
    ((0.20, 0.21, 0.22), "worse", "contradicted (better)"),
    ((0.30, 0.36, 0.33), "worse", "cannot be judged at this scale (seed ranges overlap)"),
    ((0.20, 0.21, 0.22), "better", "reproduces"),
    ((0.30, 0.36, 0.33), "equal", "consistent (seed ranges overlap)"),
    ((0.40, 0.42, 0.41), "equal", "contradicted (worse, seeds separate)"),
    ((0.40, math.nan, 0.41), "worse", "reproduces (diverged)"),
])
def test_verdict(case, claim, expected):
    original = rows(0.30, 0.32, 0.35)
    assert verdict(rows(*case), original, claim) == expected


def test_one_seed_is_not_judged():
    assert verdict(rows(0.5), rows(0.3), "worse") == "cannot be judged (one seed)"


def test_gated_cases_are_compared_with_identity_in_their_own_unit():
    from experiments.resnet_ablations import GATING
    from experiments.resnet_ablations import TABLE2
    from experiments.resnet_ablations import reference

    table2 = {key: unit for key, *_, unit in TABLE2}
    for key, _, _, ref, kwargs in GATING:
        assert reference(key) == ref
        # The gated case differs from its reference only by the shortcut.
        assert kwargs.get("unit", "original") == table2[ref]
        assert kwargs["shortcut"] == "exclusive_gating" and kwargs["gate_bias_init"] == -6.0
    assert reference("scale05") == "original" and reference("full_preactivation") == "original"


def test_gating_section_judges_each_gated_unit_against_identity_in_that_unit():
    from experiments.resnet_ablations import gating_section
    from experiments.resnet_ablations import judge

    results = {"original": rows(0.30, 0.31, 0.32),
               "full_preactivation": rows(0.50, 0.51, 0.52),
               # Worse than the original unit, better than identity in its own unit.
               "exclusive6_full_preactivation": rows(0.40, 0.41, 0.42),
               "exclusive6": rows(0.35, 0.36, 0.37)}
    assert judge(results, "exclusive6_full_preactivation", "worse") == "contradicted (better)"
    assert judge(results, "exclusive6", "worse") == "reproduces"
    assert judge(results, "exclusive6_relu_before_addition", "worse") == ""   # no reference
    text = gating_section(results)
    table = [line for line in text.splitlines() if line.startswith("| ") and
             not line.startswith("| unit") and not line.startswith("| ---")]
    assert table == [
        "| original | 4(a) | 31.00 ± 1.00 [30.0, 31.0, 32.0] | 36.00 ± 1.00 [35.0, 36.0, "
        "37.0] | 1.000 | reproduces |",
        "| full pre-activation | 4(e) | 51.00 ± 1.00 [50.0, 51.0, 52.0] | 41.00 ± 1.00 "
        "[40.0, 41.0, 42.0] | 1.000 | contradicted (better) |"]
    assert gating_section({"original": rows(0.3, 0.3)}) == ""


def test_gating_case_without_its_reference_is_refused():
    import subprocess
    import sys

    from tests.conftest import REPO

    result = subprocess.run(
        [sys.executable, "-m", "experiments.resnet_ablations", "--tables=gating",
         "--cases=original,exclusive6_full_preactivation"], cwd=REPO, text=True,
        capture_output=True, timeout=300)
    assert result.returncode == 2
    assert result.stderr.strip().splitlines()[-1].endswith(
        "--cases must include original, full_preactivation: every case is compared with "
        "the identity shortcut in its unit, and every unit with the original")

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

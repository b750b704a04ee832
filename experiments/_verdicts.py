"""The verdicts of the lecture notes' claims (experiments.veit_deletion,
.veit_deletion_cifar, .degradation, .looks_linear) on their measurements: pure functions, kept
apart from the programs, whose flags a test process must not define twice.
"""

from experiments._curves import difference_margin

# Veit et al. at this scale: one deleted unit costs the residual net at most
# BARELY of test error on average, and the plain net at least COLLAPSE.
BARELY = 0.02
COLLAPSE = 0.30


def deletion_verdict(results):
    """Veit et al.'s claims at this scale, from ``{"residual": study, "plain": study}``."""
    res, plain = results["residual"], results["plain"]
    res_cost = mean_single_deletion(res) - res["baseline"]
    plain_cost = mean_single_deletion(plain) - plain["baseline"]
    worst = worst_single_deletion(res) - res["baseline"]
    text = (f"deleting one unit costs the residual net {100 * res_cost:+.2f} points of test "
            f"error on average (worst {100 * worst:+.2f}) and "
            f"the plain net {100 * plain_cost:+.2f} (its error then "
            f"{100 * mean_single_deletion(plain):.1f}%)")
    if res_cost <= BARELY and plain_cost >= COLLAPSE:
        return "reproduces at this scale: " + text
    if res_cost > BARELY and plain_cost < COLLAPSE:
        return "contradicted at this scale: " + text
    return "partly: " + text


def downsampling_split(study):
    """Single-deletion errors of the units that keep the shape and of those
    that downsample (their option-A or projection shortcut stays)."""
    pairs = [(e, s) for e, s in zip(study["single"], study["changes_shape"]) if e is not None]
    return [e for e, s in pairs if not s], [e for e, s in pairs if s]


def cifar_deletion_verdict(study):
    """Veit et al.'s single-deletion claim on CIFAR for one net: the units that
    keep the shape cost at most :data:`BARELY` on average, and the downsampling
    ones more than that, by more than :data:`BARELY` again (their Fig. 3)."""
    keep, down = downsampling_split(study)
    if not keep:
        return "not measured: no unit that keeps the shape could be deleted"
    base = study["baseline"]
    cost = sum(keep) / len(keep) - base
    down_cost = sum(down) / len(down) - base if down else None
    text = (f"one unit that keeps the shape deleted costs {100 * cost:+.2f} points on average "
            f"(worst {100 * (max(keep) - base):+.2f})"
            + (f", a downsampling unit {100 * down_cost:+.2f}" if down else ""))
    if cost <= BARELY and (down_cost is None or down_cost - cost > BARELY):
        return "reproduces: " + text
    if cost <= BARELY:
        return "partly (the downsampling units cost about as much): " + text
    return "not at this depth: " + text


def mean_single_deletion(study):
    errors = [e for e in study["single"] if e is not None]
    return sum(errors) / len(errors)


def worst_single_deletion(study):
    return max(e for e in study["single"] if e is not None)


def smoothness(study):
    """The largest rise of the mean error from k to k + 1 deleted units, and
    the mean errors at k = 1, a fifth, half and all of the units."""
    means = [sum(draws) / len(draws) for draws in study["random"]]
    rises = [b - a for a, b in zip(means, means[1:])]
    n = len(means)
    marks = sorted({1, max(1, n // 5), max(1, n // 2), n})
    return max(rises, default=0.0), {k: means[k - 1] for k in marks}


def degradation_verdict(errors, shallow, deep, images, iterations, first_gaps=None):
    """He et al.'s claim at this scale from ``{key: training error}``, each
    the mean over ``images`` training images.  ``first_gaps``: ``{"plain":
    gap, "resnet": gap}`` of the deeper minus the shallower net over the first
    quarter of the run (measured the same way): a deeper ResNet still above
    the shallower one but closing on it while the plain nets' gap does not
    close is what the claim says too."""
    plain_gap = errors[f"plain{deep}"] - errors[f"plain{shallow}"]
    res_gap = errors[f"resnet{deep}"] - errors[f"resnet{shallow}"]
    noise = difference_margin(errors, images)
    text = (f"going from {shallow} to {deep} layers changes the plain nets' training error by "
            f"{100 * plain_gap:+.1f} points and the ResNets' by {100 * res_gap:+.1f} (two "
            f"standard errors of such a difference: {100 * noise:.1f} points)")
    if plain_gap > noise and res_gap < noise:
        return "reproduces at this scale: " + text
    if first_gaps and plain_gap > noise and res_gap < first_gaps["resnet"] - noise and (
            plain_gap > first_gaps["plain"] - noise):
        return (f"reproduces at this scale (the deeper ResNet closing on the shallower, the "
                f"deeper plain net not): {text}; over the first quarter of the run the gaps "
                f"were {100 * first_gaps['plain']:+.1f} (plain) and "
                f"{100 * first_gaps['resnet']:+.1f} (ResNets)")
    if plain_gap > noise and res_gap < plain_gap - noise:
        return ("partly: the deeper plain net has the higher training error and the residual "
                "nets degrade less, but the deeper ResNet is still above the shallower: "
                + text)
    return f"does not show at {iterations} iterations: " + text


def left_chance(rows, below=0.85):
    """The first logged iteration whose training error is under ``below``
    (chance on 10 classes is 0.90), or None when the run never got there."""
    for row in rows:
        if row["train_error"] is not None and row["train_error"] < below:
            return row["step"]
    return None


def points_above(rows, other):
    """``(n, of)``: at how many of the iterations both runs logged ``rows``'
    training error is above ``other``'s."""
    theirs = {row["step"]: row["train_error"] for row in other}
    common = [(row["train_error"], theirs[row["step"]]) for row in rows
              if row["step"] in theirs]
    return sum(a > b for a, b in common), len(common)


def looks_linear_verdict(errors, depths, images):
    """Fig. 6's statement at this scale from ``{key: training error}``: the
    ReLU net gets worse with depth and, at the deepest, is worse than the
    looks-linear net, which is within sampling noise of the ResNet (or
    better)."""
    shallow, deep = min(depths), max(depths)
    noise = difference_margin(errors, images)
    relu_worse = errors[f"relu{deep}"] - errors[f"relu{shallow}"]
    relu_gap = errors[f"relu{deep}"] - errors[f"crelu_ll{deep}"]
    ll_gap = errors[f"crelu_ll{deep}"] - errors[f"resnet{deep}"]
    text = (f"at depth {deep} the looks-linear net's training error is {100 * ll_gap:+.1f} "
            f"points from the ResNet's and the ReLU net's {100 * relu_gap:+.1f} from the "
            f"looks-linear net's; from depth {shallow} to {deep} the ReLU net's changes by "
            f"{100 * relu_worse:+.1f} (two standard errors of a difference: "
            f"{100 * noise:.1f} points)")
    parts = [relu_worse > noise, relu_gap > noise, ll_gap < noise]
    if all(parts):
        return "reproduces at this scale: " + text
    if not any(parts[1:]):
        return "contradicted at this scale: " + text
    return "partly: " + text

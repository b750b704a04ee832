"""Training curves compared by the experiment programs: He et al. (2016)
Fig. 1's reading (the logged training loss at a step, the verdict on "the
original unit's loss stays above the pre-activation unit's"), the error at
the end of a run, and how far two error rates may differ by sampling alone.
Kept apart from the programs, whose flags a test process must not define
twice.
"""

import math


def loss_at(rows, step):
    """The logged training loss (the mean over the interval ending at
    ``step``), or None when the run has not reached it."""
    for row in rows:
        if row["step"] == step:
            return row["loss"]
    return None


def verdict(curves, seed_curves, common):
    """The paper's statement (the original's training loss falls more slowly
    at the start) at this scale.  ``curves``/``seed_curves``: key -> seed 0/1
    history; ``common``: the logged iterations both seed-0 runs reached."""
    if not common:
        return "not run yet"
    gaps = [loss_at(curves["original"], s) - loss_at(curves["preact"], s) for s in common]
    last = common[-1]
    seeds_common = sorted(set(r["step"] for r in seed_curves["original"])
                          & set(r["step"] for r in seed_curves["preact"]) & set(common))
    spread = None
    if seeds_common:
        step = seeds_common[-1]
        spread = max(abs(loss_at(curves[k], step) - loss_at(seed_curves[k], step))
                     for k in ("original", "preact"))
        pairs = [(loss_at(curves["original"], step), loss_at(seed_curves["original"], step)),
                 (loss_at(curves["preact"], step), loss_at(seed_curves["preact"], step))]
        separate = min(pairs[0]) > max(pairs[1])
    above = sum(g > 0 for g in gaps)
    text = (f"the original unit's training loss is above the pre-activation unit's at "
            f"{above} of {len(gaps)} logged points up to iteration {last} (gap at "
            f"{last}: {gaps[-1]:+.3f})")
    if spread is not None:
        text += (f"; at iteration {seeds_common[-1]} a second seed moves a net's loss by up to "
                 f"{spread:.3f}, and the two seeds of each net "
                 + ("separate the nets" if separate else "overlap between the nets"))
    if above == len(gaps) and (spread is None or (separate and gaps[-1] > spread)):
        return "reproduces at this scale: " + text
    if above == len(gaps) and separate:
        return (f"reproduces at {seeds_common[-1]} iterations, where the seeds separate the "
                f"nets; at {last} the gap is within what a second seed moves a net: " + text)
    if above == 0:
        return "contradicted at this scale: " + text
    return f"does not show at {last} iterations: " + text


def tail_mean(rows, key="train_error", points=3):
    """The mean of ``key`` over the last ``points`` logged points of a run."""
    tail = rows[-points:]
    return sum(r[key] for r in tail) / len(tail)


def difference_margin(errors, images):
    """Two standard errors of the difference of two error rates each measured
    on ``images`` images (binomial sampling, at the mean of ``errors``)."""
    values = list(errors.values()) if isinstance(errors, dict) else list(errors)
    p = min(max(sum(values) / len(values), 0.01), 0.99)
    return 2 * math.sqrt(2 * p * (1 - p) / images)

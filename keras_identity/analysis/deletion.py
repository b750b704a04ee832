"""Residual networks as ensembles of paths: deleting units (Veit et al. 2016,
*Residual Networks Behave Like Ensembles of Relatively Shallow Networks*, in
the lecture notes).

Deleting one unit of a trained residual network barely changes its error, and
the error grows smoothly with the number of units deleted; deleting one layer
of a plain network is fatal.  A deleted :class:`ResidualUnit` outputs what its
shortcut carries (``F = 0``, see :attr:`ResidualUnit.deleted`); a plain unit
passes its input on.  Looped stages are unrolled first (a copy of the model).
"""

import numpy as np

from keras_identity.analysis.gates import error_rate
from keras_identity.layers.residual import ResidualUnit
from keras_identity.models.stage import unroll


def deletion_study(model, inputs, labels, *, max_deleted=None, draws=5, seed=0,
                   batch_size=1024):
    """The error of ``model`` on ``(inputs, labels)`` with units deleted.

    One at a time (each unit), then ``k`` units drawn at random, ``draws`` times for every
    ``k`` from 1 to ``max_deleted`` (default: all units that can be deleted).  A unit that
    changes the shape can be deleted when it has a shortcut (its projection or option-A
    shortcut stays); a plain unit that changes the shape cannot, and is listed as kept.

    Returns ``{"baseline", "units": [names], "changes_shape": [bool],
    "single": [error, or None for a unit that cannot be deleted], "k": [1..],
    "random": [[error per draw] per k]}``.
    """
    if not isinstance(draws, int) or isinstance(draws, bool) or draws < 1:
        raise ValueError(f"draws={draws!r} is not valid; expected an integer >= 1.")
    net = unroll(model)
    units = [layer for layer in net.layers if isinstance(layer, ResidualUnit)]
    if not units:
        raise ValueError(f"model {model.name!r} has no residual units to delete (a highway "
                         f"net: keras_identity.analysis.lesion_study).")
    deletable = [u for u in units if u.has_shortcut or not u.changes_shape]
    if max_deleted is None:
        max_deleted = len(deletable)
    if (not isinstance(max_deleted, int) or isinstance(max_deleted, bool)
            or not 1 <= max_deleted <= len(deletable)):
        raise ValueError(f"max_deleted={max_deleted!r} is not valid; expected an integer in "
                         f"[1, {len(deletable)}] (the units that can be deleted).")

    def error_without(chosen):
        for unit in chosen:
            unit.deleted = True
        try:
            return error_rate(net, inputs, labels, batch_size)
        finally:
            for unit in chosen:
                unit.deleted = False

    baseline = error_rate(net, inputs, labels, batch_size)
    single = [error_without([u]) if u in deletable else None for u in units]
    rng = np.random.default_rng(seed)
    ks = list(range(1, max_deleted + 1))
    random = [[error_without([deletable[i] for i in rng.choice(len(deletable), k,
                                                               replace=False)])
               for _ in range(draws)] for k in ks]
    net.make_predict_function(force=True)
    return {"baseline": baseline, "units": [u.name for u in units],
            "changes_shape": [u.changes_shape for u in units], "single": single, "k": ks,
            "random": random}


def plot_deletions(results, path, title=""):
    """Veit et al.'s Figs. 3 and 5 side by side for one or more nets
    (``{label: deletion_study(...)}``): the error with each single unit
    deleted, and the mean error (and spread) against the units deleted."""
    from keras_identity.training.plots import pyplot

    plt = pyplot()
    fig, (single, many) = plt.subplots(1, 2, figsize=(11, 3.8))
    for label, result in results.items():
        index = np.arange(1, len(result["single"]) + 1)
        errors = np.array([np.nan if e is None else 100 * e for e in result["single"]])
        line, = single.plot(index, errors, "o-", markersize=3, label=label)
        single.axhline(100 * result["baseline"], linestyle="--", color=line.get_color())
        random = 100 * np.array(result["random"])
        many.errorbar(result["k"], random.mean(axis=1), yerr=random.std(axis=1), fmt="o-",
                      markersize=3, capsize=2, color=line.get_color(), label=label)
    single.set_xlabel("deleted unit")
    many.set_xlabel("units deleted at random")
    for ax in (single, many):
        ax.set_ylabel("test error (%)")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    single.set_title("one unit deleted (dashed: none)", fontsize=10)
    if title:
        fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)

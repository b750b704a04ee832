"""Transform-gate statistics and lesions of highway networks
(Srivastava et al. 2015, Sec. 4, Figs. 2-4)."""

import dataclasses

import keras
import numpy as np

from keras_identity.layers.highway import highway_layers
from keras_identity.layers.highway import transform_gate_activations


@dataclasses.dataclass
class GateStatistics:
    """Arrays over highway layers (rows) and blocks (columns).

    ``biases``: the transform-gate biases b_T (Fig. 2, first column);
    ``mean``: T(x) averaged over the examples (second column);
    ``example``: T(x) of one example (third column);
    ``outputs``: the layers' block outputs for that example (fourth column);
    ``class_mean``: {class: mean T over that class's examples} (Fig. 3 shows
    ``class_mean[c] - mean``).  Convolutional layers are averaged over space.
    """

    layers: list
    biases: np.ndarray
    mean: np.ndarray
    example: np.ndarray
    outputs: np.ndarray
    class_mean: dict


def _reduce_space(array):
    return array.mean(axis=tuple(range(1, array.ndim - 1))) if array.ndim > 2 else array


def gate_statistics(model, inputs, labels=None, example=0, batch_size=512):
    """Gate statistics of ``model`` on ``inputs`` (see :class:`GateStatistics`)."""
    layers = highway_layers(model)
    gates = transform_gate_activations(model, inputs, batch_size=batch_size)
    per_layer = [_reduce_space(gates[l.name]) for l in layers]     # [n, blocks] each
    probe = keras.Model(model.input, [l.output for l in layers])
    outputs = probe(inputs[example:example + 1], training=False)
    if len(layers) == 1:
        outputs = [outputs]
    class_mean = {}
    if labels is not None:
        labels = np.asarray(labels)
        for c in np.unique(labels):
            class_mean[int(c)] = np.stack([g[labels == c].mean(axis=0) for g in per_layer])
    return GateStatistics(
        layers=[l.name for l in layers],
        biases=np.stack([np.asarray(l.transform_gate.bias) for l in layers]),
        mean=np.stack([g.mean(axis=0) for g in per_layer]),
        example=np.stack([g[example] for g in per_layer]),
        outputs=np.stack([_reduce_space(np.asarray(o))[0] for o in outputs]),
        class_mean=class_mean)


def error_rate(model, inputs, labels, batch_size=1024):
    """The classification error of ``model`` on ``inputs``, traced anew (so
    that a lesion or deletion set since the last call applies)."""
    model.make_predict_function(force=True)
    predictions = model.predict(inputs, batch_size=batch_size, verbose=0)
    return float(np.mean(predictions.argmax(axis=-1) != np.asarray(labels)))


def lesion_study(model, inputs, labels, batch_size=1024):
    """Closes all transform gates of one highway layer at a time (the layer
    copies its input, Fig. 4) and measures the error on ``inputs``.

    Returns ``{"baseline": error, "layers": [names], "errors": [per layer]}``.
    """
    layers = highway_layers(model)
    if not layers:
        raise ValueError(f"model {model.name!r} has no highway layers to lesion.")
    baseline = error_rate(model, inputs, labels, batch_size)
    errors = []
    for layer in layers:
        previous = layer.transform_gate_override
        layer.transform_gate_override = 0.0
        try:
            errors.append(error_rate(model, inputs, labels, batch_size))
        finally:
            layer.transform_gate_override = previous
    model.make_predict_function(force=True)
    return {"baseline": baseline, "layers": [l.name for l in layers], "errors": errors}


def plot_gate_statistics(stats, path, classes=(0, 7), title=""):
    """Fig. 2's four columns, then Fig. 3's class differences for ``classes``."""
    from keras_identity.training.plots import pyplot

    plt = pyplot()
    panels = [("transform gate biases", stats.biases, "viridis"),
              ("mean gate output", stats.mean, "viridis"),
              ("gate outputs, one example", stats.example, "viridis"),
              ("block outputs, one example", stats.outputs, "coolwarm")]
    for c in classes:
        if c in stats.class_mean:
            panels.append((f"class {c} mean - mean", stats.class_mean[c] - stats.mean, "coolwarm"))
    fig, axes = plt.subplots(1, len(panels), figsize=(2.6 * len(panels), 4.2))
    for ax, (name, data, cmap) in zip(axes, panels):
        if cmap == "coolwarm":
            limit = float(np.abs(data).max()) or 1.0
            image = ax.imshow(data, aspect="auto", cmap=cmap, vmin=-limit, vmax=limit)
        else:
            image = ax.imshow(data, aspect="auto", cmap=cmap)
        ax.set_title(name, fontsize=8)
        ax.set_xlabel("block")
        fig.colorbar(image, ax=ax, fraction=0.046)
    axes[0].set_ylabel("highway layer")
    if title:
        fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_lesions(result, path, title=""):
    """Fig. 4: error with one layer lesioned, against the layer."""
    from keras_identity.training.plots import pyplot

    plt = pyplot()
    fig, ax = plt.subplots(figsize=(7, 3.8))
    index = np.arange(1, len(result["errors"]) + 1)
    ax.plot(index, 100 * np.array(result["errors"]), "o-", markersize=3, label="lesioned")
    ax.axhline(100 * result["baseline"], linestyle="--", color="gray", label="not lesioned")
    ax.set_xlabel("lesioned highway layer")
    ax.set_ylabel("error (%)")
    ax.set_yscale("log")
    ax.grid(alpha=0.3, which="both")
    ax.legend()
    if title:
        ax.set_title(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)

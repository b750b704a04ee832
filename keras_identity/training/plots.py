"""Training curves drawn as in the papers' Figs. 1, 3 and 6: training loss
dashed (left axis), test error solid (right axis), against iterations; or
training error thin and test error bold on one axis (He et al. 2015, Figs. 4
and 6, the degradation problem).  Runs and plots may be in a bucket
(``gs://BUCKET/...``)."""

from keras_identity import storage


def pyplot():
    """matplotlib's pyplot on the Agg backend (files only, no display)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _draw(ax_loss, ax_error, history, color, label):
    steps = [row["step"] for row in history]
    ax_loss.plot(steps, [row["loss"] for row in history], "--", color=color, linewidth=1.2)
    ax_error.plot(steps, [100 * row["test_error"] for row in history], "-", color=color,
                  linewidth=1.8, label=label)


def _finish(fig, ax_loss, ax_error, path, title):
    ax_loss.set_xlabel("iterations")
    ax_loss.set_ylabel("training loss (dashed)")
    ax_error.set_ylabel("test error % (solid)")
    ax_loss.grid(alpha=0.3)
    if title:
        ax_loss.set_title(title)
    if ax_error.get_legend_handles_labels()[0]:
        ax_error.legend(loc="upper right")
    fig.tight_layout()
    _save(fig, path)
    pyplot().close(fig)


def _save(fig, path):
    """Writes ``fig`` to ``path`` (a PNG; uploaded to a bucket's path)."""
    with storage.staged(path) as local:
        fig.savefig(local, dpi=110)


def plot_history(history, path, title=""):
    """One run's curves to ``path`` (PNG)."""
    fig, ax_loss = pyplot().subplots(figsize=(7, 4.2))
    ax_error = ax_loss.twinx()
    _draw(ax_loss, ax_error, history, "tab:blue", None)
    _finish(fig, ax_loss, ax_error, path, title)


def load_history(run_dir):
    """A run's ``history.json`` (a local run or one in a bucket)."""
    return storage.read_json(storage.join(run_dir, "history.json"))


def _labels(run_dirs, labels):
    """One label per run (default: each run directory's name)."""
    labels = labels or [storage.basename(storage.normalize(d)) for d in run_dirs]
    if len(labels) != len(run_dirs):
        raise ValueError(f"labels={labels!r} is not valid; expected one label per run "
                         f"({len(run_dirs)}).")
    return labels


def plot_runs(run_dirs, path, labels=None, title="", log_loss=False):
    """Several runs on one plot (e.g. original vs pre-activation ResNet-1001);
    ``log_loss`` draws the training loss on a logarithmic axis (losses of
    very different sizes, as at the start of Fig. 1)."""
    labels = _labels(run_dirs, labels)
    plt = pyplot()
    fig, ax_loss = plt.subplots(figsize=(7, 4.2))
    ax_error = ax_loss.twinx()
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for index, (run_dir, label) in enumerate(zip(run_dirs, labels)):
        _draw(ax_loss, ax_error, load_history(run_dir), colors[index % len(colors)], label)
    if log_loss:
        ax_loss.set_yscale("log")
    _finish(fig, ax_loss, ax_error, path, title)


def plot_errors(run_dirs, path, labels=None, title=""):
    """Several runs' training error (thin, dashed) and test error (bold) on
    one axis against iterations, as He et al. (2015) draw the degradation
    problem (Figs. 4 and 6)."""
    labels = _labels(run_dirs, labels)
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(7, 4.2))
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for index, (run_dir, label) in enumerate(zip(run_dirs, labels)):
        history = load_history(run_dir)
        steps = [row["step"] for row in history]
        color = colors[index % len(colors)]
        ax.plot(steps, [100 * row["train_error"] for row in history], "--", color=color,
                linewidth=1.0)
        ax.plot(steps, [100 * row["test_error"] for row in history], "-", color=color,
                linewidth=2.0, label=label)
    ax.set_xlabel("iterations")
    ax.set_ylabel("error % (training dashed, test bold)")
    ax.grid(alpha=0.3)
    if title:
        ax.set_title(title)
    ax.legend(loc="upper right")
    fig.tight_layout()
    _save(fig, path)
    plt.close(fig)

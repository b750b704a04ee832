r"""Table 1 (shortcuts) and Table 2 (unit orderings) of He et al. (2016) on CIFAR-10.

    python -m experiments.resnet_ablations --data_dir=../shared/data --depth=20 \
        --train_steps=800 --seeds=0,1,2 --cases=original,scale05,full_preactivation
                                       # reduced scale, CPU (three of the cases; the
                                       # he_table1/he_table2 claims of experiments.reproduce
                                       # run eight)
    python -m experiments.resnet_ablations --data_dir=... --depth=110 --seeds=0,1,2,3,4
                                                              # the paper's recipe (GPU)

Trains every configuration (or the --cases chosen) with the `cifar` recipe
(shortened proportionally by --train_steps; omit it for the full 64k
iterations), for each seed, and writes a Markdown report with the paper's
numbers beside ours (mean +- std and each seed's) and the training curves.
Each case is compared with the original unit: a claimed difference counts as
reproduced only when the seeds' ranges do not overlap and the sign is the
paper's.

``--tables=gating`` asks whether Table 1's verdict on gating depends on the
unit around it, the question Srivastava (2025, "Weighted skip connections
are not harmful for deep nets") raises: exclusive gating at b_g = -6 in the
original unit (the gated sum followed by ReLU, as in Table 1), in the
ReLU-before-addition unit (no ReLU after the gated sum, as in his highway
block) and in the full pre-activation unit, each against the identity
shortcut in the same unit.  Finished runs are skipped, so the command can be run again to
complete an interrupted study.
"""

import json
import os

from absl import app
from absl import flags

from experiments import _cli
from experiments import _report

FLAGS = flags.FLAGS
# Every run's settings (TrainConfig's flags; the paper's Table 1 is at depth 110).
_cli.define_config_flags(names=("depth", "data_dir", "train_steps", "steps_per_epoch",
                                "batch_size", "strategy", "precision"), defaults={"depth": 20})
flags.DEFINE_list("seeds", ["0", "1"], "Seeds (the paper: median of 5 runs).")
flags.DEFINE_list("tables", ["1", "2"], "Which tables to run: 1, 2 and gating (exclusive "
                  "gating at b_g = -6 in three unit orderings).")
flags.DEFINE_list("cases", None, "Only these cases (keys of TABLE1, TABLE2 and GATING, e.g. "
                  "original,scale05,full_preactivation); default: every case of --tables.")
flags.DEFINE_string("run_dir", "runs/ablations", "Directory of the individual runs.")
flags.DEFINE_string("report", None, "Report name under docs/results/ (default: "
                    "resnet_ablations_<depth>.md).")

# (key, case, Fig., on shortcut, on F, paper's ResNet-110 error, ResidualUnit arguments)
TABLE1 = [
    ("original", "original", "2(a)", "1", "1", "6.61", {}),
    ("scale0", "constant scaling", "2(b)", "0", "1", "fail (plain net)",
     dict(shortcut="constant_scaling", shortcut_scale=0.0)),
    ("scale05", "constant scaling", "2(b)", "0.5", "1", "fail",
     dict(shortcut="constant_scaling", shortcut_scale=0.5)),
    ("scale05_frozen", "constant scaling", "2(b)", "0.5", "0.5", "12.35 (frozen gating)",
     dict(shortcut="constant_scaling", shortcut_scale=0.5, scale_residual=True)),
    ("exclusive0", "exclusive gating", "2(c)", "1-g(x)", "g(x)", "fail (b_g = 0 to -5)",
     dict(shortcut="exclusive_gating", gate_bias_init=0.0)),
    ("exclusive6", "exclusive gating", "2(c)", "1-g(x)", "g(x)", "8.70 (b_g = -6)",
     dict(shortcut="exclusive_gating", gate_bias_init=-6.0)),
    ("exclusive7", "exclusive gating", "2(c)", "1-g(x)", "g(x)", "9.81 (b_g = -7)",
     dict(shortcut="exclusive_gating", gate_bias_init=-7.0)),
    ("shortcut_only0", "shortcut-only gating", "2(d)", "1-g(x)", "1", "12.86 (b_g = 0)",
     dict(shortcut="shortcut_only_gating", gate_bias_init=0.0)),
    ("shortcut_only6", "shortcut-only gating", "2(d)", "1-g(x)", "1", "6.91 (b_g = -6)",
     dict(shortcut="shortcut_only_gating", gate_bias_init=-6.0)),
    ("conv1x1", "1x1 conv shortcut", "2(e)", "1x1 conv", "1", "12.22",
     dict(shortcut="conv1x1")),
    ("dropout", "dropout shortcut", "2(f)", "dropout 0.5", "1", "fail",
     dict(shortcut="dropout", shortcut_dropout_rate=0.5)),
]
# Exclusive gating at b_g = -6 (Table 1's best gate) in three units, each against
# the identity shortcut in the same unit (a Table 2 case):
# (key, unit, Fig., reference key, ResidualUnit arguments)
GATING = [
    ("exclusive6", "original", "4(a)", "original",
     dict(shortcut="exclusive_gating", gate_bias_init=-6.0)),
    ("exclusive6_relu_before_addition", "ReLU before addition", "4(c)",
     "relu_before_addition", dict(shortcut="exclusive_gating", gate_bias_init=-6.0,
                                  unit="relu_before_addition")),
    ("exclusive6_full_preactivation", "full pre-activation", "4(e)", "full_preactivation",
     dict(shortcut="exclusive_gating", gate_bias_init=-6.0, unit="full_preactivation")),
]
TABLES = ("1", "2", "gating")


_REFERENCES = {key: ref for key, _, _, ref, _ in GATING}


def reference(key):
    """The case ``key`` is compared with: the identity shortcut in its unit."""
    return _REFERENCES.get(key, "original")


# The paper's claim for each case against the original unit: "worse", "better"
# or "equal" (Table 2(d): 6.71 against 6.61).
CLAIMS = {"original": None, "relu_only_preactivation": "equal",
          "full_preactivation": "better",
          "shortcut_only6": "equal"}   # 6.91%: "much closer to the baseline"
# (key, case, Fig., paper's ResNet-110, paper's ResNet-164, unit)
TABLE2 = [
    ("original", "original Residual Unit", "4(a)", "6.61", "5.93", "original"),
    ("bn_after_addition", "BN after addition", "4(b)", "8.17", "6.50", "bn_after_addition"),
    ("relu_before_addition", "ReLU before addition", "4(c)", "7.84", "6.14",
     "relu_before_addition"),
    ("relu_only_preactivation", "ReLU-only pre-activation", "4(d)", "6.71", "5.91",
     "relu_only_preactivation"),
    ("full_preactivation", "full pre-activation", "4(e)", "6.37", "5.46",
     "full_preactivation"),
]


def _run(key, seed, unit_kwargs):
    """Trains one configuration (or reads its finished run); returns its last row."""
    import keras

    from keras_identity.training import ConfigError
    from keras_identity.training import TrainingDiverged
    from keras_identity.training import train

    model_dir = os.path.join(FLAGS.run_dir, f"resnet{FLAGS.depth}_{key}_seed{seed}")
    marker = os.path.join(model_dir, "diverged.json")
    if os.path.exists(marker):
        return json.load(open(marker))
    config = _cli.config_from_flags(model="resnet", dataset="cifar10", seed=seed, verbose=0,
                                    model_dir=model_dir, model_kwargs=unit_kwargs)
    try:
        row = train(config, print_fn=lambda *_: None)["history"][-1]
    except TrainingDiverged as error:
        row = {"test_error": float("nan"), "loss": float("nan"), "step": error.step,
               "diverged": True}
        os.makedirs(model_dir, exist_ok=True)
        json.dump(row, open(marker, "w"))
    except ConfigError as error:
        _cli.fail(error, 2)
    keras.backend.clear_session()
    print(f"  {key} seed {seed}: test error {100 * row['test_error']:.2f}%, "
          f"train loss {row['loss']:.4f}", flush=True)
    return row


def _stats(rows, name):
    import numpy as np

    values = [r[name] for r in rows]
    finite = [v for v in values if v == v]
    if not finite:
        return float("nan"), float("nan"), values
    return (float(np.mean(finite)), float(np.std(finite, ddof=1)) if len(finite) > 1 else
            float("nan"), values)


def verdict(case_rows, original_rows, claim):
    """Whether the paper's claim (``"worse"``, ``"better"``, ``"equal"``) about
    a case against the original unit holds at this scale: the test errors of
    the seeds must not overlap, in the claimed direction."""
    case = [r["test_error"] for r in case_rows]
    base = [r["test_error"] for r in original_rows]
    if any(v != v for v in base):
        return "cannot be judged (the original unit diverged)"
    if any(v != v for v in case):   # a diverged run
        return "reproduces (diverged)" if claim == "worse" else "contradicted (diverged)"
    if len(case) < 2 or len(base) < 2:
        return "cannot be judged (one seed)"
    if min(case) > max(base):
        direction = "worse"
    elif max(case) < min(base):
        direction = "better"
    else:
        return ("consistent (seed ranges overlap)" if claim == "equal" else
                "cannot be judged at this scale (seed ranges overlap)")
    if claim == "equal":
        return f"contradicted ({direction}, seeds separate)"
    return "reproduces" if direction == claim else f"contradicted ({direction})"


def _cell(rows):
    mean, std, errors = _stats(rows, "test_error")
    loss, _, _ = _stats(rows, "loss")
    diverged = sum(1 for r in rows if r.get("diverged"))
    text = ", ".join(f"{100 * e:.1f}" if e == e else "NaN" for e in errors)
    note = f" ({diverged} diverged)" if diverged else ""
    spread = f" ± {100 * std:.2f}" if std == std else ""
    return f"{100 * mean:.2f}{spread} [{text}]{note}", f"{loss:.3f}"


def judge(results, key, claim):
    """The verdict on ``claim`` for case ``key`` of ``results`` (case -> rows)
    against its reference (:func:`reference`), or "" when that did not run."""
    if key == "original":
        return "(reference)"
    if reference(key) not in results:
        return ""
    return verdict(results[key], results[reference(key)], claim)


def gating_section(results):
    """The report's section on exclusive gating in three units (empty when no
    gated case ran beside its reference)."""
    rows = [(key, unit, fig, ref) for key, unit, fig, ref, _ in GATING
            if key in results and ref in results]
    if not rows:
        return ""
    text = ("\n## Gating across units: does Table 1's verdict on gates depend on the "
            "unit?\n\nExclusive gating, `y = (1 - g(x)) x + g(x) F(x)` with b_g = -6 (the "
            "paper: 8.70% against identity's 6.61% in the original unit, ResNet-110), "
            "against the identity shortcut in the same unit. Srivastava (2025) argues "
            "that the paper's conclusion about gates comes from its design choices; one of "
            "them is testable with this package's units: his highway block has no ReLU "
            "after the gated sum (as in (c)), while the paper's has (a). His gate is also "
            "computed by two 3x3 convolutions with BN rather than a 1x1 convolution; that "
            "gate is not a layer of this package and is not compared here. Verdict: on "
            "the paper's claim that the gated unit is worse than the identity one.\n\n"
            "| unit | Fig. | identity: test error (%) | exclusive gating b_g = -6: test "
            "error (%) | gated: train loss | verdict |\n"
            "| --- | --- | --- | --- | --- | --- |\n")
    for key, unit, fig, ref in rows:
        error, loss = _cell(results[key])
        ref_error, _ = _cell(results[ref])
        text += (f"| {unit} | {fig} | {ref_error} | {error} | {loss} | "
                 f"{judge(results, key, 'worse')} |\n")
    return text


def main(argv):
    if len(argv) > 1:
        _cli.fail(f"unexpected arguments {argv[1:]}", 2)
    try:
        seeds = [int(s) for s in FLAGS.seeds]
    except ValueError:
        seeds = []
    if not seeds or any(s < 0 for s in seeds):
        _cli.fail(f"--seeds={','.join(FLAGS.seeds)} is not valid; expected integers >= 0", 2)
    if not FLAGS.tables or set(FLAGS.tables) - set(TABLES):
        _cli.fail(f"--tables={','.join(FLAGS.tables)} is not valid; expected some of "
                  f"{', '.join(TABLES)}", 2)
    wanted = {}
    table2 = {key: {"unit": unit} if unit != "original" else {} for key, *_, unit in TABLE2}
    if "1" in FLAGS.tables:
        wanted.update({key: kwargs for key, *_, kwargs in TABLE1})
    if "2" in FLAGS.tables:
        wanted.update(table2)
    if "gating" in FLAGS.tables:
        for key, _, _, ref, kwargs in GATING:
            wanted[ref] = table2[ref]
            wanted[key] = kwargs
    if FLAGS.cases:
        unknown = [c for c in FLAGS.cases if c not in wanted]
        if unknown:
            _cli.fail(f"--cases={','.join(unknown)} is not valid; expected some of: "
                      f"{', '.join(wanted)} (tables {','.join(FLAGS.tables)})", 2)
        missing = sorted({reference(c) for c in FLAGS.cases} - {"original"} - set(FLAGS.cases))
        if "original" not in FLAGS.cases or missing:
            needed = ", ".join(["original"] + missing)
            _cli.fail(f"--cases must include {needed}: every case is compared with the "
                      f"identity shortcut in its unit, and every unit with the original", 2)
        wanted = {key: wanted[key] for key in wanted if key in FLAGS.cases}
    results = {}
    for key, kwargs in wanted.items():
        print(f"{key}: {kwargs}", flush=True)
        results[key] = [_run(key, seed, kwargs) for seed in seeds]

    steps = FLAGS.train_steps or "64,000 (the full recipe)"
    original = results.get("original")

    def judged(key, claim):
        return judge(results, key, claim)

    def mean_error(key):
        mean, std, _ = _stats(results[key], "test_error")
        return f"{100 * mean:.1f}" + (f" ± {100 * std:.1f}%" if std == std else "%")

    def against(key):
        ref = reference(key)
        return "" if ref == "original" else f"against {ref}: "

    length = f"{steps:,}" if isinstance(steps, int) else steps
    drops = (f"iterations {steps // 2:,} and {steps * 3 // 4:,}: 50% and 75%"
             if isinstance(steps, int) else "50% and 75%")
    summary = (f"ResNet-{FLAGS.depth}, {len(seeds)} seed{'s' if len(seeds) > 1 else ''}, "
               f"{length} iterations: original {mean_error('original')}; "
               + "; ".join([f"{key} {mean_error(key)} ({against(key)}"
                            f"{judged(key, CLAIMS.get(key, 'worse'))})"
                            for key in results if key != "original"] or ["no other case"])
               if original is not None else None)
    titles = [f"Table {t}" for t in ("1", "2") if t in FLAGS.tables]
    if "gating" in FLAGS.tables:
        titles.append("Table 1's exclusive gating in three units")
    title = " and ".join(titles)
    text = _report.header(f"He et al. (2016) {title} on CIFAR-10: ResNet-{FLAGS.depth}",
                          summary=summary)
    text += (f"\nResNet-{FLAGS.depth} (the paper: ResNet-110 for Table 1, ResNet-110 and "
             f"ResNet-164 for Table 2), `cifar` recipe scaled to {length} iterations at "
             f"batch {FLAGS.batch_size or 128} (lr 0.1, /10 at {drops}), seeds {seeds}. "
             f"Ours: test error, mean ± std over the seeds with each seed's in brackets, and "
             f"the mean training loss at the end. The paper's numbers are medians of 5 runs "
             f"of the full recipe. **Verdict**: the paper's claim against the original unit "
             f"(for the gating cases: against the identity shortcut in the same unit) counts "
             f"as reproduced when the seeds' test errors do not overlap and lie on the "
             f"paper's side"
             + (". With one seed there is no verdict: a difference counts only against how "
                "far another seed moves a run (measured by a run of several seeds)"
                if len(seeds) == 1 else "") + ".\n")

    if "1" in FLAGS.tables and any(k in results for k, *_ in TABLE1 if k != "original"):
        text += ("\n## Table 1: shortcuts (all units original, Fig. 4(a))\n\n| case | Fig. | on "
                 "shortcut | on F | paper: ResNet-110 error (%) | ours: test error (%) | "
                 "ours: train loss | verdict |\n| --- | --- | --- | --- | --- | --- | --- | --- |\n")
        for key, case, fig, on_h, on_f, paper, _ in TABLE1:
            if key in results:
                error, loss = _cell(results[key])
                text += (f"| {case} | {fig} | {on_h} | {on_f} | {paper} | {error} | {loss} | "
                         f"{judged(key, CLAIMS.get(key, 'worse'))} |\n")
    if "2" in FLAGS.tables and any(k in results for k, *_ in TABLE2 if k != "original"):
        text += ("\n## Table 2: unit orderings (identity shortcuts)\n\n| case | Fig. | paper: "
                 "ResNet-110 | paper: ResNet-164 | ours: test error (%) | ours: train loss "
                 "| verdict |\n| --- | --- | --- | --- | --- | --- | --- |\n")
        for key, case, fig, p110, p164, _ in TABLE2:
            if key in results:
                error, loss = _cell(results[key])
                text += (f"| {case} | {fig} | {p110} | {p164} | {error} | {loss} | "
                         f"{judged(key, CLAIMS.get(key, 'worse'))} |\n")
    if "gating" in FLAGS.tables:
        text += gating_section(results)
    summary = {key: {"test_errors": [r["test_error"] for r in rows],
                     "losses": [r["loss"] for r in rows],
                     "verdict": judged(key, CLAIMS.get(key, "worse"))}
               for key, rows in results.items()}
    os.makedirs(FLAGS.run_dir, exist_ok=True)
    name = FLAGS.report or f"resnet_ablations_{FLAGS.depth}.md"
    stem = os.path.splitext(name)[0]
    with open(os.path.join(FLAGS.run_dir, f"{stem}_summary.json"), "w") as f:
        json.dump({"depth": FLAGS.depth, "train_steps": FLAGS.train_steps, "seeds": seeds,
                   "cases": summary}, f, indent=1)
    from keras_identity.training import plot_runs

    curves = []
    for key in wanted:
        run = os.path.join(FLAGS.run_dir, f"resnet{FLAGS.depth}_{key}_seed{seeds[0]}")
        if os.path.exists(os.path.join(run, "history.json")):
            curves.append((key, run))
    figure = os.path.join(FLAGS.run_dir, f"{stem}_curves.png")
    if curves:
        plot_runs([r for _, r in curves], figure, labels=[k for k, _ in curves],
                  title=f"ResNet-{FLAGS.depth}, seed {seeds[0]}: training loss (dashed), "
                        f"test error (solid)")
        text += "\n" + _report.copy_figure(figure, f"{stem}_curves.png")
    print(f"wrote {_report.write(name, text)}")


def run():
    app.run(main, flags_parser=_cli.one_line_flags_parser)


if __name__ == "__main__":
    run()

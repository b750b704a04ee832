"""The search loop, with the papers' search protocols: the gate bias of He et
al. (2016), Sec. 3.1 (a grid on a validation split of the training set, then
the best value trained on the whole training set and its test error
reported), and the random search of Srivastava et al. (2015), Sec. 3.1
(learning rate, momentum, exponential decay, activation and transform-gate
bias, judged by the training error).

:func:`run_search` runs (or continues) a search and retrains the best
values; :class:`TrialsFailed` says a search is incomplete.  The search's
configuration and identity are in :mod:`keras_identity.tuning.config`, the
bucket staging in :mod:`~keras_identity.tuning.staging`, the trials'
progress and stops in :mod:`~keras_identity.tuning.progress`, the tuners and
retry rules in :mod:`~keras_identity.tuning.oracle`, and the rows, tables
and plot in :mod:`~keras_identity.tuning.results`."""

import contextlib
import dataclasses

import keras

try:  # Keras Tuner's switch that prints each failed trial's traceback
    from keras_tuner.src import config as _keras_tuner_config
except ImportError:  # pragma: no cover - another Keras Tuner layout
    _keras_tuner_config = None

from keras_identity import storage
from keras_identity.training import fit_loop
from keras_identity.training import preemption
from keras_identity.training import run_setup
from keras_identity.training import strategies
from keras_identity.training import trainer
from keras_identity.training.config import ConfigError
from keras_identity.tuning.config import SEARCH_FILE
from keras_identity.tuning.config import check_same_search
from keras_identity.tuning.config import describe_values
from keras_identity.tuning.config import search_identity
from keras_identity.tuning.hypermodel import TrainingHyperModel
from keras_identity.tuning.hypermodel import apply_values
from keras_identity.tuning.oracle import make_tuner
from keras_identity.tuning.oracle import retry_failed
from keras_identity.tuning.progress import SearchStopped
from keras_identity.tuning.progress import TrialProgress
from keras_identity.tuning.results import row_failed
from keras_identity.tuning.results import row_score
from keras_identity.tuning.results import row_values
from keras_identity.tuning.results import trial_rows
from keras_identity.tuning.results import write_results
from keras_identity.tuning.staging import TunerFolder


class TrialsFailed(RuntimeError):
    """Trials of a search failed (an error other than a diverged loss): the
    search is incomplete.  results.csv and results.md list them (their note
    says why); running the same search again retries them."""


def run_search(search, print_fn=print):
    """Runs (or continues) ``search``; returns rows, the best values and paths.

    ``search.train.model_dir`` is a local folder or a bucket's (``gs://BUCKET/...``): every
    file of the search is kept there (Keras Tuner's through a local staging folder,
    :class:`TunerFolder`), and a search continues from it on any machine.

    Every trial is built from ``search.train.seed`` (its result does not depend on the
    trials before it in the process); trials an earlier run left FAILED are tried again, and
    a trial whose progress cannot be read starts again from its start.

    Raises:
        ConfigError: a bad configuration or missing data (one line).
        SearchStopped: a stop signal (its message says what the same command does next): the
            trial in progress is saved, or the search is complete and the retraining is
            still to do (a signal the search acknowledged is not ignored by the retraining),
            or the retraining is saved at its checkpoint.
        TrialsFailed: trials failed (results.csv and results.md written, the failed trials
            noted); the same command retries them.
        storage.StorageError: the bucket could not be read or written while the search ran
            (one line).
    """
    with contextlib.ExitStack() as cleanup:
        return _run_search(search, print_fn, cleanup)


def _run_search(search, print_fn, cleanup):
    search.validate()
    config = search.train
    try:
        setup = run_setup.set_up(config, validation_split=search.validation_split,
                                 check_strategy=_one_process)
        strategy, data, recipe, plan = setup.strategy, setup.data, setup.recipe, setup.plan
        hypermodel = TrainingHyperModel(config, data, recipe, plan, space=search.space,
                                        normalization=setup.normalization)
        storage.check_path(config.model_dir)
        fresh = not storage.exists(storage.join(config.model_dir, SEARCH_FILE))
        check_same_search(config.model_dir, search_identity(search, setup))
    except ConfigError:
        raise
    except (ValueError, storage.StorageError) as error:
        raise ConfigError(str(error)) from None
    train_ds, val_ds = setup.train_stream(), setup.eval_stream()
    folder = cleanup.enter_context(TunerFolder(config.model_dir))
    try:  # Keras Tuner builds a first model here: the builder's refusals are one line
        tuner = make_tuner(search, hypermodel, strategy, folder.directory)
    except ValueError as error:
        if fresh:  # what this run just wrote, so that the corrected command starts anew
            storage.remove(storage.join(config.model_dir, SEARCH_FILE))
            folder.discard()
        raise ConfigError(str(error)) from None
    tuner.folder = folder
    retry_failed(tuner, print_fn)
    done_before = len([r for r in trial_rows(tuner, search.objective) if not row_failed(r)])
    size = search.space_size
    print_fn(f"{search.tuner} search of {search.describe_space()} "
             f"({f'{size} configurations' if size else 'continuous'}; judged by the best "
             f"epoch's {search.objective.replace('_', ' ')}) for {config.model} "
             f"{config.resolved_depth or ''} on {data.name}: {data.num_train:,} training / "
             f"{len(data.y_val):,} validation images (the test set is not used), "
             f"{plan.epochs} epochs of {plan.steps_per_epoch} steps per trial; "
             f"{strategies.describe(strategy)}"
             + (f"; continuing after {done_before} finished trials" if done_before else ""))
    signals = setup.signals
    hypermodel.progress = TrialProgress(strategy, setup.train_stream, plan.steps_per_epoch,
                                        signals, config.checkpoint_every, print_fn)
    # The signals stay caught until the retraining starts (which catches
    # its own): one that the search acknowledged, at its last trial's last
    # evaluation say, stops the program before the retraining.
    with signals:
        gave_up = None
        # A failed trial is told in one line (run_trial), its traceback kept
        # in its trial.json, not printed.
        debug = getattr(_keras_tuner_config, "DEBUG", None)
        if debug is not None:
            _keras_tuner_config.DEBUG = False
        try:
            with folder.publishing(), strategies.fit_scope(strategy):
                tuner.search(train_ds, epochs=plan.epochs,
                             steps_per_epoch=plan.steps_per_epoch, validation_data=val_ds,
                             callbacks=[keras.callbacks.TerminateOnNaN()], shuffle=False,
                             verbose=config.verbose)
        except SearchStopped:
            raise
        except preemption.Stopped as stopped:
            raise SearchStopped(f"{stopped}; the search continues with this trial", "trial",
                                stopped.signal_name, stopped.step, stopped.epoch,
                                stopped.directory, stopped.saved) from None
        except RuntimeError as error:
            # Keras Tuner's oracle ends a search after consecutive failed trials.
            if "consecutive failures" not in str(error):
                raise
            gave_up = str(error).splitlines()[0].rstrip(".")
        finally:
            if debug is not None:
                _keras_tuner_config.DEBUG = debug
            hypermodel.progress = None
            for stream in (train_ds, val_ds):
                fit_loop.close_stream(stream)

        rows = trial_rows(tuner, search.objective)
        if not rows:
            raise RuntimeError("the search finished no trial.")
        searched = ", ".join(search.space)
        title = (f"{config.model} {config.resolved_depth or ''} on {data.name}: "
                 f"{search.objective.replace('_', ' ')} against {searched}")
        table = write_results(rows, config.model_dir, title, search.objective)
        print_fn(table)
        failed = [r for r in rows if row_failed(r)]
        if failed or gave_up:
            listed = "; ".join(
                f"trial {r['trial']} ({describe_values(row_values(r))}): {r['note']}"
                for r in failed)
            raise TrialsFailed(
                f"{len(failed)} of {len(rows)} trials failed ({listed})"
                + (f"; Keras Tuner ended the search ({gave_up})" if gave_up else "")
                + f"; {storage.join(config.model_dir, 'results.md')} lists them; run the "
                  f"same command to retry them")
        if search.retrain_best and signals.received is not None:
            # Only an unfinished retraining is left to do.
            raise SearchStopped(
                f"stopped by {signals.received} after the search's last trial: the search "
                f"is complete ({len(rows)} trials, results in "
                f"{storage.join(config.model_dir, 'results.md')}); run the same command to "
                f"retrain the best values (--retrain_best) without searching again",
                "before the retraining", signals.received)
    finite = [r for r in rows if not r["note"]] or rows
    best_row = min(finite, key=lambda r: row_score(r, search.objective))
    best = row_values(best_row)
    judged = {"val_error": ("validation error", best_row["val_error"]),
              "train_error": ("best training error", best_row.get("train_error")),
              "train_loss": ("best training loss", best_row.get("best_train_loss"))}
    label, value = judged[search.objective]
    print_fn(f"best: {best} with {label} " + (f"{value:.4f}" if search.objective ==
                                               "train_loss" else f"{100 * value:.2f}%"))
    result = {"rows": rows, "best": best, "best_val_error": best_row["val_error"],
              "best_row": best_row, "model_dir": config.model_dir,
              "trials_before": done_before}
    if search.retrain_best and best_row["note"]:
        print_fn("not retraining: every trial diverged.")
        result["retrain"] = None
    elif search.retrain_best:
        # One directory per best trial: more trials of the same search may
        # find other values, whose run must not resume this one's.
        retrain = dataclasses.replace(
            apply_values(config, best), epochs=search.retrain_epochs or config.epochs,
            model_dir=storage.join(config.model_dir, "retrain_best",
                                   f"trial_{best_row['trial']}"))
        print_fn(f"retraining {best} on the whole training set in {retrain.model_dir} ...")
        try:
            outcome = trainer.train(retrain, print_fn=print_fn, strategy=strategy)
        except preemption.Stopped as stopped:
            # The retraining is a training run of its own (its checkpoints in
            # its model_dir): the same command skips the finished search and
            # resumes it.
            raise SearchStopped(
                f"{stopped.what}; running the same command resumes the retraining of "
                f"{describe_values(best)} (the search is complete)", "retraining",
                stopped.signal_name, stopped.step, stopped.epoch, stopped.directory,
                stopped.saved) from None
        except fit_loop.TrainingDiverged as error:
            print_fn(f"the retraining of {describe_values(best)} diverged: {error}")
            result["retrain"] = {"diverged": True, "model_dir": retrain.model_dir}
            _append(storage.join(config.model_dir, "results.md"),
                    f"\nRetrained with {best} on the whole training set: diverged "
                    f"({error}).\n")
            return result
        outcome["model_dir"] = retrain.model_dir
        result["retrain"] = outcome
        print_fn(f"best {describe_values(best)}: test error {100 * outcome['test_error']:.2f}% "
                 f"(trained on all {setup.full_data.num_train:,} training images)")
        _append(storage.join(config.model_dir, "results.md"),
                f"\nRetrained with {best} on the whole training set for "
                f"{retrain.epochs} epochs: test error "
                f"{100 * outcome['test_error']:.2f}%.\n")
    return result


def _one_process(strategy):
    if getattr(strategy, "process_count", 1) > 1:
        raise ValueError(f"the search runs in one process; this JAX program runs in "
                         f"{strategy.process_count} processes (train the best values "
                         f"across processes with keras-identity-train).")


def _append(path, text):
    """Adds ``text`` to the end of the file ``path`` (rewritten whole)."""
    storage.write_text(path, storage.read_text(path) + text)

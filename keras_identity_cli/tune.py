r"""Searches hyper-parameters with Keras Tuner, with the papers' protocols.

    keras-identity-tune --model=highway_net --depth=50 --dataset=mnist \
        --tuner=grid --epochs=3 --model_dir=runs/tune_highway50
    python -m keras_identity_cli.tune --model=resnet --depth=110 --shortcut=exclusive_gating \
        --dataset=cifar10 --data_dir=../shared/data --epochs=10 --retrain_best
    keras-identity-tune --model=plain_net --depth=100 --tuner=random --max_trials=20 \
        --learning_rates=0.001:1 --momentums=0.5:0.99 --lr_decays=0.8:1 \
        --activations=relu,tanh --objective=train_loss

The gate-bias search (He et al. 2016, Sec. 3.1) is the default: b in {0, -1,
..., -10} (--gate_biases) for a model with a gate bias.  --learning_rates,
--momentums, --lr_decays, --activations, --weight_decays and --depths add
dimensions (Srivastava et al. 2015 searched the first four and b_T for Fig.
1); numeric ones take values or one range low:high (random, bayesian and
hyperband tuners; learning rates are drawn log-uniformly).  Trials train on
the training set minus a validation split (--validation_split) and are
judged by --objective; the test set is only used by --retrain_best, which
trains the best values on the whole training set.  Running the same command
again continues the search; finished trials are not redone.  Writes
results.csv, results.md and a plot into --model_dir, which may be a bucket's
(gs://BUCKET/dir: every file of the search is kept there, and the same
command continues the search from it on another machine).
"""

import os
import sys

from absl import flags

from keras_identity_cli import _common as _cli

_cli.stop_signals_while_starting()  # first: a stop signal while the libraries load
from keras_identity_cli._preload import cpu_kernels

_cli.select_backend()  # before keras_identity (and Keras) is imported
cpu_kernels.choose("training")  # before TensorFlow is imported

FLAGS = flags.FLAGS
_cli.define_backend_flag()
# The settings of each trial (TrainConfig's fields and the model flags); a
# trial trains --epochs=3 unless told otherwise.
_cli.define_config_flags(
    names=("model", "depth", "dataset", "data_dir", "recipe", "batch_size", "epochs",
           "strategy", "tpu", "precision", "seed", "train_examples", "model_dir", "verbose",
           "checkpoint_every", "stop_signal", "input_workers"),
    defaults={"epochs": 3})
_cli.define_model_flags()
flags.DEFINE_enum("tuner", "grid", list(_cli.tuners()), "Tuner.")
flags.DEFINE_integer("max_trials", None, "Trials (default: the size of the space; hyperband "
                     "decides its own).")
flags.DEFINE_float("validation_split", 0.1, "Fraction of the training set held out.")
flags.DEFINE_list("gate_biases", None, "Initial gate biases searched, values or a range "
                  "low:high (default for a model with a gate bias: 0,-1,...,-10).")
flags.DEFINE_list("learning_rates", None, "Learning rates searched: values or a range "
                  "low:high (log-uniform).")
flags.DEFINE_list("momentums", None, "SGD momentums searched: values or a range low:high.")
flags.DEFINE_list("lr_decays", None, "Learning-rate decay factors per epoch searched "
                  "(recipes with an exponential schedule): values or a range low:high.")
flags.DEFINE_list("activations", None, "Activations searched (highway_net, plain_net): "
                  "relu, tanh.")
flags.DEFINE_list("weight_decays", None, "Weight decays searched: values or a range "
                  "low:high.")
flags.DEFINE_list("depths", None, "Depths searched.")
flags.DEFINE_enum("objective", "val_error", list(_cli.tune_objectives()),
                  "What a trial is judged by (its best epoch): validation error, or the "
                  "training error or loss (Srivastava et al.'s depth study).")
flags.DEFINE_bool("retrain_best", False, "Train the best value on the whole training set "
                  "and report its test error.")
flags.DEFINE_integer("retrain_epochs", None, "Epochs of --retrain_best (default: --epochs).")


def _floats(name, values, log=False, ranges=True):
    """Comma-separated numbers, or with ``ranges`` one range ``low:high``."""
    from keras_identity.tuning import parse_range

    if values is None:
        return None
    if not values:
        return ()   # given empty: refused by SearchConfig.validate
    if ranges and len(values) == 1 and ":" in values[0]:
        try:
            return parse_range(name, values[0], log=log)
        except ValueError as error:
            _cli.fail(error, 2)
    try:
        return tuple(float(v) for v in values)
    except ValueError:
        _cli.fail(f"{name}={','.join(values)} is not valid; expected comma-separated numbers"
                  + (" or one range low:high" if ranges else ""), 2)


def main(argv):
    if len(argv) > 1:
        _cli.fail(f"unexpected arguments {argv[1:]}", 2)
    from keras_identity.storage import StorageError
    from keras_identity.training import STOP_STATUS
    from keras_identity.training import ConfigError
    from keras_identity.training import Stopped
    from keras_identity.tuning import SearchConfig
    from keras_identity.tuning import TrialsFailed
    from keras_identity.tuning import run_search

    if FLAGS.depth is not None and FLAGS.depths is not None:
        _cli.fail("--depth and --depths are exclusive: --depths is what the search varies", 2)
    if FLAGS.max_trials is not None and FLAGS.tuner == "hyperband":
        _cli.fail("--max_trials does not apply to --tuner=hyperband (it decides its trials "
                  "from --epochs)", 2)
    if FLAGS.retrain_epochs is not None and not FLAGS.retrain_best:
        _cli.fail("--retrain_epochs applies with --retrain_best", 2)
    try:
        train = _cli.config_from_flags()
    except ValueError as error:
        _cli.fail(error, 2)
    search = SearchConfig(
        train=train, tuner=FLAGS.tuner, max_trials=FLAGS.max_trials,
        validation_split=FLAGS.validation_split,
        gate_biases=_floats("gate_biases", FLAGS.gate_biases),
        learning_rates=_floats("learning_rates", FLAGS.learning_rates, log=True),
        momentums=_floats("momentums", FLAGS.momentums),
        lr_decays=_floats("lr_decays", FLAGS.lr_decays),
        activations=None if FLAGS.activations is None else tuple(FLAGS.activations),
        weight_decays=_floats("weight_decays", FLAGS.weight_decays),
        depths=_floats("depths", FLAGS.depths, ranges=False), objective=FLAGS.objective,
        retrain_best=FLAGS.retrain_best, retrain_epochs=FLAGS.retrain_epochs)
    try:
        search.validate()
        if not FLAGS.model_dir:
            train.model_dir = os.path.join(
                "runs", f"tune_{train.model}{train.resolved_depth or ''}_{train.dataset}")
        run_search(search)
    except Stopped as stopped:
        # Saved (a trial's step, the search's results or the retraining's
        # checkpoint); the line says what the same command does next.
        print(f"{stopped} (exit status {STOP_STATUS})", file=sys.stderr, flush=True)
        sys.exit(STOP_STATUS)
    except ConfigError as error:
        _cli.fail(error, 2)
    except TrialsFailed as error:  # results written, the failed trials noted
        _cli.fail(error, 1)
    except StorageError as error:  # the bucket could not be read or written: one line
        _cli.fail(error, 1)


def run():
    """The console command keras-identity-tune."""
    _cli.run_program(main, __name__, stop_signals=True)


if __name__ == "__main__":
    run()

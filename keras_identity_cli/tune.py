r"""Searches the initial gate bias (b_g, b_T) with Keras Tuner, as the papers did.

    keras-identity-tune --model=highway_net --depth=50 --dataset=mnist \
        --tuner=grid --epochs=3 --model_dir=runs/tune_highway50
    python -m keras_identity_cli.tune --model=resnet --depth=110 --shortcut=exclusive_gating \
        --dataset=cifar10 --data_dir=../shared/data --epochs=10 --retrain_best

The space is b in {0, -1, ..., -10} (--gate_biases), optionally with
--learning_rates, --weight_decays, --depths.  Trials train on the training
set minus a validation split (--validation_split); the test set is only
used by --retrain_best, which trains the best value on the whole training
set.  Running the same command again continues the search; finished trials
are not redone.  Writes results.csv, results.md and
val_error_vs_gate_bias.png into --model_dir.
"""

import os

from absl import flags

from keras_identity_cli import _common as _cli

_cli.select_backend()  # before keras_identity (and Keras) is imported

FLAGS = flags.FLAGS
_cli.define_backend_flag()
flags.DEFINE_string("model", "highway_net", "resnet, preact_resnet (with a gated --shortcut) "
                    "or highway_net.")
flags.DEFINE_integer("depth", None, "Depth (default: the model's usual depth).")
_cli.define_model_flags(shortcuts=_cli.gated_shortcuts())
flags.DEFINE_enum("dataset", "mnist", list(_cli.constants().DATASETS), "Dataset.")
flags.DEFINE_string("data_dir", None, "Offline data or a tensorflow_datasets directory.")
flags.DEFINE_enum("recipe", None, list(_cli.constants().RECIPE_NAMES),
                  "Training recipe of each trial (default: by model and dataset).")
flags.DEFINE_enum("tuner", "grid", list(_cli.tuners()), "Tuner.")
flags.DEFINE_integer("max_trials", None, "Trials (default: the size of the space; hyperband "
                     "decides its own).")
flags.DEFINE_integer("epochs", 3, "Epochs per trial (hyperband: the most a trial gets).")
flags.DEFINE_integer("batch_size", None, "Global batch size.")
flags.DEFINE_float("validation_split", 0.1, "Fraction of the training set held out.")
flags.DEFINE_list("gate_biases", [str(b) for b in range(0, -11, -1)],
                  "Initial gate biases searched.")
flags.DEFINE_list("learning_rates", None, "Optional learning rates searched.")
flags.DEFINE_list("weight_decays", None, "Optional weight decays searched.")
flags.DEFINE_list("depths", None, "Optional depths searched.")
flags.DEFINE_bool("retrain_best", False, "Train the best value on the whole training set "
                  "and report its test error.")
flags.DEFINE_integer("retrain_epochs", None, "Epochs of --retrain_best (default: --epochs).")
flags.DEFINE_enum("strategy", "auto", [s for s in _cli.constants().STRATEGIES
                                       if s != "multi_worker"],
                  "tf.distribute strategy, passed to the tuner.")
flags.DEFINE_string("tpu", "", "TPU address for --strategy=tpu.")
flags.DEFINE_enum("precision", "float32", list(_cli.constants().PRECISIONS),
                  "Keras dtype policy.")
flags.DEFINE_integer("seed", 0, "Seed of data split, initialisation and tuner.")
flags.DEFINE_integer("train_examples", None, "Use a random subset of the training set.")
flags.DEFINE_string("model_dir", None, "Tuner directory (default: runs/tune_<model><depth>_"
                    "<dataset>).")
flags.DEFINE_enum("verbose", "1", ["0", "1", "2"], "Keras progress of each trial.")


def _floats(name, values):
    try:
        return tuple(float(v) for v in values) if values else None
    except ValueError:
        _cli.fail(f"{name}={','.join(values)} is not valid; expected comma-separated numbers", 2)


def main(argv):
    if len(argv) > 1:
        _cli.fail(f"unexpected arguments {argv[1:]}", 2)
    from keras_identity.training import ConfigError
    from keras_identity.training import TrainConfig
    from keras_identity.tuning import SearchConfig
    from keras_identity.tuning import run_search

    if FLAGS.gate_bias_init is not None:
        _cli.fail("--gate_bias_init is what the search varies; give the values with "
                  "--gate_biases", 2)
    try:
        model_kwargs = _cli.model_kwargs_from_flags(FLAGS.model)
    except ValueError as error:
        _cli.fail(error, 2)
    train = TrainConfig(
        model=FLAGS.model, depth=FLAGS.depth, model_kwargs=model_kwargs,
        dataset=FLAGS.dataset, data_dir=FLAGS.data_dir, recipe=FLAGS.recipe,
        batch_size=FLAGS.batch_size, epochs=FLAGS.epochs, strategy=FLAGS.strategy,
        tpu=FLAGS.tpu, precision=FLAGS.precision, seed=FLAGS.seed,
        train_examples=FLAGS.train_examples, verbose=int(FLAGS.verbose))
    depths = _floats("depths", FLAGS.depths)
    search = SearchConfig(
        train=train, tuner=FLAGS.tuner, max_trials=FLAGS.max_trials,
        validation_split=FLAGS.validation_split,
        gate_biases=_floats("gate_biases", FLAGS.gate_biases),
        learning_rates=_floats("learning_rates", FLAGS.learning_rates),
        weight_decays=_floats("weight_decays", FLAGS.weight_decays),
        depths=depths,
        retrain_best=FLAGS.retrain_best, retrain_epochs=FLAGS.retrain_epochs)
    try:
        search.validate()
        train.model_dir = FLAGS.model_dir or os.path.join(
            "runs", f"tune_{train.model}{train.resolved_depth or ''}_{train.dataset}")
        run_search(search)
    except ConfigError as error:
        _cli.fail(error, 2)


def run():
    """The console command keras-identity-tune."""
    _cli.run_program(main, __name__)


if __name__ == "__main__":
    run()

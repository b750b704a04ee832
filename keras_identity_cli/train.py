r"""Trains any keras_identity model under tf.distribute with the papers' recipes.

    keras-identity-train                          # highway-50 on the built-in MNIST
    python -m keras_identity_cli.train            # the same, as a module
    keras-identity-train --model=preact_resnet --depth=164 --dataset=cifar10 \
        --data_dir=../shared/data --model_dir=runs/pre164

Writes into --model_dir: TensorBoard logs (tensorboard/), history.csv and
history.json, curves.png (training loss dashed, test error solid), checkpoints/
(resumed automatically when the same command runs again), config.json,
preprocessing.json (what serving needs) and the final model.keras.
"""

import os
import sys

from absl import flags

from keras_identity_cli import _common as _cli

_cli.select_backend()  # before keras_identity (and Keras) is imported

FLAGS = flags.FLAGS
_cli.define_backend_flag()

flags.DEFINE_string("model", "highway_net", "Builder (resnet, preact_resnet, highway_net, "
                    "plain_net) or a named configuration (e.g. preact_resnet164).")
flags.DEFINE_integer("depth", None, "Depth (default: the model's usual depth for the dataset).")
_cli.define_model_flags()
flags.DEFINE_enum("dataset", "mnist", list(_cli.constants().DATASETS), "Dataset.")
flags.DEFINE_string("data_dir", None, "Offline data (.npz, image folder or .tar.gz, or a "
                    "folder holding one) or a tensorflow_datasets data directory.")
flags.DEFINE_enum("recipe", None, list(_cli.constants().RECIPE_NAMES),
                  "Training recipe (default: by model and dataset).")
flags.DEFINE_integer("batch_size", None, "Global batch size (default: the recipe's; the "
                     "learning rate and iteration counts scale linearly).")
flags.DEFINE_integer("epochs", None, "Train this many epochs (overrides the recipe's length).")
flags.DEFINE_integer("train_steps", None, "Train this many iterations.")
flags.DEFINE_integer("stop_at_step", None, "Stop at this step, resumable: the learning-rate "
                     "schedule keeps the run's length (the start of a long run; a multiple "
                     "of the epoch).")
flags.DEFINE_integer("steps_per_epoch", None, "Iterations per epoch (default: one pass over "
                     "the training set); also the checkpoint interval.")
flags.DEFINE_float("learning_rate", None, "Peak learning rate at this batch size.")
flags.DEFINE_float("momentum", None, "SGD momentum.")
flags.DEFINE_float("weight_decay", None, "Weight decay (coupled, as the authors' Torch code).")
flags.DEFINE_float("lr_decay", None, "Learning-rate decay factor per epoch (recipes with an "
                   "exponential schedule: highway_mnist).")
flags.DEFINE_integer("warmup_steps", None, "Warm-up iterations.")
flags.DEFINE_enum("normalization", None, list(_cli.constants().NORMALIZATIONS),
                  "Input normalisation (default: the recipe's).")
flags.DEFINE_enum("augmentation", None, list(_cli.constants().AUGMENTATIONS),
                  "Data augmentation (default: the recipe's).")
flags.DEFINE_enum("strategy", "auto", list(_cli.constants().STRATEGIES),
                  "Distribution: a tf.distribute strategy on TensorFlow, "
                  "keras.distribution.DataParallel on JAX (auto/mirrored: every device, of every "
                  "process).")
flags.DEFINE_string("tpu", "", "TPU address for --strategy=tpu (Colab: empty).")
flags.DEFINE_enum("precision", "float32", list(_cli.constants().PRECISIONS),
                  "Keras dtype policy (mixed_float16 uses loss scaling).")
flags.DEFINE_bool("jit_compile", False, "Compile the training step with XLA.")
flags.DEFINE_integer("steps_per_execution", None, "Training steps per call of the compiled "
                     "function (default: 32 on a TPU, else 1; a divisor of the epoch).")
flags.DEFINE_integer("seed", 0, "Seed of initialisation, shuffling and augmentation.")
flags.DEFINE_bool("deterministic", False, "Enable TensorFlow op determinism (with --seed: "
                  "repeatable runs on CPU).")
flags.DEFINE_string("model_dir", None, "Output directory (default: runs/<model><depth>_<dataset>).")
flags.DEFINE_integer("keep_checkpoints", 2, "Checkpoints kept.")
flags.DEFINE_integer("train_examples", None, "Use a random subset of the training set.")
flags.DEFINE_integer("test_examples", None, "Use a random subset of the test set.")
flags.DEFINE_enum("eval_crop", "224", ["224", "320"], "ImageNet evaluation crop (Table 5).")
_cli.define_process_flags()
flags.DEFINE_enum("verbose", "1", ["0", "1", "2"], "Keras progress: 0 silent, 1 progress "
                  "bar, 2 one line per epoch.")


def config_from_flags():
    from keras_identity.training import TrainConfig

    from keras_identity.training import ConfigError

    try:
        model_kwargs = _cli.model_kwargs_from_flags(FLAGS.model)
    except ValueError as error:
        raise ConfigError(str(error)) from None
    config = TrainConfig(
        model=FLAGS.model, depth=FLAGS.depth, model_kwargs=model_kwargs, dataset=FLAGS.dataset,
        data_dir=FLAGS.data_dir, recipe=FLAGS.recipe, batch_size=FLAGS.batch_size,
        epochs=FLAGS.epochs, train_steps=FLAGS.train_steps, stop_at_step=FLAGS.stop_at_step,
        steps_per_epoch=FLAGS.steps_per_epoch, learning_rate=FLAGS.learning_rate,
        momentum=FLAGS.momentum, weight_decay=FLAGS.weight_decay, lr_decay=FLAGS.lr_decay,
        warmup_steps=FLAGS.warmup_steps, normalization=FLAGS.normalization,
        augmentation=FLAGS.augmentation, strategy=FLAGS.strategy, tpu=FLAGS.tpu,
        precision=FLAGS.precision, jit_compile=FLAGS.jit_compile,
        steps_per_execution=FLAGS.steps_per_execution, seed=FLAGS.seed,
        deterministic=FLAGS.deterministic, keep_checkpoints=FLAGS.keep_checkpoints,
        train_examples=FLAGS.train_examples, test_examples=FLAGS.test_examples,
        eval_crop=int(FLAGS.eval_crop), verbose=int(FLAGS.verbose))
    config.validate()
    config.model_dir = FLAGS.model_dir or os.path.join(
        "runs", f"{config.model}{config.resolved_depth or ''}_{config.dataset}")
    return config


def main(argv):
    if len(argv) > 1:
        _cli.fail(f"unexpected arguments {argv[1:]}; flags are written --name=value", 2)
    processes = _cli.initialize_processes()
    from keras_identity.training import ConfigError
    from keras_identity.training import TrainingDiverged
    from keras_identity.training import WriteError
    from keras_identity.training import train
    from keras_identity.training.processes import lost_peer

    def fail(message, code=1):
        _cli.fail(message, code, at_once=processes > 1)

    try:
        train(config_from_flags())
    except ConfigError as error:
        fail(error, 2)
    except TrainingDiverged as error:
        fail(f"training diverged: {error}")
    except WriteError as error:
        fail(error)
    except Exception as error:
        if processes > 1 and lost_peer(error):
            fail(f"another process of this {processes}-process run stopped or cannot be "
                 f"reached ({' '.join(str(error).split())[:160]}); see its log, then run the "
                 f"same command on every host to resume from the last checkpoint")
        if processes > 1:
            import traceback

            traceback.print_exc()
            fail(f"{type(error).__name__}: {' '.join(str(error).split())[:200]}")
        raise
    if processes > 1:
        # Every process is done (train() ends at a barrier): leave without JAX's
        # shutdown barrier, which aborts a process whose peer left first.
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)


def run():
    """The console command keras-identity-train."""
    _cli.run_program(main, __name__)


if __name__ == "__main__":
    run()

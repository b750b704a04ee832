r"""Trains any keras_identity model under tf.distribute with the papers' recipes.

    python -m experiments.train                       # highway-50 on the built-in MNIST
    python -m experiments.train --model=preact_resnet --depth=164 --dataset=cifar10 \
        --data_dir=../shared/data --model_dir=runs/pre164

Writes into --model_dir: TensorBoard logs (tensorboard/), history.csv and
history.json, curves.png (training loss dashed, test error solid), checkpoints/
(resumed automatically when the same command runs again), config.json,
preprocessing.json (what serving needs) and the final model.keras.
"""

import os

from absl import app
from absl import flags

from experiments import _cli

FLAGS = flags.FLAGS

flags.DEFINE_string("model", "highway_net", "Builder (resnet, preact_resnet, highway_net, "
                    "plain_net) or a named configuration (e.g. preact_resnet164).")
flags.DEFINE_integer("depth", None, "Depth (default: the model's usual depth for the dataset).")
flags.DEFINE_enum("unit", None, ["original", "bn_after_addition", "relu_before_addition",
                                 "relu_only_preactivation", "full_preactivation"],
                  "Residual unit ordering (Fig. 4).")
flags.DEFINE_enum("shortcut", None, ["identity", "constant_scaling", "exclusive_gating",
                                     "shortcut_only_gating", "conv1x1", "dropout"],
                  "Shortcut (Fig. 2).")
flags.DEFINE_enum("block", None, ["basic", "bottleneck", "single"], "Residual block.")
flags.DEFINE_float("gate_bias_init", None, "Initial gate bias: b_g of gated shortcuts, b_T of "
                   "highway layers.")
flags.DEFINE_float("shortcut_scale", None, "lambda of --shortcut=constant_scaling (0: a plain "
                   "net).")
flags.DEFINE_bool("scale_residual", None, "With constant_scaling, scale F by 1 - lambda "
                  "(Table 1's frozen gating).")
flags.DEFINE_float("shortcut_dropout_rate", None, "Drop rate of --shortcut=dropout.")
flags.DEFINE_float("stochastic_depth_rate", 0.0, "Stochastic depth rate of the last unit.")
flags.DEFINE_enum("stage_mode", "auto", ["auto", "unrolled", "scan"], "ResNet stages as one "
                  "layer per unit (unrolled) or one looped layer (scan: start-up flat in "
                  "depth); auto loops stages of 12+ units.")
flags.DEFINE_enum("recompute", "none", ["none", "bn_relu", "unit"], "What the looped "
                  "units compute again in the backward pass instead of keeping: nothing, "
                  "the BN-ReLU outputs (half the activation memory) or all but each "
                  "unit's input (e.g. ResNet-1001 at batch 128).")
flags.DEFINE_enum("dataset", "mnist", ["mnist", "cifar10", "cifar100", "imagenet"], "Dataset.")
flags.DEFINE_string("data_dir", None, "Offline data (.npz, image folder or .tar.gz, or a "
                    "folder holding one) or a tensorflow_datasets data directory.")
flags.DEFINE_enum("recipe", None, ["cifar", "imagenet", "highway_mnist", "highway_cifar"],
                  "Training recipe (default: by model and dataset).")
flags.DEFINE_integer("batch_size", None, "Global batch size (default: the recipe's; the "
                     "learning rate and iteration counts scale linearly).")
flags.DEFINE_integer("epochs", None, "Train this many epochs (overrides the recipe's length).")
flags.DEFINE_integer("train_steps", None, "Train this many iterations.")
flags.DEFINE_integer("steps_per_epoch", None, "Iterations per epoch (default: one pass over "
                     "the training set); also the checkpoint interval.")
flags.DEFINE_float("learning_rate", None, "Peak learning rate at this batch size.")
flags.DEFINE_float("momentum", None, "SGD momentum.")
flags.DEFINE_float("weight_decay", None, "Weight decay (coupled, as the authors' Torch code).")
flags.DEFINE_integer("warmup_steps", None, "Warm-up iterations.")
flags.DEFINE_enum("normalization", None, ["per_pixel_mean", "per_channel", "scale"],
                  "Input normalisation (default: the recipe's).")
flags.DEFINE_enum("augmentation", None, ["none", "cifar", "imagenet"],
                  "Data augmentation (default: the recipe's).")
flags.DEFINE_enum("strategy", "auto", ["auto", "default", "one_device", "mirrored",
                                       "multi_worker", "tpu"], "tf.distribute strategy.")
flags.DEFINE_string("tpu", "", "TPU address for --strategy=tpu (Colab: empty).")
flags.DEFINE_enum("precision", "float32", ["float32", "mixed_bfloat16", "mixed_float16"],
                  "Keras dtype policy (mixed_float16 uses loss scaling).")
flags.DEFINE_bool("jit_compile", False, "Compile the training step with XLA.")
flags.DEFINE_integer("seed", 0, "Seed of initialisation, shuffling and augmentation.")
flags.DEFINE_bool("deterministic", False, "Enable TensorFlow op determinism (with --seed: "
                  "repeatable runs on CPU).")
flags.DEFINE_string("model_dir", None, "Output directory (default: runs/<model><depth>_<dataset>).")
flags.DEFINE_integer("keep_checkpoints", 2, "Checkpoints kept.")
flags.DEFINE_integer("train_examples", None, "Use a random subset of the training set.")
flags.DEFINE_integer("test_examples", None, "Use a random subset of the test set.")
flags.DEFINE_enum("eval_crop", "224", ["224", "320"], "ImageNet evaluation crop (Table 5).")
flags.DEFINE_enum("verbose", "1", ["0", "1", "2"], "Keras progress: 0 silent, 1 progress "
                  "bar, 2 one line per epoch.")


def config_from_flags():
    from keras_identity.training import TrainConfig

    config = TrainConfig(
        model=FLAGS.model, depth=FLAGS.depth, unit=FLAGS.unit, shortcut=FLAGS.shortcut,
        block=FLAGS.block, gate_bias_init=FLAGS.gate_bias_init,
        shortcut_scale=FLAGS.shortcut_scale, scale_residual=FLAGS.scale_residual,
        shortcut_dropout_rate=FLAGS.shortcut_dropout_rate,
        stochastic_depth_rate=FLAGS.stochastic_depth_rate, stage_mode=FLAGS.stage_mode,
        recompute=FLAGS.recompute, dataset=FLAGS.dataset,
        data_dir=FLAGS.data_dir, recipe=FLAGS.recipe, batch_size=FLAGS.batch_size,
        epochs=FLAGS.epochs, train_steps=FLAGS.train_steps,
        steps_per_epoch=FLAGS.steps_per_epoch, learning_rate=FLAGS.learning_rate,
        momentum=FLAGS.momentum, weight_decay=FLAGS.weight_decay,
        warmup_steps=FLAGS.warmup_steps, normalization=FLAGS.normalization,
        augmentation=FLAGS.augmentation, strategy=FLAGS.strategy, tpu=FLAGS.tpu,
        precision=FLAGS.precision, jit_compile=FLAGS.jit_compile, seed=FLAGS.seed,
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
    from keras_identity.training import ConfigError
    from keras_identity.training import TrainingDiverged
    from keras_identity.training import train

    try:
        train(config_from_flags())
    except ConfigError as error:
        _cli.fail(error, 2)
    except TrainingDiverged as error:
        _cli.fail(f"training diverged: {error}")


if __name__ == "__main__":
    app.run(main, flags_parser=_cli.one_line_flags_parser)

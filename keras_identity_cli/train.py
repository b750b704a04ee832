r"""Trains any keras_identity model under tf.distribute with the papers' recipes.

    keras-identity-train                          # highway-50 on the built-in MNIST
    python -m keras_identity_cli.train            # the same, as a module
    keras-identity-train --model=preact_resnet --depth=164 --dataset=cifar10 \
        --data_dir=../shared/data --model_dir=runs/pre164

Writes into --model_dir: TensorBoard logs (tensorboard/), history.csv and
history.json, curves.png (training loss dashed, test error solid), checkpoints/
(resumed automatically when the same command runs again), config.json,
preprocessing.json (what serving needs), the final model.keras and, once the
run is complete, its model card (model_card.md and model_card.json).
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

_cli.define_config_flags()
_cli.define_model_flags()
_cli.define_process_flags()


def config_from_flags():
    from keras_identity.training import ConfigError

    try:
        return _cli.config_from_flags().validate()
    except ValueError as error:
        raise ConfigError(str(error)) from None


def main(argv):
    if len(argv) > 1:
        _cli.fail(f"unexpected arguments {argv[1:]}; flags are written --name=value", 2)
    processes = _cli.initialize_processes()
    from keras_identity.training import STOP_STATUS
    from keras_identity.training import ConfigError
    from keras_identity.training import Stopped
    from keras_identity.training import TrainingDiverged
    from keras_identity.training import WriteError
    from keras_identity.storage import StorageError
    from keras_identity.training import train
    from keras_identity.training.processes import lost_peer

    def fail(message, code=1):
        _cli.fail(message, code, at_once=processes > 1)

    try:
        config = config_from_flags()
        result = train(config)
        if result["chief"] and result["complete"]:
            write_card(config, result)
    except Stopped as stopped:
        # Saved: the one line, and the status a scheduler requeues on.
        print(f"{stopped} (exit status {STOP_STATUS})", file=sys.stderr, flush=True)
        if processes > 1:
            sys.stdout.flush()
            os._exit(STOP_STATUS)
        sys.exit(STOP_STATUS)
    except ConfigError as error:
        fail(error, 2)
    except TrainingDiverged as error:
        fail(f"training diverged: {error}")
    except WriteError as error:
        fail(error)
    except StorageError as error:  # a bucket lost mid-run (the checkpoint before is intact)
        fail(f"{error.strerror}; the last checkpoint is intact: fix the cause and run the same "
             f"command to resume")
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


def write_card(config, result):
    """Writes the complete run's model card (model_card.md and .json) and says where."""
    from keras_identity.training import model_card
    from keras_identity_cli import machine

    card = model_card.make_card(config, result, command=model_card.command_line(),
                                machine=machine.describe())
    print(f"model card: {model_card.write_card(config.model_dir, card)}")


def run():
    """The console command keras-identity-train."""
    _cli.run_program(main, __name__, stop_signals=True)


if __name__ == "__main__":
    run()

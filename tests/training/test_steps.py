"""Where a run's steps end (:mod:`keras_identity.training.steps`): steps per
execution divide the epoch, the run and the step resumed from, and what
Keras cannot run on several MirroredStrategy replicas is refused."""

import keras
import pytest

from keras_identity import recipes
from keras_identity.training.config import TrainConfig
from keras_identity.training.steps import check_distributed_step
from keras_identity.training.steps import resolve_steps_per_execution
from keras_identity.training.steps import steps_per_execution_note

pytestmark = pytest.mark.quick  # the quick tier (docs/testing.md)


def test_steps_per_execution_is_32_on_a_tpu_16_on_jax_and_divides_the_epoch_and_the_run():
    def plan(per_epoch, total):
        return recipes.RunPlan(learning_rate=0.1, total_steps=total, steps_per_epoch=per_epoch,
                               boundaries=(), warmup_steps=0, warmup_rate=None, warmup="none",
                               batch_size=128, scale=1.0)

    assert resolve_steps_per_execution(None, plan(390, 64_000 // 390 * 390), True) == 30
    assert resolve_steps_per_execution(None, plan(128, 1280), True) == 32
    assert resolve_steps_per_execution(None, plan(128, 1280), False, "tensorflow") == 1
    # JAX: up to 16 (Keras's fit loop costs as much per call as a small step);
    # highway-50's MNIST epoch of 468 steps takes 13, a CIFAR epoch of 391 one.
    assert resolve_steps_per_execution(None, plan(128, 1280), False, "jax") == 16
    assert resolve_steps_per_execution(None, plan(468, 9360), False, "jax") == 13
    assert resolve_steps_per_execution(None, plan(391, 64_000 // 391 * 391), False,
                                       "jax") == 1
    assert resolve_steps_per_execution(None, plan(7, 21), True) == 7
    # A run resumed from inside an epoch: the calls divide that step too.
    assert resolve_steps_per_execution(None, plan(4, 12), False, "jax", start_step=6) == 2
    with pytest.raises(ValueError, match="steps_per_execution=4 is not valid for this run: it "
                                         "resumes from step 6"):
        resolve_steps_per_execution(4, plan(4, 12), False, start_step=6)
    assert resolve_steps_per_execution(16, plan(128, 1280), False) == 16
    with pytest.raises(ValueError, match="steps_per_execution=10 is not valid: it must divide"):
        resolve_steps_per_execution(10, plan(128, 1280), False)
    # Fewer than 32 on a TPU is said, with the fix.
    note = steps_per_execution_note(7, None, plan(7, 21), True)
    assert note.startswith("note: 7 steps per execution on the TPU, not 32: no larger divisor "
                           "of the epoch (7 steps) and the run (21 steps)")
    assert steps_per_execution_note(32, None, plan(128, 1280), True) is None
    assert steps_per_execution_note(1, None, plan(7, 21), False) is None
    assert steps_per_execution_note(7, 7, plan(7, 21), True) is None   # asked for


@pytest.mark.parametrize("kwargs, words", [
    (dict(jit_compile=True), ["jit_compile=True is not valid with MirroredStrategy (2 replicas)",
                              "keras-team/keras#18145"]),
    (dict(steps_per_execution=2), ["steps_per_execution=2 is not valid with MirroredStrategy",
                                   "keras-team/keras#19246"]),
])
def test_what_keras_cannot_run_on_mirrored_replicas_is_refused(kwargs, words):
    """Keras 3's TensorFlow trainer fails on several MirroredStrategy replicas
    with XLA or several steps per execution (reproduced on two logical CPUs);
    the trainer says so in one line before building anything."""
    if keras.backend.backend() != "tensorflow":
        pytest.skip("a TensorFlow strategy")

    class MirroredStrategy:  # what the check reads of two replicas
        num_replicas_in_sync = 2

    strategy = MirroredStrategy()
    config = TrainConfig(**{k: v for k, v in kwargs.items() if k == "jit_compile"})
    with pytest.raises(ValueError) as error:
        check_distributed_step(config.jit_compile, strategy, kwargs.get("steps_per_execution", 1))
    for word in words:
        assert word in str(error.value)
    check_distributed_step(TrainConfig().jit_compile, strategy, 1)

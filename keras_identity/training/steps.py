"""Where a run's steps end: the step an invocation stops at, and how many
training steps one call of the compiled function runs.

:func:`check_stop_at_step` and :func:`stop_step`: ``--stop_at_step`` ends an
epoch (the run stops at a checkpoint), within the run's length.
:func:`resolve_steps_per_execution` turns ``--steps_per_execution`` (or the
default: 32 on a TPU, up to 16 on JAX, else 1) into a divisor of the epoch,
of the run's length and of the step a run resumes from;
:func:`steps_per_execution_note` says why a TPU run makes fewer; and
:func:`check_distributed_step` refuses the compiled steps Keras's TensorFlow
trainer cannot run on several replicas (XLA, several steps per call).
"""

import math

import keras

from keras_identity.training import strategies


def check_stop_at_step(stop_at_step, plan):
    """A run stops at a checkpoint: ``stop_at_step`` must end an epoch."""
    if stop_at_step is not None and stop_at_step % plan.steps_per_epoch:
        raise ValueError(f"stop_at_step={stop_at_step} is not valid; expected a multiple of "
                         f"the epoch ({plan.steps_per_epoch} steps, --steps_per_epoch), "
                         f"so that the run stops at a checkpoint.")


def stop_step(stop_at_step, plan):
    """The step this invocation trains to: ``stop_at_step`` within the run's length."""
    return min(plan.total_steps, stop_at_step or plan.total_steps)


# Training steps per call of the compiled function on a TPU (host round trips
# dominate small steps there); elsewhere one.
TPU_STEPS_PER_EXECUTION = 32
# On JAX, Keras's fit loop costs about as much per call as highway-50's whole
# MNIST step (it re-tracks the training state on the model and runs the
# callbacks), so a call runs several steps: the default command trains 1.6-2.5x
# faster (docs/performance.md, "The JAX route's step").
JAX_STEPS_PER_EXECUTION = 16


def resolve_steps_per_execution(requested, plan, tpu, backend=None, start_step=0):
    """Steps per compiled call: ``requested``, or 32 on a TPU, 16 on JAX and
    1 elsewhere (``backend``: Keras's, by default), as a divisor of the epoch,
    of the run's length and of ``start_step``, the step it resumes from (a
    call never crosses a checkpoint or the end of training).

    Raises:
        ValueError: a requested value that does not divide them.
    """
    total, per_epoch = plan.total_steps, plan.steps_per_epoch
    if requested is not None:
        if per_epoch % requested or total % requested:
            raise ValueError(f"steps_per_execution={requested} is not valid: it must divide "
                             f"steps_per_epoch={per_epoch} and the run's {total} steps.")
        if start_step % requested:
            raise ValueError(f"steps_per_execution={requested} is not valid for this run: "
                             f"it resumes from step {start_step}, which it does not divide; "
                             f"give a divisor of {math.gcd(start_step, requested)}, or leave "
                             f"the flag out.")
        return requested
    if tpu:
        wanted = TPU_STEPS_PER_EXECUTION
    elif (backend or keras.backend.backend()) == "jax":
        wanted = JAX_STEPS_PER_EXECUTION
    else:
        wanted = 1
    return max(d for d in range(1, wanted + 1)
               if per_epoch % d == 0 and total % d == 0 and start_step % d == 0)


def steps_per_execution_note(resolved, requested, plan, tpu):
    """A line saying why a TPU run makes fewer than 32 steps per compiled
    call (no larger divisor of the epoch and the run), or ``None``."""
    if not tpu or requested is not None or resolved >= TPU_STEPS_PER_EXECUTION:
        return None
    return (f"note: {resolved} step{'s' if resolved > 1 else ''} per execution on the TPU, "
            f"not {TPU_STEPS_PER_EXECUTION}: no larger divisor of the epoch "
            f"({plan.steps_per_epoch} steps) and the run ({plan.total_steps} steps) "
            f"is at most {TPU_STEPS_PER_EXECUTION}; a --steps_per_epoch and a run length "
            f"(--train_steps or --epochs) divisible by {TPU_STEPS_PER_EXECUTION} save host "
            f"round trips")


def check_distributed_step(jit_compile, strategy, steps_per_execution):
    """Refuses what Keras 3's TensorFlow trainer cannot run on several
    replicas of a ``MirroredStrategy``/``MultiWorkerMirroredStrategy``: it
    compiles ``strategy.run`` inside the XLA function (keras-team/keras#18145)
    and loops over distributed iterators in a ``tf.while_loop`` that fails
    with "You must feed a value for placeholder tensor" (keras-team/keras#19246;
    both reproduced with Keras 3.15 on two logical CPU devices).  A TPU
    compiles its step itself, and JAX has neither problem.  ``jit_compile``:
    ``--jit_compile``."""
    if (keras.backend.backend() != "tensorflow" or strategies.is_tpu(strategy)
            or strategy.num_replicas_in_sync < 2):
        return
    where = strategies.describe(strategy)
    if jit_compile:
        raise ValueError(f"jit_compile=True is not valid with {where} on TensorFlow: Keras "
                         f"compiles the whole distributed step, which tf.distribute cannot "
                         f"run (keras-team/keras#18145); drop --jit_compile, or use "
                         f"--backend=jax.")
    if steps_per_execution > 1:
        raise ValueError(f"steps_per_execution={steps_per_execution} is not valid with {where} "
                         f"on TensorFlow (Keras's multi-step loop fails on distributed "
                         f"iterators, keras-team/keras#19246); use 1, or --backend=jax.")

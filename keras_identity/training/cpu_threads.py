"""Threads of TensorFlow's CPU operations in training: how many cores each operation
runs on, and how many operations run at once.

TensorFlow runs a CPU operation's kernel (oneDNN's convolutions, its batch
normalisation) on its intra-op thread pool, every core by default, and starts
independent operations (in a training step: a convolution's input and filter gradients,
the next unit's forward work in a looped stage) on an inter-op pool.  At small batches a
convolution is too small to split well over TensorFlow's pool: at ResNet-1001's shapes
(batch 16, 16-64 channels) a 3x3 convolution on two cores took about twice PyTorch's
time for the same oneDNN call (docs/performance.md, "Threads per operation").  Two
operations at once on one core each then keep both cores busier than one operation on
two.  At larger batches each operation splits well and the intra-op pool is faster.
Measured on 2 cores (AMD EPYC, AVX-512, oneDNN; docs/performance.md): one thread per
operation, two at once, trains ResNet-1001 and ResNet-164 at batch 16 faster than
TensorFlow's own split, and ResNet-164 at batch 64 slower.  With one thread per
operation the looped stages run their identity units in as many parts along the batch as
operations run at once, forward and backward, BN's sums shared
(:func:`keras_identity.layers.residual._tf_batch_parts.batch_parts`), and split the
other units' forward convolutions so
(:func:`keras_identity.layers.residual._tf_batch_parts.conv_parts`): a unit's operations
are otherwise a chain, one at a time.

So :func:`choose` (``--intra_op_threads``, :class:`TrainConfig
<keras_identity.training.TrainConfig>`) picks, for training on a CPU:

* ``None`` (default): two operations at once with half the cores each where a replica's
  batch gives each core at most :data:`SMALL_BATCH_PER_CORE` images; TensorFlow's own
  split otherwise, and wherever a GPU or TPU trains (the CPU then only feeds it);
* ``0``: TensorFlow's own split (every core per operation);
* ``N``: N threads per operation, ``max(2, cores // N)`` operations at once.

TensorFlow fixes its pools when its runtime starts (the first operation or device
query), so :func:`configure` runs before the run's strategy is made; in a process whose
runtime already started (a notebook that ran TensorFlow before) the pools stay as they
are, and the line says so.
"""

from keras_identity import _checks
from keras_identity import _cpu_kernels as cpu_kernels

# A replica's images per core up to which two operations run at once (measured
# at 8: batch 16 on 2 cores; 32, batch 64, is faster with TensorFlow's split).
SMALL_BATCH_PER_CORE = 8
# Operations at once in the small-batch split.
OPS_AT_ONCE = 2


def choose(intra_op_threads, batch_per_replica, cores=None, accelerator=False):
    """``(intra_op, inter_op, why)``: the pools' sizes for ``--intra_op_threads``
    (see the module docstring), or ``None`` for TensorFlow's own split."""
    cores = cpu_kernels.cores() if cores is None else cores
    if intra_op_threads is not None:
        _checks.check_positive_int("intra_op_threads", intra_op_threads, minimum=0)
        if intra_op_threads == 0:
            return None
        return (intra_op_threads, max(OPS_AT_ONCE, cores // intra_op_threads),
                "--intra_op_threads")
    if accelerator or cores < OPS_AT_ONCE or batch_per_replica > SMALL_BATCH_PER_CORE * cores:
        return None
    return (cores // OPS_AT_ONCE, OPS_AT_ONCE,
            f"keras_identity's choice for a batch of {batch_per_replica} on {cores} cores; "
            f"--intra_op_threads=0 for TensorFlow's own")


def configure(intra_op_threads, batch_per_replica, accelerator=False):
    """Sets TensorFlow's pools as :func:`choose` says, before its runtime
    starts.  Returns a line for the run's log (None where TensorFlow's own
    split stands by default).  Raises ValueError where ``intra_op_threads``
    was given and the runtime already started."""
    import tensorflow as tf

    chosen = choose(intra_op_threads, batch_per_replica, accelerator=accelerator)
    if chosen is None and intra_op_threads is None:
        return None  # TensorFlow's own split, as it is
    target = (0, 0) if chosen is None else chosen[:2]  # 0: TensorFlow's own size
    current = (tf.config.threading.get_intra_op_parallelism_threads(),
               tf.config.threading.get_inter_op_parallelism_threads())
    if current != target:
        try:
            tf.config.threading.set_intra_op_parallelism_threads(target[0])
            tf.config.threading.set_inter_op_parallelism_threads(target[1])
        except RuntimeError:  # the runtime has started: its pools are fixed
            if intra_op_threads is not None:
                raise ValueError(f"intra_op_threads={intra_op_threads} cannot be applied: "
                                 f"TensorFlow's runtime has already started in this process "
                                 f"(set it before running TensorFlow, or in a new "
                                 f"process).") from None
            return ("TensorFlow CPU threads: as they were (its runtime had started before "
                    "the run)")
    if chosen is None:
        return "TensorFlow CPU threads: its own split (--intra_op_threads=0)"
    intra, inter, why = chosen
    return (f"TensorFlow CPU threads: {intra} per operation, {inter} operations at once "
            f"({why})")

"""Batch normalisation of the looped units (TensorFlow), private to
:mod:`._tf_loop`: training-mode BN with the reserves its written gradient
(``FusedBatchNormGradV3``) reads, by TensorFlow's fused op or, where
oneDNN's BN is slow or the units run in parts along the batch
(:func:`affine_batch_norm`), as a depthwise convolution; and its gradient,
over such parts corrected to the whole batch's (:func:`gradient`).
"""

import tensorflow as tf

from keras_identity import _cpu_kernels
from keras_identity.layers.fused_batch_normalization import biased_variance


def affine_batch_norm(in_parts=False):
    """Whether the loop's BN normalises as a per-channel affine map (a 1x1 depthwise
    convolution with BN's scale as its kernel and its shift as its bias, the ReLU after it
    fused by Grappler) instead of ``FusedBatchNormV3``, in training taking the batch moments
    from two matrix products: on a CPU whose oneDNN kernels stop below AVX-512
    (:func:`keras_identity._cpu_kernels.onednn_below_avx512`: the x86 AVX2 class, or
    ``ONEDNN_MAX_CPU_ISA`` capped there), and, with ``in_parts`` (a training loop whose
    units can run in parts along the batch: :func:`._tf_batch_parts.batch_parts`), on any
    CPU with oneDNN's kernels; in float32.  Its moments are sums over the parts, so the
    parts of a map run at once: at ResNet-1001, batch 16, on an AVX-512 Xeon, 7.62 against
    6.15 images/s with oneDNN's BN on whole units (docs/performance.md).

    oneDNN's batch normalisation for channels-last maps on AVX2 (``bnorm_tbb_jit:avx2``, the
    one TensorFlow's thread pool runs) takes 3-5x its AVX-512 kernel's time on the same
    core: 3,867 against 1,243 µs for a 16x32x32x64 training BN on one thread, where
    PyTorch's BN takes 1,385 µs and the products and the depthwise convolution 1,142 µs with
    the ReLU; its inference kernel is as slow (docs/performance.md, "The AVX2 class").  The
    gradient stays ``FusedBatchNormGradV3``, which reads the batch mean and biased variance
    as its reserves.  The moments are ``E[x^2] - E[x]^2`` (as Keras's JAX backend computes
    them), accumulated in float32 over the batch; like any form of BN that shifts after
    scaling, it loses digits where a channel's mean is thousands of its standard deviations.
    A SavedModel exported from such a process carries the depthwise form (Eigen's CPU
    kernels run it 12-14% slower than their BN at inference); ``keras-identity-export`` runs
    TensorFlow's own kernel choice, Eigen's on most AVX2 CPUs, and there writes
    ``FusedBatchNormV3``.
    """
    return (bool(_cpu_kernels.onednn_enabled())
            and (in_parts or _cpu_kernels.onednn_below_avx512())
            and not tf.config.list_physical_devices("GPU"))


def for_loop(inputs, in_parts=False):
    """:func:`affine_batch_norm` for a loop over ``inputs``: float32 maps
    only (mixed precision keeps the fused op)."""
    return inputs.dtype == tf.float32 and affine_batch_norm(in_parts)


def train(xs, gamma, beta, epsilon, affine=False, relu=False):
    """Training-mode BN of a map given as a list of its parts along the
    batch (one part: the whole map): the output parts (after the ReLU where
    ``relu``), (mean, biased variance) over all parts, and the reserves for
    ``FusedBatchNormGradV3``.  ``affine``: see :func:`affine_batch_norm`;
    several parts need it."""
    if affine:
        return _affine_batch_norm(xs, gamma, beta, epsilon, relu)
    (x,) = xs
    empty = tf.constant([], tf.float32)
    y, mean, variance, reserve1, reserve2, reserve3 = tf.raw_ops.FusedBatchNormV3(
        x=x, scale=gamma, offset=beta, mean=empty, variance=empty, epsilon=epsilon,
        exponential_avg_factor=1.0, data_format="NHWC", is_training=True)
    return [tf.nn.relu(y) if relu else y], (mean, biased_variance(x, variance)), (
        reserve1, reserve2, reserve3)


def _count(x):
    """The number of values per channel of NHWC ``x``, float32."""
    return tf.cast(tf.reduce_prod(tf.shape(x)[:-1]), tf.float32)


def _affine_batch_norm(xs, gamma, beta, epsilon, relu):
    """:func:`train` as :func:`affine_batch_norm` says: the reserves
    are the batch mean and biased variance, as oneDNN's own (and reserve 3
    empty).  Each part's sums are its own matrix products, so the parts of
    a map split along the batch run at once."""
    sums, squares = [], []
    for x in xs:
        rows = tf.reshape(x, [-1, x.shape[-1]])
        ones = tf.ones(tf.stack([1, tf.shape(rows)[0]]), rows.dtype)
        sums.append(tf.matmul(ones, rows)[0])
        squares.append(tf.matmul(ones, rows * rows)[0])
    count = tf.add_n([_count(x) for x in xs])
    mean = tf.add_n(sums) / count
    variance = tf.maximum(tf.add_n(squares) / count - tf.square(mean), 0.0)
    ys = [affine(x, gamma, beta, mean, variance, epsilon, relu) for x in xs]
    return ys, (mean, variance), (mean, variance, tf.zeros([0], tf.float32))


def gradient(dys, xs, gamma, reserves, epsilon):
    """The training-mode BN's gradient for maps given as lists of parts along the batch:
    ``(dxs, dgamma, dbeta)``.

    ``FusedBatchNormGradV3`` of a part centres its gradient on that part's means of ``dy``
    and ``dy * x̂``, where BN's gradient (Ioffe and Szegedy, 2015) centres it on the whole
    batch's; with ``m`` values per channel in the batch and ``m_p`` in part ``p``, the
    difference is the per-channel affine map of ``x``
    ``γ σ⁻¹ ((Σ_p dy / m_p − Σ dy / m) + x̂ (Σ_p dy x̂ / m_p − Σ dy x̂ / m))``, added here
    by a depthwise convolution (see :func:`affine`).  The sums over a part are that op's
    ``dβ`` and ``dγ``."""
    mean, variance, reserve3 = reserves
    outputs = [tf.raw_ops.FusedBatchNormGradV3(
        y_backprop=dy, x=x, scale=gamma, reserve_space_1=mean,
        reserve_space_2=variance, reserve_space_3=reserve3, epsilon=epsilon,
        data_format="NHWC", is_training=True)[:3] for dy, x in zip(dys, xs)]
    dgamma = tf.add_n([o[1] for o in outputs])
    dbeta = tf.add_n([o[2] for o in outputs])
    if len(xs) == 1:
        return [outputs[0][0]], dgamma, dbeta
    parts = [_count(x) for x in xs]
    count = tf.add_n(parts)
    inverse_std = tf.math.rsqrt(variance + epsilon)
    dxs = []
    for (dx, part_dgamma, part_dbeta), x, part in zip(outputs, xs, parts):
        shift = gamma * inverse_std * (part_dbeta / part - dbeta / count)
        slope = gamma * inverse_std * (part_dgamma / part - dgamma / count)
        dxs.append(dx + affine(x, slope, shift, mean, variance, epsilon, False))
    return dxs, dgamma, dbeta


def affine(x, gamma, beta, mean, variance, epsilon, relu):
    """BN of ``x`` with the given moments (and the ReLU after it) as one 1x1
    depthwise convolution with a bias, which Grappler fuses with the ReLU."""
    scale = gamma * tf.math.rsqrt(variance + epsilon)
    y = tf.nn.bias_add(tf.nn.depthwise_conv2d(
        x, tf.reshape(scale, [1, 1, x.shape[-1], 1]), [1, 1, 1, 1], "VALID"),
        beta - mean * scale)
    return tf.nn.relu(y) if relu else y

"""The looped units' work split along the batch (TensorFlow), private to
:mod:`._tf_loop`: with one thread per operation (what
``keras_identity.training.cpu_threads`` chooses for small batches on a CPU)
a unit's operations are a chain, one at a time, so the loop gives the other
cores work by splitting it along the batch: each training-mode convolution
of a whole unit (:func:`conv_parts`, :func:`convolution`), or, where BN's
batch moments can be summed over parts, whole identity units from the loop's
input to its output (:func:`batch_parts`, :func:`split`, :func:`join`).
"""

import tensorflow as tf


def conv(x, kernel):
    """``"same"`` convolution of NHWC ``x`` with an HWIO ``kernel``, stride 1."""
    return tf.nn.conv2d(x, kernel, strides=1, padding="SAME")


def conv_parts():
    """The parts a training-mode convolution of the loop is split into along
    the batch: as many as TensorFlow runs operations at once where each runs
    on one thread on a CPU (what ``keras_identity.training.cpu_threads``
    chooses for small batches), else 1.

    The forward pass is a chain of one operation at a time, so with one
    thread per operation it would keep one core busy; a convolution treats
    each example on its own, so its parts run at once on the other cores and
    their outputs, concatenated, are the whole convolution's (to rounding).
    BN, which couples the examples, stays whole.  Measured at ResNet-1001,
    batch 16, 2 cores: 7-10% more images/s; splitting the backward pass's
    convolutions too was slower (it already runs the kernel and input
    gradients at once) (docs/performance.md, "Threads per operation").
    Where the units can run in parts along the batch (:func:`batch_parts`),
    they do so instead, backward pass included.
    """
    intra = tf.config.threading.get_intra_op_parallelism_threads()
    inter = tf.config.threading.get_inter_op_parallelism_threads()
    if intra != 1 or inter < 2 or tf.config.list_physical_devices("GPU"):
        return 1
    return inter


def _conv_part(x, kernel, bias, summand):
    """``conv(x) + bias``, or with ``summand = (tensor, zero_bias)``
    ``bias_add(conv(x), bias or zero_bias) + tensor``."""
    y = conv(x, kernel)
    if summand is None:
        return y if bias is None else tf.nn.bias_add(y, bias)
    tensor, zero_bias = summand
    return tf.nn.bias_add(y, zero_bias if bias is None else bias) + tensor


def _bounds(n, parts):
    """Where ``parts`` pieces of a batch of ``n`` (a scalar tensor) begin and
    end: sizes differing by at most one."""
    return [n * i // parts for i in range(parts + 1)]


def _split_conv(x, kernel, bias, summand, parts):
    bounds = _bounds(tf.shape(x)[0], parts)
    sizes = tf.stack([b - a for a, b in zip(bounds, bounds[1:])])
    pieces = tf.split(x, sizes, axis=0)
    added = [None] * parts if summand is None else [
        (piece, summand[1]) for piece in tf.split(summand[0], sizes, axis=0)]
    return tf.concat([_conv_part(piece, kernel, bias, a) for piece, a in zip(pieces, added)],
                     axis=0)


def convolution(x, kernel, bias, parts=1, summand=None):
    """``conv(x) + bias`` (and ``summand``: see :func:`_conv_part`, fused by
    ``_tf_loop.fuse_addition``), split along the batch into ``parts``
    (:func:`conv_parts`)."""
    if parts > 1:  # whole below `parts` examples: oneDNN mis-shapes an empty batch's output
        return tf.cond(tf.shape(x)[0] >= parts,
                       lambda: _split_conv(x, kernel, bias, summand, parts),
                       lambda: _conv_part(x, kernel, bias, summand))
    return _conv_part(x, kernel, bias, summand)


def batch_parts(parts, affine_bn, addition):
    """How many parts along the batch a training loop runs its units in:
    ``parts`` (:func:`conv_parts`) where BN takes the affine form
    (:func:`._tf_batch_norm.affine_batch_norm`, whose batch moments are
    sums over the parts; with more than one part it is taken on every CPU
    with oneDNN's kernels) and the shortcut is the identity, else 1 (a whole
    unit, its convolutions split in ``parts``).

    With each operation on one thread, a whole unit's BN, ReLU, addition and
    their gradients run one at a time, and a split convolution's parts are
    concatenated before its BN: at ResNet-1001, batch 16, on the AVX2 class
    (proxy) about a third of the two cores' time was idle and a tenth was
    the concatenations.  Run in parts, every operation but BN's per-channel
    sums runs on all parts at once: 6.80 against 6.10 images/s there, and
    7.62 against 6.15 on an AVX-512 Xeon (docs/performance.md, "The AVX2
    class")."""
    return parts if parts > 1 and affine_bn and addition is None else 1


def split(x, parts, gradient=False):
    """``x`` as a list of ``parts`` pieces along the batch, sizes differing by
    at most one.  Below ``parts`` examples each piece is the whole batch
    (no piece empty: oneDNN mis-shapes an empty batch's convolution); a
    unit's BN moments over such copies are the batch's, so every copy runs
    the batch's own unit; its gradient (``gradient``: ``x`` is the output's
    gradient) goes to the first copy only, and :func:`join` sums the
    copies' input gradients."""
    if parts == 1:
        return [x]
    n = tf.shape(x)[0]
    copies = n < parts
    bounds = _bounds(n, parts)
    pieces = []
    for i in range(parts):
        start = tf.where(copies, 0, bounds[i])
        size = tf.where(copies, n, bounds[i + 1] - bounds[i])
        piece = tf.slice(x, tf.stack([start, 0, 0, 0]), tf.stack([size, -1, -1, -1]))
        piece.set_shape([None] + x.shape[1:])
        if gradient and i:
            piece = piece * tf.cast(tf.logical_not(copies), x.dtype)
        pieces.append(piece)
    return pieces


def join(xs, n, gradient=False):
    """The inverse of :func:`split` for a batch of ``n``: the output,
    or (``gradient``) the input gradient, of the units run in parts."""
    if len(xs) == 1:
        return xs[0]
    if not gradient:
        return tf.concat(xs, axis=0)[:n]
    sizes = [x.shape[0] for x in xs]
    if None not in sizes and len(set(sizes)) > 1:
        # Parts of static, unequal sizes (a stream batched with
        # drop_remainder, a batch the parts do not divide) are never copies,
        # and ``tf.add_n`` of them, even in an untaken branch, fails shape
        # inference.
        return tf.concat(xs, axis=0)
    return tf.cond(n < len(xs), lambda: tf.add_n(xs), lambda: tf.concat(xs, axis=0))

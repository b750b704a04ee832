"""Identical Residual Units as a program, looped with ``jax.lax.scan`` (JAX).

The JAX counterpart of :mod:`._tf_loop`, private to :mod:`.stack`.  Each iteration of
the scan is unit j: its ordering's program (Fig. 4) run by
:func:`keras_identity.layers.residual.orderings.run` on slice j of the stacked weights,
with the shortcut's addition (Fig. 2) that the stack builds from
:func:`keras_identity.layers.residual.shortcuts.add`.  The scanned body is traced once,
so the program XLA compiles has the size of one unit whatever the depth.

JAX differentiates the scan itself; what its forward pass keeps for the backward pass is
set by ``recompute`` through rematerialisation (``jax.checkpoint`` around the body):

* ``"none"``: no rematerialisation, every residual JAX's differentiation needs is kept;
* ``"bn_relu"``: only each unit's input and the inputs of its BNs are kept
  (``save_only_these_names``); BN, ReLU and the shortcut are recomputed from them in the
  backward pass (Chen et al. 2016), as the TensorFlow loop's ``"bn_relu"``;
* ``"unit"``: only each unit's input is kept and the backward pass runs the whole unit
  forward again.

On CPUs the body's convolutions are :func:`conv`, whose gradients are written out: the
input's gradient as a forward convolution in XLA:CPU's fast layout (NHWC input, HWIO
kernel), the kernel's as one matrix product per kernel offset, and 1x1 convolutions as
matrix products throughout.  The gradient convolutions JAX derives get other layouts
inside a loop body, which XLA:CPU compiles on its unoptimised fallback ("Falling back to
unoptimized convolution", jax-ml/jax#12868): a looped ResNet-110 then trains at a
twentieth of the unrolled net's speed.  The values the CPU loop keeps for the backward
pass are never 16-bit floats (the convolution's input as uint16 bits,
rematerialisation's in float32): XLA:CPU writes a 16-bit slice of the scan's stack of
kept values by converting the whole stack.  Elsewhere (GPU, TPU) the convolutions and
their gradients are JAX's own.
"""

import jax
import jax.numpy as jnp
from jax.ad_checkpoint import checkpoint_name
from keras import ops

from keras_identity.layers.fused_batch_normalization import fused_batch_norm
from keras_identity.layers.residual import orderings

# Gates are differentiated by JAX (no written gradient as on TensorFlow).
WRITES_GATE_GRADIENT = False
_BN_INPUT = "keras_identity_bn_input"


_LAYOUT = ("NHWC", "HWIO", "NHWC")


def _conv_nhwc(x, kernel, padding):
    return jax.lax.conv_general_dilated(x, kernel, (1, 1), padding,
                                        dimension_numbers=_LAYOUT)


def _same_padding(kernel):
    """``"same"``'s (low, high) padding of the two spatial axes."""
    return [((k - 1) // 2, k // 2) for k in kernel.shape[:2]]


def _dot_1x1(x, kernel):
    """A 1x1 convolution as the matrix product it is."""
    return jax.lax.dot_general(x, kernel[0, 0], (((3,), (0,)), ((), ())))


def _forward(x, kernel, padding):
    if kernel.shape[:2] == (1, 1):
        return _dot_1x1(x, kernel)
    return _conv_nhwc(x, kernel, padding)


def _kernel_gradient(x, dy, pads, kernel_shape):
    """dL/dk[a, b] = sum_{n,h,w} x_pad[n, h + a, w + b]^T dy[n, h, w]: one
    matrix product per kernel offset (a, b) over all examples and pixels.

    ``x_pad`` and ``dy`` (zero-padded to ``x_pad``'s height and width) are
    flattened to rows of channels; the pixel (h + a, w + b) of ``x_pad`` is
    then row ``a * width + b`` after the row of dy's pixel (h, w), so each
    offset multiplies a shifted slice of the flattened ``x_pad`` with dy.
    The rows shifted past an image's edge meet only dy's zero padding.
    XLA:CPU runs these products several times faster than the weight
    gradient written as one convolution (whose kernel is dy).
    """
    kh, kw = kernel_shape[:2]
    padded = jnp.pad(x, [(0, 0), *pads, (0, 0)])
    n, height, width, channels = padded.shape
    rows = jnp.reshape(padded, (n * height * width, channels))
    dy = jnp.pad(dy, [(0, 0), (0, height - dy.shape[1]), (0, width - dy.shape[2]), (0, 0)])
    dy = jnp.reshape(dy, (n * height * width, dy.shape[-1]))
    count = rows.shape[0] - (kh - 1) * width - (kw - 1)
    dk = [jax.lax.dot_general(rows[a * width + b:a * width + b + count], dy[:count],
                              (((0,), (0,)), ((), ())),
                              preferred_element_type=jnp.promote_types(x.dtype, jnp.float32))
          for a in range(kh) for b in range(kw)]
    return jnp.reshape(jnp.stack(dk), kernel_shape)


@jax.custom_vjp
def _cpu_conv(x, kernel):
    return _forward(x, kernel, _same_padding(kernel))


def _bits(t):
    """A 16-bit float array's bits as ``uint16``; others as they are."""
    return jax.lax.bitcast_convert_type(t, jnp.uint16) if t.dtype.itemsize == 2 else t


def _from_bits(t, dtype):
    return jax.lax.bitcast_convert_type(t, dtype) if t.dtype == jnp.uint16 else t


def _cpu_conv_forward(x, kernel):
    # The scan stacks x, one slice per unit.  XLA:CPU writes a bfloat16
    # slice by converting the whole stack to float32 and back, at every unit
    # (the looped bfloat16 ResNet-1001 spent 4.3 of its 8.4 s there); as
    # uint16 bits the slice is written in place.  The kernel is a slice of
    # the scan's stacked weights, which JAX passes to the backward pass
    # without stacking it again.
    return _cpu_conv(x, kernel), (_bits(x), kernel)


def _cpu_conv_backward(saved, dy):
    x, kernel = saved
    x = _from_bits(x, dy.dtype)
    pads = _same_padding(kernel)
    # dL/dx: dy correlated with the kernel flipped in space, its two channel
    # axes swapped (HWIO with I = the output channels).
    flipped = jnp.transpose(kernel[::-1, ::-1], (0, 1, 3, 2))
    dx = _forward(dy, flipped, [(k - 1 - low, k - 1 - high) for k, (low, high)
                                in zip(kernel.shape[:2], pads)])
    dk = _kernel_gradient(x, dy, pads, kernel.shape)
    return dx.astype(x.dtype), dk.astype(kernel.dtype)


_cpu_conv.defvjp(_cpu_conv_forward, _cpu_conv_backward)


def conv(x, kernel):
    """``"same"`` convolution of NHWC ``x`` with an HWIO ``kernel``, stride 1,
    inside the loop: on CPUs with the gradient written out (see the module)."""
    if jax.default_backend() == "cpu":
        dtype = jnp.result_type(x, kernel)  # as ops.conv
        return _cpu_conv(x.astype(dtype), kernel.astype(dtype))
    return ops.conv(x, kernel, padding="same")


def _kept(t):
    """A value that rematerialisation keeps for the backward pass: a 16-bit
    float on CPUs in float32 (exactly), because XLA:CPU writes a 16-bit
    slice of the scan's stack of kept values by converting the whole stack,
    at every unit (see ``_cpu_conv_forward``)."""
    if t.dtype.itemsize == 2 and jax.default_backend() == "cpu":
        return t.astype(jnp.float32)
    return t


def _remat(body, recompute):
    if recompute == "none":
        return body
    policy = (jax.checkpoint_policies.nothing_saveable if recompute == "unit" else
              jax.checkpoint_policies.save_only_these_names(_BN_INPUT))

    def remat_body(x, per_unit):
        dtype = x.dtype  # the unit's input is kept as _kept makes it
        checkpointed = jax.checkpoint(lambda kept, per_unit: body(kept.astype(dtype), per_unit),
                                      prevent_cse=False, policy=policy)
        return checkpointed(_kept(x), per_unit)

    return remat_body


def _scan(program, inputs, kernels, biases, bns, epsilon, addition, training, recompute):
    num_units = kernels[0].shape[0]

    def body(x, per_unit):
        j, unit_kernels, unit_biases, unit_bns, unit_addition = per_unit
        moments, added = [], []

        def weight_layer(i, t):
            y = conv(t, unit_kernels[i])
            return y if unit_biases[i] is None else y + unit_biases[i]

        def bn(i, t):
            if training:
                dtype = t.dtype
                y, m = fused_batch_norm(checkpoint_name(_kept(t), _BN_INPUT),
                                        *unit_bns[i], None, None, epsilon, True)
                moments.append(m)
                return y.astype(dtype)
            y, _ = fused_batch_norm(t, *unit_bns[i], epsilon, False)
            return y

        def add(split, f):
            if addition is None:
                return split + f
            y, m = addition.apply(j, unit_addition, split, f, training)
            added.extend(m)
            return y

        y = orderings.run(program, x, conv=weight_layer, bn=bn, add=add)
        return y, tuple(moments + added)

    xs = (ops.arange(num_units, dtype="int32"), list(kernels), list(biases),
          [tuple(ws) for ws in bns], list(addition.weights) if addition else [])
    y, stats = jax.lax.scan(_remat(body, recompute) if training else body, inputs, xs)
    return y, [tuple(m) for m in stats]


def inference_loop(program, inputs, kernels, biases, bns, epsilon, addition=None):
    """``num_units`` units of ``program`` with their moving statistics
    (``bns[i] = (gamma, beta, moving_mean, moving_variance)``, stacked)."""
    y, _ = _scan(program, inputs, kernels, biases, bns, epsilon, addition, False, "none")
    return y


def train_loop(program, inputs, kernels, biases, bns, epsilon, recompute="none",
               addition=None):
    """``num_units`` units of ``program`` in training mode (``bns[i] = (gamma,
    beta)``, stacked).  Returns the output and, per BN layer in program
    order (the addition's last), the batch mean and biased batch variance of
    every unit, shape ``(num_units, channels)``."""
    return _scan(program, inputs, kernels, biases, bns, epsilon, addition, True, recompute)

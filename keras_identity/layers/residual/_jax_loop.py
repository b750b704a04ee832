"""Identical Residual Units as a program, looped with ``jax.lax.scan`` (JAX).

The JAX counterpart of :mod:`._tf_loop`, private to :mod:`.stack`.  Each
iteration of the scan is unit j: its ordering's program (Fig. 4) run by
:func:`keras_identity.layers.residual.orderings.run` on slice j of the
stacked weights, with the shortcut's addition (Fig. 2) that the stack
builds from :func:`keras_identity.layers.residual.shortcuts.add`.  The
scanned body is traced once, so the program XLA compiles has the size of
one unit whatever the depth.

JAX differentiates the scan itself; what its forward pass keeps for the
backward pass is set by ``recompute`` through rematerialisation
(``jax.checkpoint`` around the body):

* ``"none"``: no rematerialisation, every residual JAX's differentiation
  needs is kept;
* ``"bn_relu"``: only each unit's input and the inputs of its BNs are kept
  (``save_only_these_names``); BN, ReLU and the shortcut are recomputed
  from them in the backward pass (Chen et al. 2016), as the TensorFlow
  loop's ``"bn_relu"``;
* ``"unit"``: only each unit's input is kept and the backward pass runs
  the whole unit forward again.
"""

import jax
from jax.ad_checkpoint import checkpoint_name
from keras import ops

from keras_identity.layers.fused_batch_normalization import fused_batch_norm
from keras_identity.layers.residual import orderings

# Gates are differentiated by JAX (no written gradient as on TensorFlow).
WRITES_GATE_GRADIENT = False
_BN_INPUT = "keras_identity_bn_input"


def _remat(body, recompute):
    if recompute == "none":
        return body
    if recompute == "unit":
        return jax.checkpoint(body, prevent_cse=False,
                              policy=jax.checkpoint_policies.nothing_saveable)
    return jax.checkpoint(body, prevent_cse=False,
                          policy=jax.checkpoint_policies.save_only_these_names(_BN_INPUT))


def _scan(program, inputs, kernels, biases, bns, epsilon, addition, training, recompute):
    num_units = kernels[0].shape[0]

    def body(x, per_unit):
        j, unit_kernels, unit_biases, unit_bns, unit_addition = per_unit
        moments, added = [], []

        def conv(i, t):
            y = ops.conv(t, unit_kernels[i], padding="same")
            return y if unit_biases[i] is None else y + unit_biases[i]

        def bn(i, t):
            if training:
                t = checkpoint_name(t, _BN_INPUT)
                y, m = fused_batch_norm(t, *unit_bns[i], None, None, epsilon, True)
                moments.append(m)
                return y
            y, _ = fused_batch_norm(t, *unit_bns[i], epsilon, False)
            return y

        def add(split, f):
            if addition is None:
                return split + f
            y, m = addition.apply(j, unit_addition, split, f, training)
            added.extend(m)
            return y

        y = orderings.run(program, x, conv=conv, bn=bn, add=add)
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

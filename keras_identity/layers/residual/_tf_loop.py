"""Identical Residual Units as a program, looped, with a written backward pass (TensorFlow).

Differentiating a ``tf.while_loop`` automatically makes TensorFlow build a second loop
that pops every forward intermediate from a stack, plus gradient accumulators for each
tensor the body captures; for a bottleneck unit that is about seventy captured tensors,
a second of tracing for ResNet-164 and an ``AddN`` of gradient lists in every step.  The
units of a :class:`~keras_identity.layers.ResidualStack` are made of four operations
only (convolution, bias, BatchNormalization and ReLU, joined by the shortcut addition of
Eqn. 1; BN by TensorFlow's fused op, or on the AVX2 class and wherever the units run in
parts along the batch as a depthwise convolution:
:func:`~._tf_batch_norm.affine_batch_norm`), so their backward pass is written here
directly: the forward loop stores, for unit ``j``, the tensors each operation's gradient
needs (what automatic differentiation would store), and the backward loop walks the
units from last to first applying the gradient kernels ``Conv2DBackpropInput/Filter``,
``FusedBatchNormGradV3`` and ``ReluGrad``.

A unit is described by its ordering's *program*, the list of its operations in order
(:func:`keras_identity.layers.residual.orderings.unit_program`), so one forward and one
backward interpreter serve all five orderings of Fig. 4 and the three blocks; the
forward interpreter also runs the units at inference (moving statistics).  The program's
``add`` step is the unit's shortcut (Fig. 2): a plain ``x + F`` for the identity,
otherwise the ``addition`` callable the stack builds from
:func:`keras_identity.layers.residual.shortcuts.add` with unit j's weights; its gradient
is that function's, taken by automatic differentiation of the one step inside the
backward loop (a 1x1 convolution or a gate: cheap next to F).  This module is private to
:mod:`.stack`.

What the forward loop keeps is set by ``recompute`` (:data:`RECOMPUTE`):

* ``"none"``: every tensor a gradient kernel reads (for a pre-activation bottleneck, six
  feature maps per unit: the input, the three ReLU outputs the convolutions also read,
  the inputs of BN 2 and 3);
* ``"bn_relu"``: the output of a ReLU that follows a BN is not kept; the backward pass
  recomputes ``relu(BN(x))`` from the kept BN input and batch moments just before
  differentiating it (the cheap-operation recomputation of Chen et al., 2016, "Training
  Deep Nets with Sublinear Memory Cost").  For the pre-activation bottleneck this halves
  the kept feature-map memory (the input and the inputs of BN 2 and 3, 4d + d + d
  channels per unit instead of 12d) for one BN-ReLU pass per BN;
* ``"unit"``: only each unit's input; the backward pass runs the whole unit forward
  again (one more forward pass of compute).
"""

import logging

import tensorflow as tf

from keras_identity import _cpu_kernels
from keras_identity.layers.fused_batch_normalization import fused_batch_norm
from keras_identity.layers.residual import _tf_batch_norm as tf_batch_norm
from keras_identity.layers.residual import _tf_batch_parts as batch
# Also the loop's convolution as the stack calls it (stack.py: loop.conv).
from keras_identity.layers.residual._tf_batch_parts import conv
from keras_identity.layers.residual.orderings import RELU

# Gates have their gradient written out (GateAddition).
WRITES_GATE_GRADIENT = True


def fuse_addition():
    """Whether a training-mode unit whose last convolution meets the shortcut (``conv`` then
    ``add``, as in the full pre-activation unit) writes the sum as
    ``bias_add(conv(t), b) + x``, with ``b`` zero where the convolution has no bias: on a
    CPU with TensorFlow's oneDNN kernels, which then run it as one convolution that
    accumulates into ``x`` (Grappler's Conv2D + BiasAdd + Add fusion), instead of a separate
    addition.  In bfloat16 that addition is an Eigen kernel 12x slower than float32's on an
    AVX-512 EPYC (445 against 36 µs for a 16x32x32x64 map; a 1x1 convolution and the
    addition took 320 µs, fused 141 µs), and ResNet-1001's forward pass, one operation after
    another, has 333 of them (docs/performance.md).  Elsewhere (a GPU, Eigen's CPU kernels,
    which have no such fusion) the addition stays as it is.

    The zero bias must be a tensor Grappler cannot see is zero (a constant would be folded
    away with its BiasAdd, and the fusion with it): the loop captures it from outside
    (:func:`train_loop`)."""
    return bool(_cpu_kernels.onednn_enabled()) and not tf.config.list_physical_devices("GPU")


def saved_layout(program, recompute="none", keep_addition_inputs=False, keep_gate=False):
    """Where each step keeps the tensors its gradient needs.

    Returns ``(slots, kinds)``: ``slots[k]`` are the indices of the saved tensors step ``k``
    reads in the backward pass (a convolution its input; a BN its input and three reserve
    tensors; a ReLU its output; with ``keep_addition_inputs`` the addition its two inputs,
    the unit input and F's output, for a shortcut whose gradient reads them, and with
    ``keep_gate`` a gate's output g(x)) and ``kinds[i]`` is ``"features"`` (a feature map),
    ``"statistics"`` (a BN reserve or batch moment, float32), ``"gate"`` (a gate's output,
    float32) or ``"recomputed"`` (a feature map the backward pass computes again rather than
    keeps).  A convolution or BN that directly follows a ReLU reads the ReLU's output rather
    than saving it again, and so does the addition.  With ``recompute="bn_relu"`` a ReLU
    directly after a BN is ``"recomputed"`` and that BN keeps two more slots, its batch mean
    and biased batch variance, to recompute it from.  ``recompute`` is one of ``"none"``,
    ``"bn_relu"`` and ``"unit"`` (validated by the stack).
    """
    kinds, slots = [], []

    def new(kind):
        kinds.append(kind)
        return len(kinds) - 1

    current = None  # slot holding the current tensor, if it is saved
    input_slot = None  # slot holding the unit input, if it is saved
    for k, step in enumerate(program):
        if step[0] in ("conv", "bn"):
            features = new("features") if current is None else current
            if k == 0:
                input_slot = features
            if step[0] == "conv":
                slots.append((features,))
            else:
                extra = 3
                if (recompute == "bn_relu" and k + 1 < len(program)
                        and program[k + 1] == RELU):
                    extra += 2
                slots.append((features,) + tuple(new("statistics") for _ in range(extra)))
            current = None
        elif step[0] == "relu":
            after_bn = recompute == "bn_relu" and k > 0 and program[k - 1][0] == "bn"
            current = new("recomputed" if after_bn else "features")
            slots.append((current,))
        elif keep_addition_inputs:
            if input_slot is None:
                input_slot = new("features")
            residual = current if current is not None and kinds[current] == "features" \
                else new("features")
            slots.append((input_slot, residual) + ((new("gate"),) if keep_gate else ()))
            current = None
        else:
            slots.append(())
            current = None
    return slots, kinds


def forward(program, slots, x, kernels, biases, bns, epsilon, training=True, addition=None,
            parts=1, fused_addition=None, affine_bn=False):
    """One unit.

    ``x`` is the unit's input, or a list of its parts along the batch (see
    :func:`~._tf_batch_parts.batch_parts`): each step then runs on every part, and BN takes
    its batch moments over all of them (the affine form only).  ``bns[i]`` is
    ``(gamma, beta)`` in training and ``(gamma, beta, moving_mean, moving_variance)`` at
    inference.  ``addition(x, f, training)`` returns the unit's sum of shortcut and F and
    the batch moments of the shortcut's BN, if any (``None`` adds ``x + f``; whole inputs
    only).  Returns the output (in ``x``'s form), the BN moments ``(mean, biased variance)``
    in program order then the addition's (training only) and ``{slot: tensor}``, the tensors
    the backward pass reads (for parts, ``{slot: [tensor per part]}``, a statistic as a list
    of one).  ``parts``: each convolution's split along the batch
    (:func:`~._tf_batch_parts.conv_parts`); ``fused_addition``: None, or the zero bias
    (``x``'s channels and dtype) through which a convolution followed by the identity
    shortcut's addition adds ``x`` itself (:func:`fuse_addition`); ``affine_bn``: BN (in
    training and at inference) as :func:`~._tf_batch_norm.affine_batch_norm` says, for
    float32 maps (see :func:`~._tf_batch_norm.for_loop`).
    """
    whole = not isinstance(x, (list, tuple))
    xs = [x] if whole else list(x)
    ts, moments, saved = _forward(program, slots, xs, kernels, biases, bns, epsilon, training,
                                  addition, parts, fused_addition, affine_bn)
    if whole:
        return ts[0], moments, {i: t[0] for i, t in saved.items()}
    return ts, moments, saved


def _forward(program, slots, xs, kernels, biases, bns, epsilon, training, addition, parts,
             fused_addition, affine_bn):
    """:func:`forward` on a list of parts; ``saved`` maps slots to lists."""
    saved, moments, added_moments = {}, [], []
    ts = xs
    added = rectified = False
    for k, (step, slot) in enumerate(zip(program, slots)):
        if added:  # the addition, done by the convolution before it
            added = False
            continue
        if step[0] == "conv":
            saved[slot[0]] = ts
            added = (fused_addition is not None and training and addition is None
                     and k + 1 < len(program) and program[k + 1][0] == "add"
                     and not slots[k + 1])
            ts = [batch.convolution(t, kernels[step[1]], biases[step[1]], parts,
                        (x, fused_addition) if added else None) for t, x in zip(ts, xs)]
        elif step[0] == "bn":
            # The depthwise form applies the ReLU after it (fused by Grappler).
            rectified = affine_bn and program[k + 1:k + 2] == [RELU]
            if not training:
                ts = [tf_batch_norm.affine(t, *bns[step[1]], epsilon, rectified) if affine_bn
                      else fused_batch_norm(t, *bns[step[1]], epsilon, False)[0] for t in ts]
                continue
            gamma, beta = bns[step[1]]
            saved[slot[0]] = ts
            ts, m, reserves = tf_batch_norm.train(ts, gamma, beta, epsilon, affine_bn,
                                                  rectified)
            saved.update(zip(slot[1:], [[r] for r in reserves + m]))
            moments.append(m)
        elif step[0] == "relu":
            if not rectified:  # else the BN before it applied it
                ts = [tf.nn.relu(t) for t in ts]
            rectified = False
            saved[slot[0]] = ts
        else:
            if slot:
                saved[slot[0]], saved[slot[1]] = xs, ts
            if addition is None:
                ts = [x + t for x, t in zip(xs, ts)]
            else:
                (x,), (t,) = xs, ts
                t, added_moments, kept = addition(x, t, training)
                ts = [t]
                saved.update(zip(slot[2:], [[g] for g in kept]))
    return ts, moments + list(added_moments), saved


def _recompute_bn_relu(program, slots, saved, k, bns, epsilon, after, affine_bn=False):
    """``relu(BN(x))`` of the ReLU at step ``k`` (a list of parts) from its
    BN's kept input and batch moments, not before ``after`` (the gradient
    reaching this point, a list) exists: otherwise the backward loop could
    recompute several units ahead (parallel iterations) and hold what
    ``"bn_relu"`` saved.  ``affine_bn``: as
    :func:`~._tf_batch_norm.affine_batch_norm` says."""
    bn_slot, i = slots[k - 1], program[k - 1][1]
    with tf.control_dependencies(after):
        xs = [tf.identity(x) for x in saved[bn_slot[0]]]
    (mean,), (variance,) = saved[bn_slot[4]], saved[bn_slot[5]]
    if affine_bn:
        return [tf_batch_norm.affine(x, *bns[i], mean, variance, epsilon, relu=True)
                for x in xs]
    return [tf.nn.relu(fused_batch_norm(x, *bns[i], mean, variance, epsilon, False)[0])
            for x in xs]


def backward(program, slots, saved, grad, kernels, biases, bns, epsilon,
             addition_vjp=None, affine_bn=False):
    """Gradients of one unit from its saved tensors (see :func:`forward`).

    ``grad`` is the gradient of the unit's output, or a list of its parts along the batch
    with ``saved`` as :func:`forward` returns it for parts.  A ``"recomputed"`` slot missing
    from ``saved`` is computed again from its BN's input and moments when the backward pass
    first reads it.  ``addition_vjp(dy, *kept)`` returns the gradients of the addition with
    respect to the unit input, F's output and the addition's weights from the tensors its
    slots keep (none, or the unit input and F's output, and a gate's output; whole gradients
    only).  Returns ``(dx, dkernels, dbiases, dbns, daddition)`` with ``dx`` in ``grad``'s
    form and ``dbns[i] = (dgamma, dbeta)``, lists indexed like the weights.
    """
    whole = not isinstance(grad, (list, tuple))
    if whole:
        grad, saved = [grad], {i: [t] for i, t in saved.items()}
    saved = dict(saved)
    made_by = {slot[0]: k for k, (step, slot) in enumerate(zip(program, slots))
               if step == RELU}

    def read(index, after):
        if index not in saved:
            saved[index] = _recompute_bn_relu(program, slots, saved, made_by[index], bns,
                                              epsilon, after, affine_bn)
        return saved[index]

    dkernels = [None] * len(kernels)
    dbiases = [None] * len(biases)
    dbns = [None] * len(bns)
    shortcut_grad, daddition = None, []
    for step, slot in zip(reversed(program), reversed(slots)):
        if step[0] == "conv":
            i = step[1]
            inputs = read(slot[0], grad)
            if biases[i] is not None:
                dbiases[i] = tf.add_n([tf.reduce_sum(g, axis=(0, 1, 2)) for g in grad])
            dkernels[i] = tf.add_n([tf.raw_ops.Conv2DBackpropFilter(
                input=x, filter_sizes=tf.shape(kernels[i]), out_backprop=g,
                strides=[1, 1, 1, 1], padding="SAME") for x, g in zip(inputs, grad)])
            grad = [tf.raw_ops.Conv2DBackpropInput(
                input_sizes=tf.shape(x), filter=kernels[i], out_backprop=g,
                strides=[1, 1, 1, 1], padding="SAME") for x, g in zip(inputs, grad)]
        elif step[0] == "bn":
            i = step[1]
            reserves = [saved[k][0] for k in slot[1:4]]
            grad, dgamma, dbeta = tf_batch_norm.gradient(grad, saved[slot[0]], bns[i][0],
                                                         reserves, epsilon)
            dbns[i] = (dgamma, dbeta)
        elif step[0] == "relu":
            grad = [tf.raw_ops.ReluGrad(gradients=g, features=f)
                    for g, f in zip(grad, read(slot[0], grad))]
        elif addition_vjp is None:
            shortcut_grad = grad
        else:
            dx, df, daddition = addition_vjp(
                grad[0], *[read(index, grad)[0] for index in slot])
            shortcut_grad, grad = [dx], [df]
    dx = [g + s for g, s in zip(grad, shortcut_grad)]
    return (dx[0] if whole else dx), dkernels, dbiases, dbns, daddition


def _empty_stack(dtype, capacity):
    return tf.raw_ops.EmptyTensorList(element_shape=tf.constant(-1),
                                      max_num_elements=capacity, element_dtype=dtype)


def _pop(stack, dtype, shape):
    stack, tensor = tf.raw_ops.TensorListPopBack(
        input_handle=stack, element_shape=tf.constant(-1), element_dtype=dtype)
    tensor.set_shape(shape)
    return stack, tensor


def _flatten(kernels, biases, bns):
    """Weights as one list: the kernels, the biases present, each BN's tuple."""
    return list(kernels) + [b for b in biases if b is not None] + [w for ws in bns for w in ws]


def _unflatten(values, kernels, biases, bns):
    """The inverse of :func:`_flatten` (for one unit's slices, or gradients)."""
    values = iter(values)
    return ([next(values) for _ in kernels],
            [None if b is None else next(values) for b in biases],
            [tuple(next(values) for _ in ws) for ws in bns])


def _per_unit(dtype, num_units, stacked=None, shape=None):
    """A list of ``num_units`` tensors; ``stacked`` (if given) split along axis 0.

    Reading element j has a gradient that sets element j of a list, so a
    backward pass writes each unit's weight gradient once (slicing
    ``kernel[j]`` would add a dense gradient of the whole stack in every
    iteration).
    """
    array = tf.TensorArray(dtype, size=num_units, element_shape=shape,
                           clear_after_read=False)
    return array if stacked is None else array.unstack(stacked)


class _Unit:
    """Unit j's weights read from the per-unit lists, and its addition."""

    def __init__(self, arrays, j, kernels, biases, bns, addition):
        split = len(arrays) - len(addition.weights) if addition else len(arrays)
        self.kernels, self.biases, self.bns = _unflatten(
            [a.read(j) for a in arrays[:split]], kernels, biases, bns)
        self.addition_weights = [a.read(j) for a in arrays[split:]]
        self.j, self.spec = j, addition

    def add(self, x, f, training):
        if self.spec.written:
            return self.spec.forward(self.addition_weights, x, f)
        y, moments = self.spec.apply(self.j, self.addition_weights, x, f, training)
        return y, moments, ()

    def add_vjp(self, dy, x=None, f=None, *kept):
        """The addition's gradients: written out for a gate, otherwise by
        automatic differentiation of its one step.

        The step is recomputed only once the unit's gradient ``dy`` exists:
        otherwise the backward loop would recompute several units' gates or
        projections ahead (parallel iterations) and hold them.
        """
        if self.spec.written:
            return self.spec.backward(self.addition_weights, x, f, *kept, dy)
        x = tf.zeros_like(dy) if x is None else x
        f = tf.zeros_like(dy) if f is None else f
        with tf.control_dependencies([dy]):
            x, f = tf.identity(x), tf.identity(f)
        sources = [x, f] + self.addition_weights
        with tf.GradientTape() as tape:
            tape.watch(sources)
            y, _, _ = self.add(x, f, True)
        dx, df, *dweights = tape.gradient(y, sources, output_gradients=dy,
                                          unconnected_gradients="zero")
        return dx, df, dweights

    def forward(self, program, slots, x, epsilon, training=True, parts=1,
                fused_addition=None, affine_bn=False):
        return forward(program, slots, x, self.kernels, self.biases, self.bns, epsilon,
                       training, self.add if self.spec else None, parts, fused_addition,
                       affine_bn)

    def backward(self, program, slots, saved, grad, epsilon, affine_bn=False):
        return backward(program, slots, saved, grad, self.kernels, self.biases, self.bns,
                        epsilon, self.add_vjp if self.spec else None, affine_bn)


class GateAddition:
    """The addition of a gated shortcut (Fig. 2(c), 2(d)) with its gradient
    written out: ``g = sigmoid(W_g x + b_g)`` in float32 kept for the
    backward pass, ``y = shortcut.combine(x, F, g)``, and the shortcut's
    :meth:`gated_sum_vjp` for the gradients of the sum (recomputing the gate
    and differentiating it automatically costs a third more per step)."""

    written = True
    keeps_gate = True
    needs_values = True
    num_moments = 0

    def __init__(self, shortcut, kernel, bias):
        self.shortcut, self.weights = shortcut, [kernel, bias]

    def forward(self, weights, x, f):
        g = self.shortcut.gate(x, *weights, conv)
        return self.shortcut.combine(x, f, g), [], (g,)

    def backward(self, weights, x, f, g, dy):
        kernel, _ = weights
        x32 = tf.cast(x, tf.float32)
        dh, df, dg = self.shortcut.gated_sum_vjp(x32, tf.cast(f, tf.float32), g,
                                                 tf.cast(dy, tf.float32))
        dz = tf.raw_ops.SigmoidGrad(y=g, dy=dg)
        dkernel = tf.raw_ops.Conv2DBackpropFilter(
            input=x32, filter_sizes=tf.shape(kernel), out_backprop=dz,
            strides=[1, 1, 1, 1], padding="SAME")
        dx = dh + tf.raw_ops.Conv2DBackpropInput(
            input_sizes=tf.shape(x32), filter=kernel, out_backprop=dz,
            strides=[1, 1, 1, 1], padding="SAME")
        return (tf.cast(dx, dy.dtype), tf.cast(df, dy.dtype),
                [dkernel, tf.reduce_sum(dz, axis=(0, 1, 2))])


def inference_loop(program, inputs, kernels, biases, bns, epsilon, addition=None):
    """``num_units`` units of ``program`` with their moving statistics.

    Weights as for :func:`train_loop`, with ``bns[i] = (gamma, beta,
    moving_mean, moving_variance)``; TensorFlow differentiates this loop
    automatically (for input saliency, or fine-tuning with BN frozen).
    """
    num_units = kernels[0].shape[0]
    slots, _ = saved_layout(program)
    stacked = _flatten(kernels, biases, bns) + (addition.weights if addition else [])
    weights = [_per_unit(w.dtype, num_units, w, w.shape[1:]) for w in stacked]
    affine_bn = tf_batch_norm.for_loop(inputs)

    def body(j, x):
        unit = _Unit(weights, j, kernels, biases, bns, addition)
        y, _, _ = unit.forward(program, slots, x, epsilon, training=False, affine_bn=affine_bn)
        return j + 1, y

    # tf.while_loop rather than keras.ops.fori_loop: XLA needs the trip
    # count (maximum_iterations) to differentiate the loop.
    _, y = tf.while_loop(lambda j, _: j < num_units, body, (tf.constant(0), inputs),
                         maximum_iterations=num_units)
    return y


# Whether this process has checked the kernels it trains on (see slow_kernels_notice).
_kernels_checked = False


def slow_kernels_notice():
    """Says once a process, at the first training step of a looped stage on a
    CPU, where TensorFlow trains on Eigen's kernels because it was imported
    before keras_identity (:func:`keras_identity._cpu_kernels.training_notice`:
    the line names the cost and the remedy).  Returns the line, or None."""
    global _kernels_checked
    if _kernels_checked:
        return None
    _kernels_checked = True
    if tf.config.list_physical_devices("GPU"):
        return None
    line = _cpu_kernels.training_notice()
    if line:
        logging.getLogger("keras_identity").warning(line)
    return line


def train_loop(program, inputs, kernels, biases, bns, epsilon, recompute="none",
               addition=None):
    """``num_units`` units of ``program`` over stacked weights, in training mode.

    ``kernels``, ``biases`` (entries may be ``None``) and ``bns`` (``(gamma, beta)`` pairs)
    hold one tensor per layer of the unit, stacked over units along axis 0; ``addition`` (a
    :class:`~.shortcuts.LoopAddition`, or ``None`` for ``x + F``) the unit's shortcut with
    its stacked weights.  Returns the output and, per BN layer in order (the addition's
    last), the batch mean and biased batch variance of every unit, shape
    ``(num_units, channels)`` (without gradient).  The gradient is the loop of
    :func:`backward`; ``recompute`` sets what the forward loop keeps for it (the module's
    docstring)."""
    slow_kernels_notice()
    whole_units = recompute == "unit"
    num_units = kernels[0].shape[0]
    slots, kinds = saved_layout(program, recompute,
                                keep_addition_inputs=bool(addition and addition.needs_values),
                                keep_gate=bool(addition and addition.keeps_gate))
    kept_slots = [i for i, kind in enumerate(kinds) if kind != "recomputed"]
    num_moments = len(bns) + (addition.num_moments if addition else 0)
    parts = batch.conv_parts()
    fuse = fuse_addition()
    affine_bn = tf_batch_norm.for_loop(inputs, in_parts=parts > 1 and addition is None)
    split = batch.batch_parts(parts, affine_bn, addition)
    if split > 1:  # each convolution of a part whole
        parts = 1

    @tf.custom_gradient
    def run(x, *stacked):
        weights = [_per_unit(w.dtype, num_units, w, w.shape[1:]) for w in stacked]
        # Made here and captured by the loop's body (see fuse_addition).
        zero_bias = tf.zeros(x.shape[-1:], x.dtype) if fuse else None
        # The tensors for the backward pass go on stacks that the backward
        # loop pops, freeing each unit's tensors once it is differentiated
        # (as TensorFlow's own while-loop gradient does); a feature map
        # kept in parts takes one stack per part.
        kept_kinds = ["features"] if whole_units else [kinds[i] for i in kept_slots]
        dtypes = [x.dtype if kind == "features" else tf.float32
                  for kind in kept_kinds for _ in range(split if kind == "features" else 1)]
        store = tuple(_empty_stack(dtype, num_units) for dtype in dtypes)
        shapes = {}
        stats = tuple(_per_unit(tf.float32, num_units) for _ in range(2 * num_moments))

        def body(j, xs, store, stats):
            unit = _Unit(weights, j, kernels, biases, bns, addition)
            ys, moments, saved = unit.forward(program, slots, xs, epsilon, parts=parts,
                                              fused_addition=zero_bias, affine_bn=affine_bn)
            kept = list(xs) if whole_units else [t for i in kept_slots for t in saved[i]]
            shapes.update(enumerate(t.shape for t in kept))
            store = tuple(tf.raw_ops.TensorListPushBack(input_handle=s, tensor=t)
                          for s, t in zip(store, kept))
            moments = [m for pair in moments for m in pair]
            stats = tuple(a.write(j, m) for a, m in zip(stats, moments))
            return j + 1, ys, store, stats

        _, ys, store, stats = tf.while_loop(
            lambda j, *_: j < num_units, body,
            (tf.constant(0), batch.split(x, split), store, stats),
            maximum_iterations=num_units)

        def grad(dy, *unused_stat_grads):
            grads = tuple(_per_unit(w.dtype, num_units, shape=w.shape[1:]) for w in stacked)

            def back(k, gs, store, grads):
                j = num_units - 1 - k
                popped = [_pop(s, dtype, shapes[i])
                          for i, (s, dtype) in enumerate(zip(store, dtypes))]
                store = tuple(s for s, _ in popped)
                kept = iter(t for _, t in popped)
                unit = _Unit(weights, j, kernels, biases, bns, addition)
                if whole_units:
                    # Not before the unit's gradient arrives: otherwise the
                    # loop would run several units' forward passes ahead
                    # (parallel iterations) and hold their activations.
                    with tf.control_dependencies(gs):
                        unit_input = [tf.identity(t) for t in kept]
                    _, _, saved = unit.forward(program, slots, unit_input, epsilon,
                                               affine_bn=affine_bn)
                else:
                    saved = {i: [next(kept) for _ in range(
                        split if kinds[i] == "features" else 1)] for i in kept_slots}
                dxs, dkernels, dbiases, dbns, dadd = unit.backward(
                    program, slots, saved, gs, epsilon, affine_bn)
                flat = _flatten(dkernels, dbiases, dbns) + list(dadd)
                return k + 1, dxs, store, tuple(a.write(j, d) for a, d in zip(grads, flat))

            _, dxs, _, grads = tf.while_loop(
                lambda k, *_: k < num_units, back,
                (tf.constant(0), batch.split(dy, split, gradient=True), store, grads),
                maximum_iterations=num_units)
            return (batch.join(dxs, tf.shape(dy)[0], gradient=True),
                    *[a.stack() for a in grads])

        return (batch.join(ys, tf.shape(x)[0]), *[a.stack() for a in stats]), grad

    # Tensors, not variables: the custom gradient is with respect to its inputs.
    stacked = [tf.convert_to_tensor(w) for w in _flatten(kernels, biases, bns)]
    if addition is not None:
        stacked += [tf.convert_to_tensor(w) for w in addition.weights]
    y, *stats = run(inputs, *stacked)
    return y, [tuple(stats[2 * i:2 * i + 2]) for i in range(num_moments)]

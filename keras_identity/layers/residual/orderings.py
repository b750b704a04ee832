"""Fig. 4 (a)-(e): where BN and ReLU sit around the weight layers and the addition.

Each ordering is defined once, by :func:`unit_program`: the list of a unit's
operations in order.  Entries are ``("conv", i)`` (weight layer i of the
block), ``("bn", i)``, ``("relu",)``, ``("split",)`` and ``("add",)``: the
steps before ``add`` compute the residual branch F, ``add`` forms Eqn. (1)'s
``h(x_l) + F(x_l)`` with the unit's shortcut (Fig. 2), the steps after it
are the after-addition function f.  The shortcut reads the unit input, or
the tensor at ``split`` when there is one (a pre-activation shared by both
branches).

Every form of a unit runs these programs: :class:`ResidualUnit` through
:func:`run` with its sub-layers, :class:`ResidualStack` through the same
:func:`run` at inference and in its JAX scan, and its TensorFlow loop (with
the written-out gradient) in training.

====================== =========================================== ==========
ordering               F, per weight layer                          f
====================== =========================================== ==========
original (a)           conv-BN-ReLU ... conv-BN                     ReLU
bn_after_addition (b)  conv-BN-ReLU ... conv                        BN, ReLU
relu_before_add. (c)   conv-BN-ReLU ... conv-BN-ReLU                identity
relu_only_preact. (d)  ReLU-conv-BN ... ReLU-conv-BN                identity
full_preactivation (e) BN-ReLU-conv ... BN-ReLU-conv                identity
====================== =========================================== ==========
"""

from keras import ops

UNITS = (
    "original",                 # Fig. 4(a)
    "bn_after_addition",        # Fig. 4(b)
    "relu_before_addition",     # Fig. 4(c)
    "relu_only_preactivation",  # Fig. 4(d)
    "full_preactivation",       # Fig. 4(e)
)
FIGURE = dict(zip(UNITS, ("Fig. 4(a)", "Fig. 4(b)", "Fig. 4(c)", "Fig. 4(d)", "Fig. 4(e)")))
PREACTIVATION_UNITS = ("relu_only_preactivation", "full_preactivation")
# The appendix's activation rules for the first unit of a stage (see
# ResidualUnit): its pre-activation inside F, shared by both branches, or none.
PREACTIVATION_MODES = ("residual", "shared", "none")
# Index of the BN of the last unit's post-activation (``post_activation``).
POST = "post"

ADD = ("add",)
RELU = ("relu",)
SPLIT = ("split",)


def conv(i):
    return ("conv", i)


def bn(i):
    return ("bn", i)


def unit_program(unit, num_layers, preactivation="residual", post_activation=False):
    """The operations of one unit of ordering ``unit`` (Fig. 4) in order.

    ``preactivation`` and ``post_activation`` are the first/last-unit rules
    of the pre-activation orderings (d) and (e): ``"shared"`` moves the
    first activation before a ``split`` (both branches read it), ``"none"``
    leaves it out, ``post_activation`` adds the activation after the
    addition (BN ``POST`` then ReLU for (e), ReLU for (d)).
    """
    last = num_layers - 1
    program = []
    for i in range(num_layers):
        if unit == "full_preactivation":
            if i > 0 or preactivation == "residual":
                program += [bn(i), RELU]
            elif preactivation == "shared":
                program += [bn(i), RELU, SPLIT]
            program.append(conv(i))
        elif unit == "relu_only_preactivation":
            if i > 0 or preactivation == "residual":
                program.append(RELU)
            elif preactivation == "shared":
                program += [RELU, SPLIT]
            program += [conv(i), bn(i)]
        else:
            program.append(conv(i))
            if unit == "bn_after_addition" and i == last:
                break
            program.append(bn(i))
            if i < last or unit == "relu_before_addition":
                program.append(RELU)
    program.append(ADD)
    if unit == "original":
        program.append(RELU)
    elif unit == "bn_after_addition":
        program += [bn(last), RELU]
    elif post_activation and unit == "full_preactivation":
        program += [bn(POST), RELU]
    elif post_activation:
        program.append(RELU)
    return program


def bn_channels(program, layers, in_channels):
    """``{bn index: channels}`` of a program's BNs, in program order.

    A BN normalises the tensor it meets: the unit input, or the output of the
    last weight layer before it (``layers`` as :func:`blocks.weight_layers`).
    """
    channels, current = {}, in_channels
    for step in program:
        if step[0] == "conv":
            current = layers[step[1]].out_channels
        elif step[0] == "bn":
            channels[step[1]] = current
        elif step == ADD:
            current = layers[-1].out_channels
    return channels


def run(program, x, *, conv, bn, add):
    """Runs ``program`` on ``x``.

    ``conv(i, t)`` and ``bn(i, t)`` apply weight layer / BN ``i`` and
    ``add(split, f)`` is the unit's shortcut and addition (the unit input or
    the tensor at ``split``, and F's output); each form of the unit supplies
    its own (Keras sub-layers, stacked weights of unit j, ...).
    """
    t = split = x
    for step in program:
        kind = step[0]
        if kind == "conv":
            t = conv(step[1], t)
        elif kind == "bn":
            t = bn(step[1], t)
        elif kind == "relu":
            t = ops.relu(t)
        elif kind == "split":
            split = t
        else:
            t = add(split, t)
    return t

"""Argument validation shared by layers and model builders.

Every check raises a ``ValueError`` that names the argument, the value it
got and what is allowed, so that bad input never surfaces as a shape error
from deep inside TensorFlow.
"""

import math


def check_choice(name, value, allowed):
    """Returns ``value`` if it is one of ``allowed``, else raises."""
    if value not in allowed:
        choices = ", ".join(repr(a) for a in allowed)
        raise ValueError(f"{name}={value!r} is not valid; expected one of: {choices}.")
    return value


def check_range(name, value, low=None, high=None, low_inclusive=True,
                high_inclusive=True):
    """Returns ``float(value)`` if it lies in the given interval, else raises."""
    try:
        number = float(value)
    except (TypeError, ValueError):
        raise ValueError(f"{name}={value!r} is not valid; expected a number.") from None
    ok = math.isfinite(number)
    if ok and low is not None:
        ok = number >= low if low_inclusive else number > low
    if ok and high is not None:
        ok = number <= high if high_inclusive else number < high
    if not ok:
        left = "[" if low_inclusive else "("
        right = "]" if high_inclusive else ")"
        lo = "-inf" if low is None else low
        hi = "inf" if high is None else high
        raise ValueError(f"{name}={value!r} is not valid; expected a finite number "
                         f"in {left}{lo}, {hi}{right}.")
    return number


def check_positive_int(name, value, minimum=1):
    """Returns ``int(value)`` if it is an integer >= ``minimum``, else raises."""
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"{name}={value!r} is not valid; expected an integer >= {minimum}.")
    return value


def check_rank(layer_name, input_shape, ranks, layout):
    """Raises if ``input_shape`` does not have one of ``ranks`` dimensions."""
    shape = tuple(input_shape)
    if len(shape) not in ranks:
        raise ValueError(
            f"{layer_name} expects a {' or '.join(f'{r}-D' for r in ranks)} input "
            f"{layout}; got an input of shape {shape}.")
    if shape[-1] is None:
        raise ValueError(f"{layer_name} needs the last (channel) dimension of its input "
                         f"to be known; got an input of shape {shape}.")
    return shape

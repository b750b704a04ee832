"""The cases of the tests that compare two forms of a network (looped against
unrolled, TensorFlow against JAX) over the papers' variants."""

from keras_identity.layers import BLOCKS
from keras_identity.layers import SHORTCUTS
from keras_identity.layers import UNITS

# Every Fig. 4 ordering with every Fig. 2 shortcut, the block turning with
# both, so that each (ordering, block) and (shortcut, block) pair is met as
# well: 30 cases that meet every pair of the 90 combinations.
ORDERING_SHORTCUT_BLOCK = [(unit, shortcut, BLOCKS[(i + j) % len(BLOCKS)])
                           for i, unit in enumerate(UNITS)
                           for j, shortcut in enumerate(SHORTCUTS)]


def pairs(cases):
    """The pairs of values the (ordering, shortcut, block) cases meet."""
    return {pair for a, b, c in cases for pair in ((a, b), (a, c), (b, c))}

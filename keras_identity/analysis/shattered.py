"""Shattered gradients (Balduzzi et al. 2017, in the lecture notes).

The gradient ``df/dx`` of a network with a one-dimensional input, over a grid
of 256 inputs in [-2, 2], resembles brown noise for shallow nets and white
noise for deep feed-forward nets; residual nets keep it correlated, and so
does a feedforward CReLU net with the looks-linear initialisation (linear at
initialisation, its gradient is constant).  The autocorrelation of that
gradient sequence measures it.
"""

import keras
import numpy as np
from keras_identity.analysis import _autodiff


def feedforward_1d(depth, width=200, residual=False, seed=0, looks_linear=False):
    """A rectifier net from R to R with ``depth`` hidden blocks of ``width`` units.

    Plain: each block is Dense-BN-ReLU.  Residual: each block adds
    Dense(ReLU(BN(x))) to its input (a pre-activation unit with one layer).
    He initialisation throughout.  ``looks_linear``: Balduzzi et al.'s cure
    without skip connections, each block CReLU-Dense with a
    :class:`~keras_identity.initializers.LooksLinear` kernel (no BN; an
    orthogonal first layer), so the net is linear at initialisation.
    """
    from keras_identity.initializers import LooksLinear
    from keras_identity.layers.crelu import CReLU

    if residual and looks_linear:
        raise ValueError("residual and looks_linear are exclusive: the looks-linear net is "
                         "the feedforward cure (no skip connections).")
    init = keras.initializers.HeNormal(seed=seed)
    inputs = keras.Input((1,))
    if looks_linear:
        generator = keras.random.SeedGenerator(seed)
        x = keras.layers.Dense(width, kernel_initializer=keras.initializers.Orthogonal(
            seed=seed))(inputs)
        for _ in range(depth):
            x = keras.layers.Dense(width, kernel_initializer=LooksLinear(generator))(
                CReLU()(x))
        outputs = keras.layers.Dense(1, kernel_initializer=LooksLinear(generator))(CReLU()(x))
        return keras.Model(inputs, outputs, name=f"looks_linear{depth}")
    x = keras.layers.Dense(width, kernel_initializer=init)(inputs)
    for i in range(depth):
        if residual:
            h = keras.layers.ReLU()(keras.layers.BatchNormalization()(x))
            h = keras.layers.Dense(width, kernel_initializer=keras.initializers.HeNormal(
                seed=seed + i + 1))(h)
            x = keras.layers.Add()([x, h])
        else:
            x = keras.layers.Dense(width, kernel_initializer=keras.initializers.HeNormal(
                seed=seed + i + 1))(x)
            x = keras.layers.ReLU()(keras.layers.BatchNormalization()(x))
    if residual:
        x = keras.layers.ReLU()(keras.layers.BatchNormalization()(x))
    outputs = keras.layers.Dense(1, kernel_initializer=init)(x)
    return keras.Model(inputs, outputs, name=f"{'residual' if residual else 'plain'}{depth}")


def input_gradients(model, grid=None):
    """``df/dx`` at every point of ``grid`` (default: 256 points in [-2, 2]).

    BN uses batch statistics over the grid (training mode), as in the paper's
    networks at initialisation.
    """
    grid = np.linspace(-2.0, 2.0, 256) if grid is None else np.asarray(grid)
    x = grid.reshape(-1, 1).astype("float32")
    return _autodiff.input_gradient(lambda t: model(t, training=True), x).reshape(-1)


def autocorrelation(values, max_lag=20):
    """Normalised autocorrelation at lags 0..max_lag."""
    centred = np.asarray(values, np.float64) - np.mean(values)
    variance = np.sum(centred ** 2)
    if variance == 0:
        return np.ones(max_lag + 1)
    return np.array([np.sum(centred[:len(centred) - k] * centred[k:]) / variance
                     for k in range(max_lag + 1)])


KINDS = ("plain", "residual", "looks_linear")


def shattering_study(depths=(1, 2, 4, 8, 16, 32, 50), width=200, seeds=(0, 1, 2)):
    """Lag-1 gradient autocorrelation of plain, residual and looks-linear CReLU
    nets, per depth.

    Returns rows ``{"depth", "plain", "residual", "looks_linear"}`` (means over
    ``seeds``) and the autocorrelation curves of the deepest nets.
    """
    rows, curves = [], {}
    for depth in depths:
        row = {"depth": depth}
        for kind in KINDS:
            lag1 = []
            for seed in seeds:
                model = feedforward_1d(depth, width, residual=kind == "residual", seed=seed,
                                       looks_linear=kind == "looks_linear")
                acf = autocorrelation(input_gradients(model))
                lag1.append(acf[1])
                if depth == max(depths) and seed == seeds[0]:
                    curves[f"{kind.replace('_', '-')} {depth}"] = acf
            row[kind] = float(np.mean(lag1))
        rows.append(row)
    return rows, curves

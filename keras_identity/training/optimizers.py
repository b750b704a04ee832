"""SGD with momentum and weight decay exactly as the authors' Torch code.

Torch's ``optim.sgd`` (used by resnet-1k-layers and fb.resnet.torch) adds the
weight decay to the gradient *before* the momentum update, for every
parameter (BN's gamma and beta included):

    g <- g + wd * w;   v <- mu * v + g;   w <- w - lr * v

This "coupled" decay equals an L2 penalty ``wd/2 * ||w||^2`` in the loss.
Keras's own ``SGD(weight_decay=...)`` applies decoupled decay
(``w <- w - lr * wd * w``) that bypasses the momentum, which with
momentum 0.9 regularises about ten times less than the papers did.
"""

import keras
from keras import ops


@keras.saving.register_keras_serializable(package="keras_identity")
class MomentumSGD(keras.optimizers.Optimizer):
    """SGD with (Nesterov) momentum and coupled weight decay, Torch semantics.

    Args:
        learning_rate: float or ``LearningRateSchedule``.
        momentum: mu.
        nesterov: use Nesterov momentum (``w <- w - lr * (g + mu * v)``).
        coupled_weight_decay: wd, added to every gradient as ``wd * w``.
        decay_batch_norm: also decay BN gamma/beta and biases (Torch: yes).
    """

    def __init__(self, learning_rate=0.1, momentum=0.9, nesterov=False,
                 coupled_weight_decay=0.0, decay_batch_norm=True, name="momentum_sgd",
                 **kwargs):
        super().__init__(learning_rate=learning_rate, name=name, **kwargs)
        if not 0.0 <= momentum < 1.0:
            raise ValueError(f"momentum={momentum!r} is not valid; expected a number in "
                             f"[0, 1).")
        if coupled_weight_decay < 0.0:
            raise ValueError(f"coupled_weight_decay={coupled_weight_decay!r} is not valid; "
                             f"expected a number >= 0.")
        self.momentum = float(momentum)
        self.nesterov = bool(nesterov)
        self.coupled_weight_decay = float(coupled_weight_decay)
        self.decay_batch_norm = bool(decay_batch_norm)

    def build(self, variables):
        if self.built:
            return
        super().build(variables)
        self.velocities = [self.add_variable_from_reference(v, "velocity") for v in variables]
        self._decayed = [self._should_decay(v) for v in variables]

    def _should_decay(self, variable):
        if self.coupled_weight_decay == 0.0:
            return False
        if self.decay_batch_norm:
            return True
        return variable.path.endswith("kernel")

    def update_step(self, gradient, variable, learning_rate):
        index = self._get_variable_index(variable)
        lr = ops.cast(learning_rate, variable.dtype)
        g = ops.cast(gradient, variable.dtype)
        if self._decayed[index]:
            g = g + ops.cast(self.coupled_weight_decay, variable.dtype) * variable
        v = self.velocities[index]
        self.assign(v, ops.cast(self.momentum, variable.dtype) * v + g)
        step = g + ops.cast(self.momentum, variable.dtype) * v if self.nesterov else v
        self.assign_sub(variable, lr * step)

    def get_config(self):
        config = super().get_config()
        config.update(momentum=self.momentum, nesterov=self.nesterov,
                      coupled_weight_decay=self.coupled_weight_decay,
                      decay_batch_norm=self.decay_batch_norm)
        return config

"""Probe of the 100-layer highway net on MNIST (see
docs/results/highway_depth_study_mnist.md, "Findings").

Trains ``highway_net(100)`` for two epochs with a few activations, gate
biases, learning rates and gradient clipping, and prints one line per run.

    python -m experiments.highway100_probe
"""

import time

from absl import app
from absl import flags

# keras_identity before Keras: it chooses TensorFlow's CPU kernels (for
# training) before Keras imports TensorFlow.
import keras_identity as ki
from keras_identity.data.datasets import load_dataset
import keras  # noqa: I100

FLAGS = flags.FLAGS
flags.DEFINE_integer("epochs", 2, "Epochs per run.")
flags.DEFINE_integer("seed", 0, "Seed.")

# (activation of H, transform gate bias, learning rate, clipnorm)
RUNS = (("relu", -3.0, 0.01, 1.0), ("relu", -3.0, 0.1, 1.0),
        ("tanh", -3.0, 0.1, None), ("relu", -2.0, 0.01, 1.0))


def main(argv):
    del argv
    data = load_dataset("mnist")
    x_train, y_train = data.x_train.astype("float32") / 255.0, data.y_train
    x_test, y_test = data.x_test.astype("float32") / 255.0, data.y_test
    for activation, bias, lr, clipnorm in RUNS:
        keras.utils.set_random_seed(FLAGS.seed)
        model = ki.models.highway_net(100, activation=activation, transform_bias_init=bias)
        model.compile(keras.optimizers.SGD(lr, momentum=0.9, clipnorm=clipnorm),
                      loss="sparse_categorical_crossentropy", metrics=["accuracy"])
        start = time.time()
        history = model.fit(x_train, y_train, batch_size=128, epochs=FLAGS.epochs, verbose=2,
                            callbacks=[keras.callbacks.TerminateOnNaN()])
        _, accuracy = model.evaluate(x_test, y_test, verbose=0)
        losses = " / ".join(f"{v:.4g}" for v in history.history["loss"])
        print(f"H={activation} b_T={bias} lr={lr} clipnorm={clipnorm}: loss {losses}, "
              f"test error {100 * (1 - accuracy):.2f}%, {time.time() - start:.0f}s", flush=True)


def run():
    app.run(main)


if __name__ == "__main__":
    run()

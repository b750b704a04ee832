"""``python -m experiments.train``: the program's code is in keras_identity_cli/train.py.

Installed, it is the console command ``keras-identity-train`` (or ``python -m
keras_identity_cli.train``); this wrapper keeps the repository's old module path.
"""

from keras_identity_cli.train import run

if __name__ == "__main__":
    run()

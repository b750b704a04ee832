"""``python -m experiments.tune``: the program's code is in keras_identity_cli/tune.py.

Installed, it is the console command ``keras-identity-tune`` (or ``python -m
keras_identity_cli.tune``); this wrapper keeps the repository's old module path.
"""

from keras_identity_cli.tune import run

if __name__ == "__main__":
    run()

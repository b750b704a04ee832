"""``python -m export.export_saved_model``: the program's code is in keras_identity_cli/export.py.

Installed, it is the console command ``keras-identity-export`` (or ``python -m
keras_identity_cli.export``); this wrapper keeps the repository's old module path.
"""

from keras_identity_cli.export import run

if __name__ == "__main__":
    run()

"""``python -m export.serve_local``: the program's code is in keras_identity_cli/serve.py.

Installed, it is the console command ``keras-identity-serve`` (or ``python -m
keras_identity_cli.serve``); this wrapper keeps the repository's old module path.
"""

from keras_identity_cli.serve import run

if __name__ == "__main__":
    run()

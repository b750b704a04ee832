"""The command-line programs of keras_identity, installed as console commands.

    keras-identity-train   (python -m keras_identity_cli.train)
    keras-identity-tune    (python -m keras_identity_cli.tune)
    keras-identity-export  (python -m keras_identity_cli.export)
    keras-identity-serve   (python -m keras_identity_cli.serve)

This is a top-level package of its own, not ``keras_identity.cli``: the
programs read ``--backend`` from the command line and set ``KERAS_BACKEND``
before Keras is imported (the backend is fixed at Keras's first import), and
importing any ``keras_identity.*`` module runs ``keras_identity/__init__.py``,
which imports Keras.  Nothing in this package imports keras_identity or Keras
at module level before ``_common.select_backend()`` has run.
"""

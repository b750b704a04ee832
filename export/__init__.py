"""Export and serving programs: ``python -m export.<name>`` from the repository root.

export_saved_model and serve_local are wrappers of the installed programs in
keras_identity_cli (the console commands keras-identity-export and
keras-identity-serve)."""

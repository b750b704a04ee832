"""Research programs: ``python -m experiments.<name>`` from the repository root.

train and tune are wrappers of the installed programs in keras_identity_cli
(the console commands keras-identity-train and keras-identity-tune)."""

"""Shared pieces of the command-line programs; the code is in keras_identity_cli/_common.py
(and :func:`require_at_least`, the experiment programs' own, here).

The research scripts of experiments/ (and benchmarks/) import them from here.
"""

from keras_identity_cli._common import BACKENDS
from keras_identity_cli._common import config_from_flags
from keras_identity_cli._common import define_backend_flag
from keras_identity_cli._common import define_config_flags
from keras_identity_cli._common import define_model_flags
from keras_identity_cli._common import fail
from keras_identity_cli._common import model_kwargs_from_flags
from keras_identity_cli._common import one_line_flags_parser
from keras_identity_cli._common import select_backend
from keras_identity_cli._common import tuners



def require_at_least(flag_values, names, minimum):
    """Exits with status 2 and one line naming the first flag of ``names``
    (in ``flag_values``, a program's ``absl.flags.FLAGS``) below ``minimum``."""
    for name in names:
        value = flag_values[name].value
        if value < minimum:
            fail(f"--{name}={value} is not valid; expected >= {minimum}", 2)


__all__ = [
    "BACKENDS",
    "config_from_flags",
    "define_backend_flag",
    "define_config_flags",
    "define_model_flags",
    "fail",
    "model_kwargs_from_flags",
    "one_line_flags_parser",
    "require_at_least",
    "select_backend",
    "tuners",
]

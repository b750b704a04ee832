"""Shared pieces of the command-line programs."""

import sys

from absl import flags


def one_line_flags_parser(argv):
    """absl flag parsing that reports a bad flag in one line and exits with 2."""
    try:
        remaining = flags.FLAGS(argv)
    except flags.Error as error:
        print(f"error: {error}", file=sys.stderr)
        sys.exit(2)
    if not flags.FLAGS["verbosity"].present:  # TensorFlow's INFO logs drown the progress
        from absl import logging

        logging.set_verbosity(logging.WARNING)
    return remaining


def fail(message, code=1):
    """Prints ``error: <message>`` (one line) to stderr and exits."""
    print(f"error: {' '.join(str(message).split())}", file=sys.stderr)
    sys.exit(code)

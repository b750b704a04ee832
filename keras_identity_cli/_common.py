"""Shared pieces of the command-line programs (and of the research scripts in
the repository's experiments/, through experiments._cli)."""

import os
import sys

from absl import flags

BACKENDS = ("tensorflow", "jax")

# TensorFlow's INFO lines (the CPU features it was built for, that its oneDNN
# kernels are on) are not the programs' to show: a program's first line is its
# own, a refused flag one line.  TF_CPP_MIN_LOG_LEVEL=0 shows them again.
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "1")


def _backend_from_argv(argv):
    for i, arg in enumerate(argv):
        if arg.startswith("--backend="):
            return arg.split("=", 1)[1]
        if arg == "--backend":
            return argv[i + 1] if i + 1 < len(argv) else ""
    return None


def select_backend(argv=None):
    """Sets ``KERAS_BACKEND`` from ``--backend`` before Keras is imported.

    The Keras backend is fixed when Keras is first imported, before absl
    parses the flags, so the programs read ``--backend`` from the command
    line first (this module is imported before keras_identity; see the
    package docstring).
    """
    value = _backend_from_argv(sys.argv[1:] if argv is None else argv)
    if value is None:
        return
    if value not in BACKENDS:
        fail(f"--backend={value!r} is not valid; expected one of: "
             f"{', '.join(BACKENDS)}", 2)
    if value == "tensorflow":
        import importlib.util

        if importlib.util.find_spec("tensorflow") is None:
            fail("--backend=tensorflow needs TensorFlow, which is not installed: pip install "
                 "'keras_identity[cpu]' (or [gpu]); or use --backend=jax", 2)
    if "keras" in sys.modules:
        current = sys.modules["keras"].backend.backend()
        if current != value:
            fail(f"--backend={value} cannot be chosen: Keras is already imported with the "
                 f"{current} backend in this process (run the program in a new process, or "
                 f"set KERAS_BACKEND={value})", 2)
    os.environ["KERAS_BACKEND"] = value


def define_backend_flag():
    flags.DEFINE_enum("backend", None, list(BACKENDS),
                      "Keras backend (default: KERAS_BACKEND, else tensorflow, or jax where "
                      "TensorFlow is not installed). JAX runs keras.distribution.DataParallel "
                      "over every process's devices.")


def define_process_flags():
    """The flags of one JAX run across processes (``jax.distributed``)."""
    flags.DEFINE_string("coordinator_address", None, "JAX, one run across processes: "
                        "HOST:PORT where process 0 serves the coordinator (every process "
                        "runs the same command with its own --process_id). None of the "
                        "three flags: a Cloud TPU slice's or SLURM's own detection.")
    flags.DEFINE_integer("num_processes", None, "JAX: the number of processes of the run.")
    flags.DEFINE_integer("process_id", None, "JAX: this process's index in [0, "
                         "num_processes).")
    flags.DEFINE_float("initialization_timeout_s", processes_timeout(), "JAX, one run across "
                       "processes: how long the processes wait for each other at start; "
                       "then one line names those that did not come (exit status 1).")


def processes_timeout():
    from keras_identity.training import processes

    return processes.INITIALIZATION_TIMEOUT_S


def initialize_processes():
    """Connects the processes of a JAX run (the process flags); returns their
    number.  The flags are refused on TensorFlow, whose workers are
    described by TF_CONFIG."""
    import keras

    from keras_identity.training import processes

    given = [name for name in ("coordinator_address", "num_processes", "process_id")
             if flags.FLAGS[name].value is not None]
    given += ["initialization_timeout_s"] * flags.FLAGS["initialization_timeout_s"].present
    if keras.backend.backend() != "jax":
        if given:
            fail(f"--{', --'.join(given)} apply to the JAX backend (--backend=jax); "
                 f"TensorFlow's workers: --strategy=multi_worker with TF_CONFIG", 2)
        return 1
    try:
        timeout = processes.check_timeout(flags.FLAGS.initialization_timeout_s)
    except ValueError as error:
        fail(error, 2)
    try:
        return processes.initialize(flags.FLAGS.coordinator_address, flags.FLAGS.num_processes,
                                    flags.FLAGS.process_id, timeout_s=timeout)
    except processes.PeersMissing as error:
        fail(error, 1, at_once=True)
    except ValueError as error:
        fail(error, 2)


def require_tensorflow(what):
    """Exits with one line naming the install unless TensorFlow is installed."""
    from keras_identity import _tensorflow

    try:
        _tensorflow.require(what)
    except ImportError as error:
        fail(error)


def run_program(main, module_name, stop_signals=False):
    """``app.run(main)`` for the program defined in ``module_name``.

    absl's ``--helpshort`` lists the flags of the module that runs as the
    program (``sys.argv[0]``): the console script or a wrapper, not the
    module that defines the flags, so they are made key flags of it too.

    ``stop_signals``: a program that trains (train, tune): a stop signal
    (SIGTERM, SIGINT, ``--stop_signal``) that arrives while it starts (or
    after its training loop ended), where the loop's own handler is not in
    place, ends it with the documented line and status 75, as inside the
    loop; nothing new is lost, as nothing was trained since the last
    checkpoint.
    """
    from absl import app

    for module in (module_name, __name__):  # the program's flags and the shared ones
        for flag in flags.FLAGS.get_key_flags_for_module(module):
            flags.FLAGS.register_key_flag_for_module(sys.argv[0], flag)
    app.run(_outside_the_loop(main) if stop_signals else main,
            flags_parser=one_line_flags_parser)


class _StopOutsideTheLoop(BaseException):
    """A stop signal outside the training loop (raised by its handler)."""


_pending_stop = []  # the stop signal that arrived while the program was importing


def _stop_signal_names(argv):
    """SIGTERM, SIGINT and the ``--stop_signal`` on the command line (read
    before absl parses it; an unknown name is left to the flag's check)."""
    import signal

    names = ["SIGTERM", "SIGINT"]
    for i, arg in enumerate(argv):
        value = (arg.split("=", 1)[1] if arg.startswith("--stop_signal=") else
                 argv[i + 1] if arg == "--stop_signal" and i + 1 < len(argv) else None)
        if value:
            names.append("SIG" + value.upper().strip().removeprefix("SIG"))
    return [getattr(signal, name) for name in names if name in signal.Signals.__members__]


def stop_signals_while_starting():
    """Called first by a program that trains (train, tune), before it imports
    Keras: a stop signal that arrives while the libraries load is remembered
    (raising then can crash TensorFlow's import) and answered as soon as the
    program's ``main`` starts (:func:`run_program`); a second one exits at
    once with 128 + its number, as inside the training loop."""
    import signal

    def remember(number, frame):
        if _pending_stop:
            os._exit(128 + number)
        _pending_stop.append(signal.Signals(number).name)

    for number in _stop_signal_names(sys.argv[1:]):
        signal.signal(number, remember)


def _outside_the_loop(main):
    import signal

    def raise_stop(number, frame):
        raise _StopOutsideTheLoop(signal.Signals(number).name)

    def wrapped(argv):
        try:
            if _pending_stop:
                raise _StopOutsideTheLoop(_pending_stop[0])
            for number in _stop_signal_names(sys.argv[1:]):
                signal.signal(number, raise_stop)
            return main(argv)
        except _StopOutsideTheLoop as stop:
            print(f"stopped by {stop} outside the training loop (starting or ending): nothing "
                  f"was trained since the last checkpoint, which is intact; run the same "
                  f"command to resume (exit status {os.EX_TEMPFAIL})", file=sys.stderr,
                  flush=True)
            if "jax" in sys.modules and sys.modules["jax"].process_count() > 1:
                sys.stdout.flush()  # without JAX's shutdown barrier (see fail)
                os._exit(os.EX_TEMPFAIL)
            sys.exit(os.EX_TEMPFAIL)

    return wrapped


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


def fail(message, code=1, *, at_once=False):
    """Prints ``error: <message>`` (one line) to stderr and exits.

    ``at_once``: for a process of a multi-process JAX run, exit without JAX's
    shutdown barrier (which would wait for a lost process and then abort with
    a stack trace).
    """
    print(f"error: {' '.join(str(message).split())}", file=sys.stderr, flush=True)
    orbax = sys.modules.get("keras_identity.training.orbax_checkpoints")
    if orbax is not None and orbax.abandoned_writes():
        at_once = True  # Orbax's threads, held by a stalled store, would never let it exit
    if at_once:
        sys.stdout.flush()
        os._exit(code)
    sys.exit(code)


# ------------------------------------------------------------ config flags
def define_config_flags(names=None, defaults=None):
    """Defines a flag for each field of ``TrainConfig`` that declares one (its
    help, default and choices are declared there, once).

    ``names``: only these fields; ``defaults``: the program's own default of
    a field (e.g. the tuner's epochs per trial).
    """
    import dataclasses

    from keras_identity.training import TrainConfig

    defaults = defaults or {}
    definers = {bool: flags.DEFINE_bool, int: flags.DEFINE_integer, float: flags.DEFINE_float}
    for field in dataclasses.fields(TrainConfig):
        if "help" not in field.metadata or (names is not None and field.name not in names):
            continue
        default = defaults.get(field.name, field.default)
        choices = field.metadata["choices"]
        if choices:
            flags.DEFINE_enum(field.name, None if default is None else str(default),
                              [str(c) for c in choices], field.metadata["help"])
        else:
            definers.get(field.type, flags.DEFINE_string)(field.name, default,
                                                          field.metadata["help"])


def config_from_flags(**values):
    """``TrainConfig`` from the flags :func:`define_config_flags` defined, the
    model flags and ``values`` (set by the program itself).  Without
    ``--verbose``, standard output that is not a terminal gets no progress
    bars."""
    import dataclasses

    from keras_identity.training import TrainConfig

    kwargs = {}
    for field in dataclasses.fields(TrainConfig):
        if "help" not in field.metadata or field.name not in flags.FLAGS:
            continue
        value, choices = flags.FLAGS[field.name].value, field.metadata["choices"]
        # An enum flag holds a string; the field holds the choice's own type.
        kwargs[field.name] = value if value is None or not choices else next(
            c for c in choices if str(c) == value)
    if "verbose" in kwargs and not flags.FLAGS["verbose"].present and not sys.stdout.isatty():
        # A log file: the program's own line per epoch and per checkpoint, no
        # progress bar redrawn every few steps.
        kwargs["verbose"] = 0
    kwargs.update(values)
    if "model_kwargs" not in kwargs:
        kwargs["model_kwargs"] = model_kwargs_from_flags(kwargs["model"])
    return TrainConfig(**kwargs)


# ------------------------------------------------------------- model flags
def define_model_flags():
    """Defines the flags that set builder arguments, from their one
    declaration (``registry.MODEL_FLAGS``), and ``--model_kwargs``."""
    from keras_identity.models import registry

    define = {float: flags.DEFINE_float, bool: flags.DEFINE_bool}
    for name, (kind, choices, help_text) in registry.MODEL_FLAGS.items():
        if choices is not None:
            flags.DEFINE_enum(name, None, list(choices), help_text)
        else:
            define[kind](name, None, help_text)
    flags.DEFINE_string("model_kwargs", None, "Other builder arguments as JSON, e.g. "
                        "'{\"dimension_shortcut\": \"B\"}' (see the builder's docstring).")


def model_kwargs_from_flags(model):
    """The builder arguments the model flags set, for ``model``."""
    import json

    from keras_identity.models import registry

    kwargs = registry.kwargs_from_flags(
        model, **{name: flags.FLAGS[name].value for name in registry.MODEL_FLAGS
                  if name in flags.FLAGS})
    if flags.FLAGS.model_kwargs:
        try:
            extra = json.loads(flags.FLAGS.model_kwargs)
        except json.JSONDecodeError as error:
            fail(f"--model_kwargs={flags.FLAGS.model_kwargs} is not valid JSON ({error})", 2)
        if not isinstance(extra, dict):
            fail(f"--model_kwargs={flags.FLAGS.model_kwargs} is not valid; expected a JSON "
                 f"object of builder arguments", 2)
        for key in set(extra) & set(kwargs):
            fail(f"--model_kwargs sets {key!r}, which --{key} sets too; give it once", 2)
        kwargs.update(extra)
    return kwargs


def tune_objectives():
    from keras_identity.tuning import OBJECTIVES

    return OBJECTIVES


def tuners():
    from keras_identity.tuning import TUNERS

    return TUNERS

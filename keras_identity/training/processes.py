"""One JAX run across processes (``jax.distributed``): several hosts of a TPU
slice or GPU cluster, or several processes on one machine.

Every process runs the same command.  :func:`initialize` connects them
before JAX starts its backend; the trainer then lays the model out with
``keras.distribution.DataParallel`` over every process's devices
(:func:`keras_identity.training.strategies.get_strategy`), each process
reads its own rows of every global batch (:mod:`keras_identity.data.arrays`)
and only process 0 writes into the run's directory (the others save into
scratch folders of their own, removed at the end).
"""

import errno
import os
import re
import socket

# Seconds without a heartbeat after which the coordination service declares a
# process dead and stops the others (JAX's default is 100).
HEARTBEAT_TIMEOUT_S = 60
# Seconds the processes wait for each other at start.
INITIALIZATION_TIMEOUT_S = 300

_ADDRESS = re.compile(r"^(\[[0-9a-fA-F:]+\]|[A-Za-z0-9_.-]+):(\d{1,5})$")


def _environment_cluster():
    """The cluster manager that started this process with others, if JAX's
    own detection applies (``jax.distributed.initialize()`` without
    arguments), else ``None``."""
    if int(os.environ.get("SLURM_NTASKS", "1") or 1) > 1:
        return "SLURM"
    if int(os.environ.get("OMPI_COMM_WORLD_SIZE", "1") or 1) > 1:
        return "Open MPI"
    return None


def check_arguments(coordinator_address=None, num_processes=None, process_id=None):
    """Raises ``ValueError`` (one line naming the flag) unless the three are
    all given and valid, or none is."""
    given = {"coordinator_address": coordinator_address, "num_processes": num_processes,
             "process_id": process_id}
    missing = [name for name, value in given.items() if value is None]
    if len(missing) == 3:
        return False
    if missing:
        raise ValueError(f"--{', --'.join(missing)} missing: one run across processes needs "
                         f"--coordinator_address=HOST:PORT (process 0's), --num_processes and "
                         f"--process_id, or none of them (a Cloud TPU slice or SLURM: JAX's "
                         f"own detection).")
    address = _ADDRESS.match(str(coordinator_address))
    if not address or not 0 < int(address.group(2)) < 65536:
        raise ValueError(f"--coordinator_address={coordinator_address!r} is not valid; "
                         f"expected HOST:PORT of process 0 (e.g. 10.0.0.2:1234).")
    if isinstance(num_processes, bool) or not isinstance(num_processes, int) or (
            num_processes < 1):
        raise ValueError(f"--num_processes={num_processes!r} is not valid; expected an "
                         f"integer >= 1.")
    if isinstance(process_id, bool) or not isinstance(process_id, int) or not (
            0 <= process_id < num_processes):
        raise ValueError(f"--process_id={process_id!r} is not valid; expected an integer in "
                         f"[0, {num_processes}).")
    return True


def initialize(coordinator_address=None, num_processes=None, process_id=None):
    """Connects this process to the others of its run, before any JAX
    computation.

    With the three arguments (the names of ``jax.distributed.initialize``'s
    own), this process is ``process_id`` of ``num_processes`` and process 0
    serves the coordinator at ``coordinator_address``.  With none, a SLURM or
    Open MPI job of several tasks is detected by JAX itself; a Cloud TPU
    slice needs nothing (its hosts find each other); anything else is one
    process.  On CPUs the processes exchange gradients over Gloo.

    Returns the number of processes.

    Raises:
        ValueError: bad arguments, or processes that do not meet in time (one
            line).
    """
    import jax

    explicit = check_arguments(coordinator_address, num_processes, process_id)
    cluster = None if explicit else _environment_cluster()
    if not explicit and cluster is None:
        return jax.process_count()
    if explicit and num_processes == 1:
        return 1
    if explicit and process_id == 0:
        check_port_free(coordinator_address)
    # CPU processes all-reduce through Gloo (the default has no cross-process
    # collectives); GPUs and TPUs use their own.
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    arguments = dict(coordinator_address=coordinator_address, num_processes=num_processes,
                     process_id=process_id) if explicit else {}
    try:
        jax.distributed.initialize(**arguments, initialization_timeout=INITIALIZATION_TIMEOUT_S,
                                   heartbeat_timeout_seconds=HEARTBEAT_TIMEOUT_S)
    except (RuntimeError, ValueError) as error:
        where = (f"--coordinator_address={coordinator_address} as process {process_id} of "
                 f"{num_processes}" if explicit else f"the {cluster} job")
        raise ValueError(f"the processes did not connect ({where}): "
                         f"{' '.join(str(error).split())[:200]}") from None
    return jax.process_count()


def check_port_free(coordinator_address):
    """Raises ``ValueError`` (one line) when process 0 cannot serve the
    coordinator at ``coordinator_address`` because another program holds its
    port (JAX's coordination service would crash the process instead)."""
    port = int(coordinator_address.rsplit(":", 1)[1])
    family = socket.AF_INET6 if coordinator_address.startswith("[") else socket.AF_INET
    try:
        probe = socket.socket(family, socket.SOCK_STREAM)
    except OSError:
        return  # no such address family here: jax.distributed says what fails
    try:
        # A port left in TIME_WAIT by an earlier run is free to listen on.
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        probe.bind(("", port))
    except OSError as error:
        if error.errno in (errno.EADDRINUSE, errno.EACCES):
            raise ValueError(
                f"--coordinator_address={coordinator_address}: port {port} "
                + ("is in use by another program" if error.errno == errno.EADDRINUSE
                   else "may not be used by this user")
                + "; process 0 serves the coordinator there: choose a free port (the same "
                  "--coordinator_address for every process).") from None
    finally:
        probe.close()


def lost_peer(error):
    """Whether ``error`` (raised by a collective) says another process of the
    run died or became unreachable."""
    text = str(error)
    return any(marker in text for marker in (
        "Gloo", "heartbeat", "Connection reset by peer", "UNAVAILABLE",
        "coordination service", "Connection refused"))

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
import math
import os
import re
import select
import socket
import sys
import time

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


class PeersMissing(ValueError):
    """Processes of the run did not connect in time (one line naming them)."""


_GREETING = "keras_identity roll call"


def _say(line):
    print(line, file=sys.stderr, flush=True)


def roll_call(coordinator_address, num_processes, process_id, timeout_s):
    """Meets every process of the run at ``coordinator_address`` before JAX's
    coordination service starts there, so that a process that never comes is
    named in one line instead of JAX's abort after its own timeout.

    Process 0 listens on the coordinator's port until the ``num_processes -
    1`` others have said who they are, then answers them all and frees the
    port for JAX; the others connect (retrying until process 0 listens) and
    wait for its answer.  Each says once what it waits for.

    Raises:
        PeersMissing: not everyone within ``timeout_s`` seconds (names who).
        ValueError: a process of another run, or with other flags, answered.
    """
    host, port = coordinator_address.rsplit(":", 1)
    host, port = host.strip("[]"), int(port)
    deadline = time.monotonic() + timeout_s
    where = f"--coordinator_address={coordinator_address}"
    if process_id == 0:
        family = socket.AF_INET6 if coordinator_address.startswith("[") else socket.AF_INET
        _gather(family, port, num_processes, deadline, timeout_s, where)
    else:
        _report(host, port, num_processes, process_id, deadline, timeout_s, where)


def _gather(family, port, num_processes, deadline, timeout_s, where):
    server = socket.socket(family, socket.SOCK_STREAM)
    server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    server.bind(("", port))
    server.listen(num_processes)
    _say(f"waiting for {num_processes - 1} of {num_processes} processes at {where}, up to "
         f"{timeout_s:g} s")
    peers = {}
    try:
        while len(peers) < num_processes - 1:
            left = deadline - time.monotonic()
            if left <= 0:
                missing = [str(i) for i in range(1, num_processes) if i not in peers]
                raise PeersMissing(
                    f"process{'es' if len(missing) > 1 else ''} {', '.join(missing)} of "
                    f"{num_processes} did not connect to {where} within {timeout_s:g} s; "
                    f"start the same command there with --process_id={missing[0]}, or raise "
                    f"--initialization_timeout_s")
            server.settimeout(min(left, 1.0))
            try:
                connection, _ = server.accept()
            except socket.timeout:
                continue
            connection.settimeout(10)
            try:
                words = connection.makefile("rb").readline(200).decode(
                    "ascii", "replace").split()
            except OSError:
                connection.close()
                continue
            if words[:3] != _GREETING.split() or len(words) != 5 or not all(
                    w.isdigit() for w in words[3:]):
                connection.close()  # not one of ours (a port scan, a health check)
                continue
            peer_id, peer_count = int(words[3]), int(words[4])
            if peer_count != num_processes or not 0 < peer_id < num_processes:
                connection.sendall(b"refused\n")
                connection.close()
                raise ValueError(
                    f"a process started with --process_id={peer_id} --num_processes="
                    f"{peer_count} connected to {where}, which process 0 serves for "
                    f"{num_processes} processes; give every process the same "
                    f"--num_processes and its own --process_id")
            if peer_id in peers:  # that process started again: its new connection counts
                peers.pop(peer_id).close()
            peers[peer_id] = connection
            _drop_gone(peers)  # each still connected when the last one comes
        for connection in peers.values():
            connection.sendall(b"ok\n")
        for connection in peers.values():  # they close first: the port stays free
            try:
                connection.recv(1)
            except OSError:
                pass
    finally:
        for connection in peers.values():
            connection.close()
        server.close()


def _drop_gone(peers):
    """Forgets the peers whose connection has closed (a process that
    connected, then stopped, is waited for again)."""
    for peer_id, connection in list(peers.items()):
        readable, _, _ = select.select([connection], [], [], 0)
        if readable:
            try:
                gone = connection.recv(1, socket.MSG_PEEK) == b""
            except OSError:
                gone = True
            if gone:
                peers.pop(peer_id).close()


def _report(host, port, num_processes, process_id, deadline, timeout_s, where):
    _say(f"waiting for process 0 at {where}, up to {timeout_s:g} s")
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            raise PeersMissing(
                f"process 0 of {num_processes} did not answer at {where} within "
                f"{timeout_s:g} s; start it there (--process_id=0), or raise "
                f"--initialization_timeout_s")
        try:
            connection = socket.create_connection((host, port), timeout=min(left, 5.0))
        except OSError:
            time.sleep(min(0.5, max(left, 0)))
            continue
        try:
            connection.settimeout(max(deadline - time.monotonic(), 0.1))
            connection.sendall(f"{_GREETING} {process_id} {num_processes}\n".encode())
            answer = connection.makefile().readline().strip()
        except OSError:
            answer = None
        finally:
            connection.close()
        if answer == "ok":
            return
        if answer == "refused":
            raise ValueError(
                f"process 0 at {where} refused this process (--process_id={process_id} "
                f"--num_processes={num_processes}); give every process the same "
                f"--num_processes and its own --process_id")
        if answer is None and time.monotonic() >= deadline:
            continue  # reported as missing above
        time.sleep(0.5)  # process 0 went away (or is JAX's service already): try again


def initialize(coordinator_address=None, num_processes=None, process_id=None,
               timeout_s=INITIALIZATION_TIMEOUT_S):
    """Connects this process to the others of its run, before any JAX
    computation.

    With the three arguments (the names of ``jax.distributed.initialize``'s
    own), this process is ``process_id`` of ``num_processes`` and process 0
    serves the coordinator at ``coordinator_address``.  With none, a SLURM or
    Open MPI job of several tasks is detected by JAX itself; a Cloud TPU
    slice needs nothing (its hosts find each other); anything else is one
    process.  On CPUs the processes exchange gradients over Gloo.

    ``timeout_s``: how long the processes wait for each other (with the
    three arguments, :func:`roll_call` names those that do not come).

    Returns the number of processes.

    Raises:
        PeersMissing: processes that do not meet in time (one line).
        ValueError: bad arguments, or JAX's own connection failing (one line).
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
    if explicit:
        roll_call(coordinator_address, num_processes, process_id, timeout_s)
    # CPU processes all-reduce through Gloo (the default has no cross-process
    # collectives); GPUs and TPUs use their own.
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    arguments = dict(coordinator_address=coordinator_address, num_processes=num_processes,
                     process_id=process_id) if explicit else {}
    try:
        jax.distributed.initialize(**arguments, initialization_timeout=math.ceil(timeout_s),
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

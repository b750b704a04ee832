"""One JAX run across processes (``jax.distributed``): several hosts of a TPU slice or
GPU cluster, or several processes on one machine.

Every process runs the same command.  :func:`initialize` connects them before JAX starts
its backend; the trainer then lays the model out with
``keras.distribution.DataParallel`` over every process's devices
(:func:`keras_identity.training.strategies.get_strategy`), each process reads its own
rows of every global batch (:mod:`keras_identity.data.arrays`) and only process 0 writes
into the run's directory (the others save into scratch folders of their own, removed at
the end).

**Why a roll call of our own** (:func:`roll_call`, before
``jax.distributed.initialize``, given ``--coordinator_address``): measured with jax
0.10.2 (CPU processes on 127.0.0.1), when the processes do not all meet
``jax.distributed.initialize`` raises nothing but aborts the process (SIGABRT, status
134) about 5 s after its ``initialization_timeout``: a C++ stack trace under one absl
line ("... This most likely indicates that another task died ... DEADLINE_EXCEEDED ...
RegisterTask") naming no process and no address, alike for a peer that never comes
(either side), a wrong address, a stranger at the port (a silent TCP or HTTP server) and
another run's coordinator there.  A second process with a taken id displaces the first
(which aborts), an id beyond process 0's ``num_processes`` aborts at once, a larger
``num_processes`` whose id fits is accepted silently.  So the roll call still does what
``jax.distributed`` cannot: one line on every process naming the ids that never came and
the address; on the others, whether nothing, another program or a gRPC server answers
there; a duplicate ``--process_id``, an id out of range or another ``--num_processes``
refused in one line while the run goes on; strangers' bytes at the port ignored (process
0 speaks first, with a nonce); all within ``--initialization_timeout_s``.  The rest is
JAX's: the same timeout and ``HEARTBEAT_TIMEOUT_S`` are passed through (a peer that dies
later makes the next collective raise, :func:`lost_peer`, and the heartbeat stop the
others), and SLURM, Open MPI and TPU slices are its own detection.
"""

import errno
import math
import os
import re
import secrets
import select
import socket
import sys
import time

# Seconds without a heartbeat after which the coordination service declares a
# process dead and stops the others (JAX's default is 100).
HEARTBEAT_TIMEOUT_S = 60
# Seconds the processes wait for each other at start.
INITIALIZATION_TIMEOUT_S = 300
# The longest --initialization_timeout_s: a week.
MAX_TIMEOUT_S = 7 * 24 * 3600

_ADDRESS = re.compile(r"^(\[[0-9a-fA-F:]+\]|[A-Za-z0-9_.-]+):(\d{1,5})$")


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


def check_timeout(timeout_s):
    """``timeout_s`` as a float; ``ValueError`` (one line naming the flag)
    unless it is a finite number of seconds in ``(0, MAX_TIMEOUT_S]``."""
    try:
        value = float(timeout_s)
        valid = not isinstance(timeout_s, bool) and 0 < value <= MAX_TIMEOUT_S
    except (TypeError, ValueError, OverflowError):
        valid = False
    if not valid:
        shown = f"{timeout_s:g}" if isinstance(timeout_s, (int, float)) else repr(timeout_s)
        raise ValueError(f"--initialization_timeout_s={shown} is not valid; expected seconds "
                         f"> 0 and at most {MAX_TIMEOUT_S} (7 days)")
    return value


def initialize(coordinator_address=None, num_processes=None, process_id=None,
               timeout_s=INITIALIZATION_TIMEOUT_S):
    """Connects this process to the others of its run, before any JAX computation; returns
    the number of processes.

    With the three arguments (the names of ``jax.distributed.initialize``'s own), this
    process is ``process_id`` of ``num_processes`` and process 0 serves the coordinator at
    ``coordinator_address``.  With none, a SLURM or Open MPI job of several tasks is
    detected by JAX itself; a Cloud TPU slice needs nothing (its hosts find each other);
    anything else is one process.  On CPUs the processes exchange gradients over Gloo.
    ``timeout_s``: how long the processes wait for each other, in :func:`roll_call` (with
    the three arguments) and then in JAX's own initialization (:func:`check_timeout` says
    what it may be).  Raises ``PeersMissing`` (processes that do not meet in time) or
    ``ValueError`` (bad arguments, process 0's port taken, JAX's own connection failing),
    each one line.
    """
    import jax

    timeout_s = check_timeout(timeout_s)
    explicit = check_arguments(coordinator_address, num_processes, process_id)
    # Without them, a SLURM or Open MPI job of several tasks: JAX's own detection.
    cluster = None if explicit else next((name for name, size in (
        ("SLURM", "SLURM_NTASKS"), ("Open MPI", "OMPI_COMM_WORLD_SIZE"))
        if int(os.environ.get(size, "1") or 1) > 1), None)
    if not explicit and cluster is None:
        return jax.process_count()
    if explicit and num_processes == 1:
        return 1
    if explicit:  # process 0's port is checked as its roll call listens there
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


def lost_peer(error):
    """Whether ``error`` (of a collective) says another process died or is gone."""
    text = str(error)
    return any(marker in text for marker in (
        "Gloo", "heartbeat", "Connection reset by peer", "UNAVAILABLE",
        "coordination service", "Connection refused"))


class PeersMissing(ValueError):
    """Processes of the run did not connect in time (one line naming them)."""


_GREETING = "keras_identity roll call"
# Seconds a connection to process 0 has to greet (it holds no one up: process
# 0 serves every connection at once); connections waiting to greet at one time
# (then the oldest is dropped); the longest greeting and line of process 0's;
# process 0's warning lines (one per peer host and kind of greeting).
GREETING_S, _MAX_PENDING, _GREETING_BYTES, _LINE_BYTES, _MAX_WARNINGS = 10, 64, 200, 1 << 20, 10


def roll_call(coordinator_address, num_processes, process_id, timeout_s):
    """Meets every process of the run at ``coordinator_address`` before JAX's coordination
    service starts there (the module's docstring says why).

    Process 0 listens on the port until the ``num_processes - 1`` others have said who they
    are, then answers them all and frees the port for JAX; the others connect (retrying
    until process 0 listens) and wait for its answer, hearing meanwhile whom it still waits
    for.  Process 0 speaks first on every connection (the run's size and a nonce of its
    own); a greeting counts only if it repeats the nonce.  Anything else (a line sent blind,
    other bytes, another number of processes, an id out of range or of a connected process)
    is turned away with a warning line; nothing holds process 0 past ``timeout_s``.  Raises
    ``PeersMissing`` (not everyone within ``timeout_s``: names who) or ``ValueError``
    (``timeout_s`` not valid; this process refused for its ``num_processes`` or its taken
    ``process_id``; process 0's port taken: says by what).
    """
    timeout_s = check_timeout(timeout_s)
    host, port = coordinator_address.rsplit(":", 1)
    host, port = host.strip("[]"), int(port)
    deadline = time.monotonic() + timeout_s
    where = f"--coordinator_address={coordinator_address}"
    if process_id == 0:
        family = socket.AF_INET6 if coordinator_address.startswith("[") else socket.AF_INET
        _Gathering(num_processes, deadline, timeout_s, where).run(_listen(family, port, where))
    else:
        _report(host, port, num_processes, process_id, deadline, timeout_s, where)


def _say(line):
    print(line, file=sys.stderr, flush=True)


def _ranges(ids, separator=","):
    """``[2, 3, 4, 7]`` -> ``"2-4,7"`` (runs of three or more as ranges)."""
    runs = []
    for i in sorted(ids):
        if runs and runs[-1][1] == i - 1:
            runs[-1][1] = i
        else:
            runs.append([i, i])
    return separator.join(f"{a}-{b}" if b - a >= 2 else separator.join(map(str, range(a, b + 1)))
                          for a, b in runs)


def _parse_ranges(text, count):
    """The ids ``_ranges`` wrote, each in ``[1, count)`` (else ``ValueError``)."""
    ids = []
    for part in text.split(","):
        first, _, last = part.partition("-")
        first, last = int(first), int(last or first)
        if not 0 < first <= last < count:
            raise ValueError(part)
        ids.extend(range(first, last + 1))
    return ids


def _processes(ids):  # "process 2", "processes 1, 2"
    return f"process{'es' if len(ids) > 1 else ''} {_ranges(ids, ', ')}"


def _not_connected(ids, count, where, within):
    return (f"{_processes(ids)} of {count} did not connect to {where} within {within}; start "
            f"the same command there with --process_id={min(ids)}, or raise "
            f"--initialization_timeout_s")


def _may_greet(buffer):
    """Whether ``buffer`` can still become a line of the roll call."""
    prefix = _GREETING.encode()
    return (buffer.startswith(prefix) or prefix.startswith(buffer)) and (
        len(buffer) <= _GREETING_BYTES)


def _receive(connection, deadline, size=4096):
    """Up to ``size`` bytes, ``b""`` at the connection's end or at
    ``deadline`` (however the other side trickles its bytes)."""
    left = deadline - time.monotonic()
    if left <= 0:
        return b""
    connection.settimeout(left)
    try:
        return connection.recv(size)
    except OSError:  # socket.timeout too
        return b""


def _read_banner(connection, deadline):
    """Reads process 0's first line on ``connection``: ``(num_processes,
    nonce)`` when a roll call of this package answers, else ``"grpc"`` (an
    HTTP/2 server: JAX's coordination service), ``"other"`` (another
    program) or ``None`` (it hung up, or said nothing before ``deadline``)."""
    buffer = b""
    while b"\n" not in buffer:
        # An HTTP/2 SETTINGS frame: what a gRPC server sends first.
        if len(buffer) >= 9 and buffer[3] == 4 and buffer[5:9] == b"\0\0\0\0":
            return "grpc"
        if not _may_greet(buffer):
            return "other"
        data = _receive(connection, deadline)
        if not data:
            return None if not buffer else "other"
        buffer += data
    words = buffer.split(b"\n")[0].decode("ascii", "replace").split()
    if len(words) != 7 or words[3] != "of" or words[5] != "processes" or not (
            words[4].isdigit()):
        return "other"
    return int(words[4]), words[6]


class _Gathering:
    """Process 0's side: one ``poll`` loop over the listening socket, the
    connections yet to greet and the processes that have, up to the deadline."""

    def __init__(self, num_processes, deadline, timeout_s, where):
        self.count = num_processes
        self.deadline, self.timeout_s, self.where = deadline, timeout_s, where
        self.pending = {}  # socket -> [address, nonce, bytes so far, greet-by time]
        self.peers = {}    # socket -> (process id, address)
        self.warned = set()

    def run(self, server):
        _say(f"waiting for {self.count - 1} of {self.count} processes at {self.where}, up to "
             f"{self.timeout_s:g} s")
        told, told_at = None, -math.inf
        try:
            while True:
                missing = self.missing()
                if not missing:
                    self.drop_gone()  # a last check: each still connected
                    if not self.missing():
                        break
                    continue
                now = time.monotonic()
                if now >= self.deadline:
                    self.tell_all(f"missing {_ranges(missing)} {self.timeout_s:g}")
                    raise PeersMissing(_not_connected(missing, self.count, self.where,
                                                      f"{self.timeout_s:g} s"))
                if missing != told and now >= told_at + 1:  # at most a line a second
                    self.tell_all(f"waiting {_ranges(missing)}")
                    told, told_at = missing, now
                    continue
                for connection, (_, _, _, until) in list(self.pending.items()):
                    if now >= until:  # said nothing, or too little, in time
                        self.close(connection)
                wake = min([self.deadline] + [p[3] for p in self.pending.values()]
                           + ([told_at + 1] if missing != told else []))
                sockets = [server, *self.pending, *self.peers]
                for connection in _readable(sockets, wake - now):
                    if connection is server:
                        self.accept(server)
                    elif connection in self.pending:
                        self.read_greeting(connection)
                    else:
                        self.read_peer(connection)
            # Closed at once: JAX's service binds the port all the same (gRPC
            # sets SO_REUSEADDR), and the others retry until it listens.
            self.tell_all("ok")
        finally:
            for connection in [*self.pending, *self.peers]:
                connection.close()
            server.close()

    def missing(self):
        present = {peer_id for peer_id, _ in self.peers.values()}
        return [i for i in range(1, self.count) if i not in present]

    def close(self, connection):
        self.pending.pop(connection, None)
        self.peers.pop(connection, None)
        connection.close()

    def accept(self, server):
        try:
            connection, address = server.accept()
        except OSError:  # gone before being accepted
            return
        connection.setblocking(False)
        if len(self.pending) >= _MAX_PENDING:
            self.close(next(iter(self.pending)))  # the oldest
        nonce = secrets.token_hex(8)
        self.pending[connection] = [address, nonce, b"",
                                    min(time.monotonic() + GREETING_S, self.deadline)]
        self.tell(connection, f"{_GREETING} of {self.count} processes {nonce}")  # or its end

    def read_greeting(self, connection):
        address, nonce, buffer, _ = entry = self.pending[connection]
        try:
            data = connection.recv(_GREETING_BYTES + 1 - len(buffer))
        except OSError:
            data = b""
        if not data:  # hung up without greeting: a port scan, a probe
            self.close(connection)
            return
        entry[2] = buffer = buffer + data
        if b"\n" not in buffer and _may_greet(buffer):
            return  # the rest to come, by the connection's greet-by time
        del self.pending[connection]
        words = buffer.split(b"\n")[0].decode("ascii", "replace").split()
        if words[:3] != _GREETING.split() or len(words) != 6 or not (
                words[3].isdigit() and words[4].isdigit()) or words[5] != nonce:
            if words[:3] == _GREETING.split() and len(words) in (5, 6):
                self.warn(address, "blind", "a greeting that does not answer process 0's "
                                            "first line: sent blind, not by a process of a run")
            else:
                self.warn(address, "bytes", "bytes that are not a greeting of this roll call")
            connection.close()
            return
        peer_id, peer_count = int(words[3]), int(words[4])
        self.drop_gone()
        holder = [_address(a) for i, a in self.peers.values() if i == peer_id]
        if peer_count != self.count or not 0 < peer_id < self.count:
            self.warn(address, "refused",
                      f"a process with --process_id={peer_id} --num_processes={peer_count}: "
                      f"this run has {self.count} processes, 1 to {self.count - 1} connect "
                      f"here; refused")
            refusal = f"refused {self.count}"
        elif holder:
            self.warn(address, "taken", f"a second process {peer_id}, while the one from "
                                        f"{holder[0]} is connected")
            refusal = f"taken {holder[0]}"
        else:
            _keep_alive(connection)
            self.peers[connection] = (peer_id, address)
            if self.missing():
                self.tell(connection, f"waiting {_ranges(self.missing())}")
            return
        self.tell(connection, refusal)
        connection.close()

    def read_peer(self, connection):
        """A process that greeted says nothing more: at its end, wait for it again."""
        try:
            if connection.recv(4096):
                return
        except BlockingIOError:
            return
        except OSError:
            pass
        self.close(connection)

    def drop_gone(self):
        for connection in _readable(list(self.peers), 0):
            self.read_peer(connection)

    def tell(self, connection, line):
        """Sends one line; ``False`` if the connection cannot take it (yet)."""
        data = f"{line}\n".encode()
        try:
            return connection.send(data) == len(data)
        except OSError:
            return False

    def tell_all(self, line):
        for connection in list(self.peers):
            if not self.tell(connection, line):
                self.close(connection)

    def warn(self, address, kind, what):
        """One line per peer host and ``kind`` of greeting, ``_MAX_WARNINGS`` in all."""
        key = (address[0], kind)
        if key in self.warned or len(self.warned) >= _MAX_WARNINGS:
            return
        self.warned.add(key)
        _say(f"warning: ignored a connection to {self.where} from {_address(address)} "
             f"({what}); still waiting for {_processes(self.missing())}")


def _address(address):
    host, port = address[:2]
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def _keep_alive(connection):
    """TCP keepalive: a process whose host vanished is gone within ~30 s."""
    try:
        connection.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
        for option, value in (("TCP_KEEPIDLE", 10), ("TCP_KEEPINTVL", 5), ("TCP_KEEPCNT", 3)):
            if hasattr(socket, option):
                connection.setsockopt(socket.IPPROTO_TCP, getattr(socket, option), value)
    except OSError:
        pass


def _readable(sockets, timeout):
    """Those of ``sockets`` with bytes (or their end) to read within ``timeout`` s."""
    if not hasattr(select, "poll"):
        return select.select(sockets, [], [], timeout)[0]
    poller, by_descriptor = select.poll(), {}
    for connection in sockets:
        by_descriptor[connection.fileno()] = connection
        poller.register(connection, select.POLLIN)
    return [by_descriptor[descriptor]
            for descriptor, _ in poller.poll(math.ceil(max(timeout, 0) * 1000))]


def _report(host, port, num_processes, process_id, deadline, timeout_s, where):
    """The other processes' side: connects to process 0 until it answers."""
    _say(f"waiting for process 0 at {where}, up to {timeout_s:g} s")
    heard = None  # what answered at the port last, if not process 0's roll call
    announced = []
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            what = {"grpc": ": a gRPC server holds that port (JAX's coordination service: "
                            "process 0 began without this process, or another run uses the "
                            "port)",
                    "other": ": another program holds that port"}.get(heard, "")
            raise PeersMissing(
                f"process 0 of {num_processes} did not answer at {where} within {timeout_s:g} "
                f"s{what}; start it there (--process_id=0), or raise "
                f"--initialization_timeout_s")
        try:
            with socket.create_connection((host, port), timeout=min(left, 5.0)) as connection:
                banner = _read_banner(connection, deadline)
                if banner in ("grpc", "other"):
                    heard = banner
                elif banner is not None:
                    heard = None
                    waiting = _greet(connection, banner, num_processes, process_id, deadline,
                                     where, announced)
                    if waiting is True:
                        return
                    if waiting and time.monotonic() >= deadline:
                        raise PeersMissing(_not_connected(waiting, num_processes, where,
                                                          f"{timeout_s:g} s"))
        except OSError:
            pass
        # Not listening yet, gone, or another program answered: try again.
        time.sleep(min(0.5, max(deadline - time.monotonic(), 0)))


def _greet(connection, banner, num_processes, process_id, deadline, where, announced):
    """Greets process 0 (its ``banner``: ``(num_processes, nonce)``); ``True``
    at its ``ok``, else (its end, ``deadline``, a line not of a roll call) the
    processes it said it waits for, or ``None``.  Says once (``announced``)
    whom it waits for with process 0; raises as :func:`roll_call` does."""
    connection.settimeout(max(deadline - time.monotonic(), 0.001))
    connection.sendall(f"{_GREETING} {process_id} {num_processes} {banner[1]}\n".encode())
    buffer, waiting = b"", None
    while True:
        while b"\n" not in buffer and len(buffer) <= _LINE_BYTES:
            data = _receive(connection, deadline)
            if not data:
                return waiting
            buffer += data
        if b"\n" not in buffer:
            return waiting
        line, buffer = buffer.split(b"\n", 1)
        try:
            words = line.decode("ascii").split()
        except UnicodeDecodeError:
            return waiting
        if words == ["ok"]:
            return True
        if words[:1] == ["refused"]:
            raise ValueError(
                f"process 0 at {where} refused this process (--process_id={process_id} "
                f"--num_processes={num_processes}): it serves {banner[0]} processes; give "
                f"every process the same --num_processes and its own --process_id")
        if words[:1] == ["taken"] and len(words) == 2:
            raise ValueError(
                f"process 0 at {where} already has a process {process_id} of {num_processes} "
                f"(connected from {words[1]}); give each process its own --process_id")
        try:
            ids = _parse_ranges(words[1], num_processes)
            within = float(words[2]) if words[0] == "missing" else None
        except (IndexError, ValueError):
            return waiting
        if words[0] == "missing":  # process 0 stopped waiting
            raise PeersMissing(_not_connected(ids, num_processes, where, f"{within:g} s"))
        if words[0] == "waiting":
            waiting = ids
            if not announced:
                announced.append(True)
                _say(f"process 0 answered at {where}; waiting with it for {_processes(ids)} "
                     f"of {num_processes}")


def check_port_free(coordinator_address):
    """``ValueError`` (one line) when process 0's port is taken: by another
    process 0 (its roll call answers), a gRPC server (JAX's coordination
    service) or another program (JAX's own error: "Failed to start RPC server")."""
    family = socket.AF_INET6 if coordinator_address.startswith("[") else socket.AF_INET
    try:
        _listen(family, int(coordinator_address.rsplit(":", 1)[1]),
                f"--coordinator_address={coordinator_address}").close()
    except OSError:
        pass  # not taken (no such address family here): jax.distributed says what fails


def _listen(family, port, where):
    """Process 0's listening socket; ``ValueError`` (one line saying by
    what) when the port is taken or forbidden."""
    server = socket.socket(family, socket.SOCK_STREAM)
    try:
        # A port left in TIME_WAIT by an earlier run is free to listen on.
        server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        server.bind(("", port))
        server.listen(socket.SOMAXCONN)
        server.setblocking(False)
        return server
    except OSError as error:
        server.close()
        if error.errno == errno.EACCES:
            raise ValueError(f"{where}: port {port} may not be used by this user; process 0 "
                             f"serves the coordinator there: choose a free port (the same "
                             f"--coordinator_address for every process).") from None
        if error.errno != errno.EADDRINUSE:
            raise
    holder = None  # what answers there, as _read_banner says (a probe that
    try:           # hangs up without greeting, which process 0 ignores)
        loopback = "::1" if family == socket.AF_INET6 else "127.0.0.1"
        with socket.create_connection((loopback, port), timeout=1.0) as connection:
            holder = _read_banner(connection, time.monotonic() + 1.0)
    except OSError:
        pass
    if isinstance(holder, tuple):
        raise ValueError(
            f"{where}: port {port} is held by another process 0 (its roll call for "
            f"{holder[0]} processes is under way there): this run's process 0 runs already, "
            f"or another run uses the port; start one process 0 per run, and give each run "
            f"a port of its own (the same --coordinator_address for every process of a "
            f"run).")
    what = ("is in use by a gRPC server (JAX's coordination service of a run under way?)"
            if holder == "grpc" else "is in use by another program")
    raise ValueError(f"{where}: port {port} {what}; process 0 serves the coordinator there: "
                     f"choose a free port (the same --coordinator_address for every "
                     f"process).")

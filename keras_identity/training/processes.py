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
# Seconds a connection to process 0's roll call has to greet before it is
# dropped (it never holds the roll call up: process 0 serves every connection
# at once, and ends at its own deadline).
GREETING_S = 10
# Connections waiting to greet at one time; beyond, the oldest is dropped.
_MAX_PENDING = 64
# The longest greeting line, and the longest line of process 0's (which can
# list many missing processes).
_GREETING_BYTES = 200
_LINE_BYTES = 1 << 20
# Seconds process 0 waits, once everyone has met, for the others to hang up
# first (then JAX's service finds the port free at once).
_PARTING_S = 5
# The longest --initialization_timeout_s: a week.
MAX_TIMEOUT_S = 7 * 24 * 3600
# Warning lines of process 0 (one per peer host and kind of greeting).
_MAX_WARNINGS = 10


def check_timeout(timeout_s):
    """Returns ``timeout_s`` as a float, or raises ``ValueError`` (one line
    naming the flag) unless it is a finite number of seconds in ``(0,
    MAX_TIMEOUT_S]``."""
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


def _say(line):
    print(line, file=sys.stderr, flush=True)


def _ranges(ids):
    """``[2, 3, 4, 7]`` -> ``"2-4,7"`` (runs of three or more as ranges)."""
    parts, ids = [], sorted(ids)
    start = 0
    while start < len(ids):
        end = start
        while end + 1 < len(ids) and ids[end + 1] == ids[end] + 1:
            end += 1
        if end - start >= 2:
            parts.append(f"{ids[start]}-{ids[end]}")
        else:
            parts.extend(str(i) for i in ids[start:end + 1])
        start = end + 1
    return ",".join(parts)


def _parse_ranges(text, count):
    """The ids ``_ranges`` wrote (each in ``[1, count)``); ``ValueError`` if
    ``text`` is not such a list."""
    ids = []
    for part in text.split(","):
        first, _, last = part.partition("-")
        first, last = int(first), int(last or first)
        if not 0 < first <= last < count:
            raise ValueError(part)
        ids.extend(range(first, last + 1))
    return ids


def _not_connected(ids, count, where, within):
    plural = len(ids) > 1
    return (f"process{'es' if plural else ''} {_ranges(ids).replace(',', ', ')} of {count} "
            f"did not connect to {where} within {within}; start the same command there with "
            f"--process_id={min(ids)}, or raise --initialization_timeout_s")


def _banner(num_processes, nonce):
    return f"{_GREETING} of {num_processes} processes {nonce}\n".encode()


def _read_banner(connection, deadline):
    """Reads process 0's first line on ``connection``: ``(num_processes,
    nonce)`` when a roll call of this package answers, else ``"grpc"`` (an
    HTTP/2 server: JAX's coordination service), ``"other"`` (another
    program) or ``None`` (it hung up, or said nothing before ``deadline``)."""
    buffer, prefix = b"", _GREETING.encode()
    while b"\n" not in buffer:
        if _http2(buffer):
            return "grpc"
        if not (buffer.startswith(prefix) or prefix.startswith(buffer)) or (
                len(buffer) > _GREETING_BYTES):
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


def _http2(data):
    """Whether ``data`` begins with an HTTP/2 SETTINGS frame (what a gRPC
    server, such as JAX's coordination service, sends first)."""
    return len(data) >= 9 and data[3] == 4 and data[5:9] == b"\0\0\0\0"


def _receive(connection, deadline, size=4096):
    """Up to ``size`` bytes from ``connection``, ``b""`` at its end or at
    ``deadline`` (each read waits only until then, however the other side
    trickles its bytes)."""
    left = deadline - time.monotonic()
    if left <= 0:
        return b""
    connection.settimeout(left)
    try:
        return connection.recv(size)
    except OSError:  # socket.timeout too
        return b""


def roll_call(coordinator_address, num_processes, process_id, timeout_s):
    """Meets every process of the run at ``coordinator_address`` before JAX's
    coordination service starts there, so that a process that never comes is
    named in one line instead of JAX's abort after its own timeout.

    Process 0 listens on the coordinator's port until the ``num_processes -
    1`` others have said who they are, then answers them all and frees the
    port for JAX; the others connect (retrying until process 0 listens) and
    wait for its answer, hearing meanwhile whom process 0 still waits for.
    Each says once what it waits for.

    Process 0 speaks first on every connection (a line naming the run's
    size and a number of that connection's own), and a greeting counts only
    if it repeats that number: a line sent blind, bytes that are not a
    greeting, a greeting for another number of processes or an id out of
    range, and a second process with the id of one still connected are
    turned away (a warning line per peer host and kind) while process 0 goes on
    waiting for the run's own; no connection holds it past ``timeout_s``.

    Raises:
        PeersMissing: not everyone within ``timeout_s`` seconds (names who).
        ValueError: ``timeout_s`` not valid; process 0 refused this process
            (other ``num_processes``, or its ``process_id`` taken); process
            0's port taken (says by what).
    """
    timeout_s = check_timeout(timeout_s)
    host, port = coordinator_address.rsplit(":", 1)
    host, port = host.strip("[]"), int(port)
    deadline = time.monotonic() + timeout_s
    where = f"--coordinator_address={coordinator_address}"
    if process_id == 0:
        family = socket.AF_INET6 if coordinator_address.startswith("[") else socket.AF_INET
        _Gathering(family, port, num_processes, deadline, timeout_s, where).run()
    else:
        _report(host, port, num_processes, process_id, deadline, timeout_s, where)


class _Gathering:
    """Process 0's side of the roll call: one ``poll`` loop over the
    listening socket, the connections that have yet to greet and the
    processes that have, every wait bounded by the deadline."""

    def __init__(self, family, port, num_processes, deadline, timeout_s, where):
        self.family, self.port, self.count = family, port, num_processes
        self.deadline, self.timeout_s, self.where = deadline, timeout_s, where
        self.pending = {}  # socket -> [address, nonce, bytes so far, greet-by time]
        self.peers = {}    # process id -> (socket, address)
        self.warned = set()

    def run(self):
        server = _listen(self.family, self.port, self.where)
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
                self.expire(now)
                wake = min([self.deadline] + [p[3] for p in self.pending.values()]
                           + ([told_at + 1] if missing != told else []))
                sockets = [server, *self.pending, *(s for s, _ in self.peers.values())]
                for connection in _readable(sockets, wake - now):
                    if connection is server:
                        self.accept(server)
                    elif connection in self.pending:
                        self.read_greeting(connection)
                    else:
                        self.read_peer(connection)
            self.tell_all("ok")
            self.part()
        finally:
            for connection in [*self.pending, *(s for s, _ in self.peers.values())]:
                connection.close()
            server.close()

    def missing(self):
        return [i for i in range(1, self.count) if i not in self.peers]

    def accept(self, server):
        try:
            connection, address = server.accept()
        except OSError:  # gone before being accepted
            return
        connection.setblocking(False)
        if len(self.pending) >= _MAX_PENDING:
            oldest = next(iter(self.pending))
            del self.pending[oldest]
            oldest.close()
        nonce = secrets.token_hex(8)
        try:
            connection.send(_banner(self.count, nonce))
        except OSError:
            connection.close()
            return
        self.pending[connection] = [address, nonce, b"",
                                    min(time.monotonic() + GREETING_S, self.deadline)]

    def expire(self, now):
        for connection, (_, _, _, until) in list(self.pending.items()):
            if now >= until:  # said nothing, or too little, in time
                del self.pending[connection]
                connection.close()

    def read_greeting(self, connection):
        address, nonce, buffer, _ = entry = self.pending[connection]
        try:
            data = connection.recv(_GREETING_BYTES + 1 - len(buffer))
        except OSError:
            data = b""
        if not data:  # hung up without greeting: a port scan, a probe
            del self.pending[connection]
            connection.close()
            return
        entry[2] = buffer = buffer + data
        prefix = _GREETING.encode()
        if b"\n" not in buffer:
            if (buffer.startswith(prefix) or prefix.startswith(buffer)) and (
                    len(buffer) <= _GREETING_BYTES):
                return  # the rest to come, by the connection's greet-by time
        del self.pending[connection]
        self.greeted(connection, address, nonce, buffer.split(b"\n")[0])

    def greeted(self, connection, address, nonce, line):
        words = line.decode("ascii", "replace").split()
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
        if peer_count != self.count or not 0 < peer_id < self.count:
            self.warn(address, "refused",
                      f"a process with --process_id={peer_id} --num_processes={peer_count}: "
                      f"this run has {self.count} processes, 1 to {self.count - 1} connect "
                      f"here; refused")
            self.tell(connection, f"refused {self.count}")
            connection.close()
            return
        if peer_id in self.peers:
            self.drop_gone()
        if peer_id in self.peers:
            holder = _address(self.peers[peer_id][1])
            self.warn(address, "taken",
                      f"a second process {peer_id}, while the one from {holder} is connected")
            self.tell(connection, f"taken {holder}")
            connection.close()
            return
        _keep_alive(connection)
        self.peers[peer_id] = (connection, address)
        missing = self.missing()
        if missing:
            self.tell(connection, f"waiting {_ranges(missing)}")

    def read_peer(self, connection):
        """A process that has greeted says nothing more: its end (it
        stopped) makes process 0 wait for it again."""
        try:
            gone = connection.recv(4096) == b""
        except BlockingIOError:
            gone = False
        except OSError:
            gone = True
        if gone:
            self.forget(connection)

    def drop_gone(self):
        for connection, _ in list(self.peers.values()):
            if _readable([connection], 0):
                self.read_peer(connection)

    def forget(self, connection):
        for peer_id, (peer, _) in list(self.peers.items()):
            if peer is connection:
                del self.peers[peer_id]
        connection.close()

    def tell(self, connection, line):
        """Sends one line; ``False`` if the connection cannot take it now (a
        process of the run always reads what process 0 says)."""
        data = f"{line}\n".encode()
        try:
            return connection.send(data) == len(data)
        except OSError:
            return False

    def tell_all(self, line):
        for connection, _ in list(self.peers.values()):
            if not self.tell(connection, line):
                self.forget(connection)

    def part(self):
        """Waits (briefly) for the others to hang up first."""
        until = time.monotonic() + _PARTING_S
        open_ = [s for s, _ in self.peers.values()]
        while open_ and time.monotonic() < until:
            for connection in _readable(open_, until - time.monotonic()):
                try:
                    if connection.recv(4096) == b"":
                        open_.remove(connection)
                except BlockingIOError:
                    pass
                except OSError:
                    open_.remove(connection)

    def warn(self, address, kind, what):
        """One line, once per peer host and ``kind`` of greeting, for at most
        ``_MAX_WARNINGS`` of them."""
        key = (address[0], kind)
        if key in self.warned or len(self.warned) >= _MAX_WARNINGS:
            return
        self.warned.add(key)
        missing = self.missing()
        _say(f"warning: ignored a connection to {self.where} from {_address(address)} "
             f"({what}); still waiting for process{'es' if len(missing) > 1 else ''} "
             f"{_ranges(missing).replace(',', ', ')}")


def _address(address):
    host, port = address[:2]
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def _keep_alive(connection):
    """TCP keepalive on a process's connection: one whose host vanished is
    seen to be gone within about half a minute (its id free again)."""
    try:
        connection.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
        for option, value in (("TCP_KEEPIDLE", 10), ("TCP_KEEPINTVL", 5), ("TCP_KEEPCNT", 3)):
            if hasattr(socket, option):
                connection.setsockopt(socket.IPPROTO_TCP, getattr(socket, option), value)
    except OSError:
        pass


def _listen(family, port, where):
    server = socket.socket(family, socket.SOCK_STREAM)
    try:
        server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        server.bind(("", port))
        server.listen(socket.SOMAXCONN)
        server.setblocking(False)
    except OSError as error:
        server.close()
        _port_taken(error, family, port, where)
        raise
    return server


def _readable(sockets, timeout):
    """The sockets of ``sockets`` with bytes (or their end) to read, waiting
    up to ``timeout`` seconds (``poll``: any number of descriptors)."""
    if not hasattr(select, "poll"):
        return select.select(sockets, [], [], timeout)[0]
    poller, by_descriptor = select.poll(), {}
    for connection in sockets:
        by_descriptor[connection.fileno()] = connection
        poller.register(connection, select.POLLIN)
    return [by_descriptor[descriptor]
            for descriptor, _ in poller.poll(math.ceil(max(timeout, 0) * 1000))]


def _report(host, port, num_processes, process_id, deadline, timeout_s, where):
    _say(f"waiting for process 0 at {where}, up to {timeout_s:g} s")
    heard = None  # what answered at the port last, if not process 0's roll call
    announced = []
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            raise PeersMissing(_no_answer(num_processes, where, timeout_s, heard))
        try:
            connection = socket.create_connection((host, port), timeout=min(left, 5.0))
        except OSError:
            time.sleep(min(0.5, max(left, 0)))
            continue
        try:
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
        finally:
            connection.close()
        # Process 0 went away (or another program answered): try again.
        time.sleep(min(0.5, max(deadline - time.monotonic(), 0)))


def _greet(connection, banner, num_processes, process_id, deadline, where, announced):
    """Greets process 0 (whose ``banner`` is ``(num_processes, nonce)``) and
    reads its lines until its ``ok`` (returns ``True``), the connection's
    end or ``deadline`` (returns the processes process 0 said it waits
    for, ``None`` if it said nothing).  Says once (``announced``) whom it
    waits for with process 0.

    Raises:
        PeersMissing: process 0 stopped waiting (names whom it missed).
        ValueError: process 0 refused this process (another
            ``num_processes``, or ``process_id`` taken).
    """
    connection.settimeout(max(deadline - time.monotonic(), 0.001))
    connection.sendall(f"{_GREETING} {process_id} {num_processes} {banner[1]}\n".encode())
    lines, waiting = _Lines(connection), None
    while True:
        line = lines.next(deadline)
        words = line.split() if line else []
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
            return waiting  # its end, the deadline, or not process 0 of this package
        if words[0] == "missing":  # process 0 stopped waiting
            raise PeersMissing(_not_connected(ids, num_processes, where, f"{within:g} s"))
        if words[0] == "waiting":
            waiting = ids
            if not announced:
                announced.append(True)
                _say(f"process 0 answered at {where}; waiting with it for "
                     f"process{'es' if len(ids) > 1 else ''} "
                     f"{_ranges(ids).replace(',', ', ')} of {num_processes}")


class _Lines:
    """The lines process 0 sends, each read bounded by the deadline."""

    def __init__(self, connection):
        self.connection, self.buffer = connection, b""

    def next(self, deadline):
        """The next line (text), or ``None`` at the connection's end, at
        ``deadline``, or for bytes that are not a line of ASCII text."""
        while b"\n" not in self.buffer:
            if len(self.buffer) > _LINE_BYTES:
                return None
            data = _receive(self.connection, deadline)
            if not data:
                return None
            self.buffer += data
        line, self.buffer = self.buffer.split(b"\n", 1)
        try:
            return line.decode("ascii")
        except UnicodeDecodeError:
            return None


def _no_answer(num_processes, where, timeout_s, heard):
    what = {
        "grpc": ": a gRPC server holds that port (JAX's coordination service: process 0 "
                "began without this process, or another run uses the port)",
        "other": ": another program holds that port",
    }.get(heard, "")
    return (f"process 0 of {num_processes} did not answer at {where} within {timeout_s:g} "
            f"s{what}; start it there (--process_id=0), or raise --initialization_timeout_s")


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
    three arguments, :func:`roll_call` names those that do not come); seconds
    > 0, at most ``MAX_TIMEOUT_S`` (:func:`check_timeout`).

    Returns the number of processes.

    Raises:
        PeersMissing: processes that do not meet in time (one line).
        ValueError: bad arguments, or JAX's own connection failing (one line).
    """
    import jax

    timeout_s = check_timeout(timeout_s)
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
    coordinator at ``coordinator_address`` because its port is taken: by
    another process 0 (its roll call answers), by a gRPC server (JAX's
    coordination service of a run under way) or by another program (JAX's
    coordination service would crash the process instead)."""
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
        _port_taken(error, family, port, f"--coordinator_address={coordinator_address}")
    finally:
        probe.close()


def _port_taken(error, family, port, where):
    """Raises ``ValueError`` (one line saying by what) when ``error``, from
    binding ``port``, says it is taken or forbidden."""
    if error.errno == errno.EACCES:
        raise ValueError(f"{where}: port {port} may not be used by this user; process 0 "
                         f"serves the coordinator there: choose a free port (the same "
                         f"--coordinator_address for every process).") from None
    if error.errno != errno.EADDRINUSE:
        return
    holder = _holder(family, port)
    if isinstance(holder, tuple):
        raise ValueError(
            f"{where}: port {port} is held by another process 0 (its roll call for "
            f"{holder[0]} processes is under way there): this run's process 0 runs already, "
            f"or another run uses the port; start one process 0 per run, and give each run "
            f"a port of its own (the same --coordinator_address for every process of a "
            f"run).") from None
    what = ("is in use by a gRPC server (JAX's coordination service of a run under way?)"
            if holder == "grpc" else "is in use by another program")
    raise ValueError(f"{where}: port {port} {what}; process 0 serves the coordinator there: "
                     f"choose a free port (the same --coordinator_address for every "
                     f"process).") from None


def _holder(family, port, timeout_s=1.0):
    """What answers at ``port`` on this machine: as :func:`_read_banner`
    says (the probe hangs up without greeting, which process 0 ignores)."""
    loopback = "::1" if family == socket.AF_INET6 else "127.0.0.1"
    try:
        connection = socket.create_connection((loopback, port), timeout=timeout_s)
    except OSError:
        return None
    try:
        return _read_banner(connection, time.monotonic() + timeout_s)
    except OSError:
        return None
    finally:
        connection.close()


def lost_peer(error):
    """Whether ``error`` (raised by a collective) says another process of the
    run died or became unreachable."""
    text = str(error)
    return any(marker in text for marker in (
        "Gloo", "heartbeat", "Connection reset by peer", "UNAVAILABLE",
        "coordination service", "Connection refused"))

"""The roll call of a multi-process JAX run (processes.roll_call), called
directly in threads on 127.0.0.1: it meets only the run's own processes
within its deadline whatever strangers send, every process names the same
missing ones, and a bad --initialization_timeout_s is one line."""

import math
import os
import socket
import subprocess
import sys
import threading
import time

import pytest

from keras_identity.training import processes
from tests.backend import jax_only
from tests.programs import error_lines

# What a gRPC server (JAX's coordination service) sends first: an HTTP/2
# SETTINGS frame (recorded from jax.distributed.initialize's service).
GRPC_SETTINGS = (b"\x00\x00\x18\x04\x00\x00\x00\x00\x00\x00\x04\x00@\x00\x00\x00\x05\x00@\x00"
                 b"\x00\x00\x06\x00\x00@\x00\xfe\x03\x00\x00\x00\x01\x00\x00\x04\x08\x00\x00"
                 b"\x00\x00\x00\x00?\x00\x01")


def _port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Process:
    """``roll_call`` of one process in a thread: ``result`` is ``"ok"`` or the
    exception, ``seconds`` how long it took."""

    def __init__(self, address, count, process_id, timeout_s):
        self.result, self.seconds = None, None
        self.thread = threading.Thread(
            target=self._run, args=(address, count, process_id, timeout_s), daemon=True)
        self.thread.start()

    def _run(self, *arguments):
        started = time.monotonic()
        try:
            processes.roll_call(*arguments)
            self.result = "ok"
        except Exception as error:  # the test looks at it
            self.result = error
        self.seconds = time.monotonic() - started

    def join(self, timeout=30):
        self.thread.join(timeout)
        assert not self.thread.is_alive(), "the roll call did not end"
        return self.result


def _listening(port):
    """Waits until something listens on ``port`` (then gone: a probe)."""
    for _ in range(200):
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return
        except OSError:
            time.sleep(0.05)
    raise AssertionError(f"nothing listens on {port}")


def _connect(port):
    connection = socket.create_connection(("127.0.0.1", port), timeout=5)
    return connection, connection.getsockname()[1]


def _read_all(connection, seconds=5):
    """What ``connection`` receives until its end (or ``seconds``)."""
    connection.settimeout(seconds)
    data = b""
    try:
        while chunk := connection.recv(4096):
            data += chunk
    except OSError:
        pass
    return data


@pytest.mark.parametrize("process_1_comes", [False, True])
def test_a_trickling_stranger_holds_process_0_no_longer_than_its_deadline(process_1_comes):
    """M05: a client sending a byte at a time (of a greeting, so it is not
    dropped at once) neither holds process 0 past --initialization_timeout_s
    nor keeps process 1 out."""
    port = _port()
    address = f"127.0.0.1:{port}"
    zero = Process(address, 2, 0, 3)
    _listening(port)
    stranger, _ = _connect(port)
    stop = threading.Event()

    def trickle():
        for byte in b"keras_identity roll call 1 2 " * 2:
            if stop.wait(0.3):
                break
            try:
                stranger.send(bytes([byte]))
            except OSError:
                break
        stranger.close()

    threading.Thread(target=trickle, daemon=True).start()
    try:
        time.sleep(0.5)
        one = Process(address, 2, 1, 3) if process_1_comes else None
        result = zero.join()
        if process_1_comes:
            assert (result, one.join()) == ("ok", "ok")
            assert zero.seconds < 2.5
        else:
            assert isinstance(result, processes.PeersMissing)
            assert str(result).startswith("process 1 of 2 did not connect")
            assert 3 <= zero.seconds < 4.5
    finally:
        stop.set()


def test_strangers_greetings_do_not_stand_in_for_the_run_s_processes(capsys):
    """M07: bytes that are not UTF-8 and a greeting sent blind (a stranger
    copying `keras_identity roll call 1 2`) are dropped with a warning that
    names the peer; process 0 waits for, and meets, the real process 1."""
    port = _port()
    address = f"127.0.0.1:{port}"
    zero = Process(address, 2, 0, 10)
    _listening(port)
    garbage, garbage_port = _connect(port)
    garbage.sendall(b"\xfe\xff\x00 GET / HTTP/1.1\r\n")
    forger, forger_port = _connect(port)
    forger.sendall(b"keras_identity roll call 1 2\n")
    time.sleep(0.5)
    assert zero.thread.is_alive()  # not met by a stranger
    one = Process(address, 2, 1, 10)
    assert (zero.join(), one.join()) == ("ok", "ok")
    for stranger in (garbage, forger):  # the banner only: never "ok"
        received = _read_all(stranger)
        stranger.close()
        assert received.startswith(b"keras_identity roll call of 2 processes ")
        assert received.count(b"\n") == 1
    err = capsys.readouterr().err
    warnings = [line for line in err.splitlines() if line.startswith("warning:")]
    assert warnings and all(f"--coordinator_address={address}" in w for w in warnings), err
    assert any(f"from 127.0.0.1:{garbage_port} (bytes that are not a greeting" in w
               for w in warnings), err
    assert any(f"from 127.0.0.1:{forger_port} (a greeting that does not answer process 0's "
               f"first line" in w for w in warnings), err
    assert "still waiting for process 1" in warnings[0]


def test_process_1_facing_a_grpc_server_ends_in_one_line_naming_it():
    """M07: the real process 1 that finds JAX's coordination service (a gRPC
    server, which sends bytes such as 0xfe) at the port instead of the roll
    call says so at its deadline, without a decoding error; a process 0
    started there is told a gRPC server holds the port."""
    with socket.socket() as server:
        server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        server.bind(("", 0))
        server.listen()
        port = server.getsockname()[1]
        stop = threading.Event()

        def serve():
            server.settimeout(0.2)
            while not stop.is_set():
                try:
                    connection, _ = server.accept()
                except OSError:
                    continue
                connection.sendall(GRPC_SETTINGS)
                connection.settimeout(1)
                try:
                    connection.recv(100)  # a greeting: gRPC hangs up
                except OSError:
                    pass
                connection.close()

        thread = threading.Thread(target=serve, daemon=True)
        thread.start()
        try:
            with pytest.raises(processes.PeersMissing) as error:
                processes.roll_call(f"127.0.0.1:{port}", 2, 1, 2)
            with pytest.raises(ValueError) as taken:
                processes.check_port_free(f"127.0.0.1:{port}")
        finally:
            stop.set()
            thread.join()
    assert str(error.value).startswith(
        f"process 0 of 2 did not answer at --coordinator_address=127.0.0.1:{port} within 2 s: "
        f"a gRPC server holds that port")
    assert f"port {port} is in use by a gRPC server" in str(taken.value)


def _greet(port, process_id, count):
    """A process that speaks the roll call's protocol greets; returns what
    process 0 answers."""
    connection, _ = _connect(port)
    with connection:
        banner = connection.makefile("rb").readline()
        nonce = banner.split()[-1].decode()
        connection.sendall(f"keras_identity roll call {process_id} {count} {nonce}\n".encode())
        return _read_all(connection)


def test_greetings_with_other_numbers_are_refused_and_process_0_keeps_waiting(capsys):
    """M08: a process with another --num_processes, and a greeting with an id
    out of range, are refused (the process says why, in one line); process 0
    goes on waiting and meets the run's own."""
    port = _port()
    address = f"127.0.0.1:{port}"
    zero = Process(address, 2, 0, 10)
    _listening(port)
    with pytest.raises(ValueError) as refused:
        processes.roll_call(address, 3, 2, 5)
    assert str(refused.value) == (
        f"process 0 at --coordinator_address={address} refused this process (--process_id=2 "
        f"--num_processes=3): it serves 2 processes; give every process the same "
        f"--num_processes and its own --process_id")
    assert _greet(port, 7, 2) == b"refused 2\n"
    assert _greet(port, 0, 2) == b"refused 2\n"
    assert zero.thread.is_alive()
    one = Process(address, 2, 1, 10)
    assert (zero.join(), one.join()) == ("ok", "ok")
    warnings = [line for line in capsys.readouterr().err.splitlines()
                if line.startswith("warning:")]
    assert any("a process with --process_id=2 --num_processes=3: this run has 2 processes"
               in line for line in warnings), warnings


def test_a_second_process_with_a_connected_id_is_refused_and_the_run_goes_on():
    """A duplicate --process_id does not displace the connected process: it
    is told which connection holds the id; the run meets."""
    port = _port()
    address = f"127.0.0.1:{port}"
    zero = Process(address, 3, 0, 15)
    _listening(port)
    one = Process(address, 3, 1, 15)
    time.sleep(1.5)  # process 1 has greeted
    with pytest.raises(ValueError) as taken:
        processes.roll_call(address, 3, 1, 5)
    message = str(taken.value)
    assert message.startswith(f"process 0 at --coordinator_address={address} already has a "
                              f"process 1 of 3 (connected from 127.0.0.1:")
    assert message.endswith("give each process its own --process_id")
    two = Process(address, 3, 2, 15)
    assert (zero.join(), one.join(), two.join()) == ("ok", "ok", "ok")


@pytest.mark.parametrize("first", [0, 1])
def test_every_process_names_the_process_that_never_came(first, capsys):
    """M01: process 2 of 3 never comes.  Process 1 names process 2 (not
    process 0, which answered): at once when process 0 stops waiting, or at
    its own deadline when that comes first."""
    port = _port()
    address = f"127.0.0.1:{port}"
    zero = Process(address, 3, 0, 2 if first == 0 else 4)
    _listening(port)
    one = Process(address, 3, 1, 4 if first == 0 else 2)
    zero.join(), one.join()
    assert isinstance(one.result, processes.PeersMissing), one.result
    assert str(one.result) == (
        f"process 2 of 3 did not connect to --coordinator_address={address} within 2 s; start "
        f"the same command there with --process_id=2, or raise --initialization_timeout_s")
    assert one.seconds < 3  # with process 0 when it stops first, not at its own 4 s
    assert isinstance(zero.result, processes.PeersMissing)
    named = "process 2 of 3" if first == 0 else "processes 1, 2 of 3"  # 1 left at 2 s
    assert str(zero.result).startswith(f"{named} did not connect")
    err = capsys.readouterr().err
    assert (f"process 0 answered at --coordinator_address={address}; waiting with it for "
            f"process 2 of 3") in err


def test_a_second_process_0_is_told_another_process_0_holds_the_port():
    """M02/M17: a second process with --process_id=0 on the run's port is told
    another process 0's roll call holds it (not "another program")."""
    port = _port()
    address = f"127.0.0.1:{port}"
    zero = Process(address, 2, 0, 10)
    _listening(port)
    for attempt in (lambda: processes.check_port_free(address),
                    lambda: processes.roll_call(address, 2, 0, 5)):
        with pytest.raises(ValueError) as taken:
            attempt()
        message = str(taken.value)
        assert "\n" not in message
        assert message.startswith(
            f"--coordinator_address={address}: port {port} is held by another process 0 (its "
            f"roll call for 2 processes is under way there)"), message
    one = Process(address, 2, 1, 10)
    assert (zero.join(), one.join()) == ("ok", "ok")


@pytest.mark.parametrize("value", [math.inf, 1e300, math.nan, 0.0, -1.0, 7 * 24 * 3600 + 1,
                                   "300", None])
def test_the_timeout_is_finite_positive_and_at_most_a_week(value):
    """M11/M12: refused in one line naming the flag and what it allows,
    before any socket (inf used to end process 1 in OverflowError)."""
    if value == "300":
        assert processes.check_timeout(value) == 300.0
        return
    with pytest.raises(ValueError) as error:
        processes.check_timeout(value)
    message = str(error.value)
    assert message.startswith("--initialization_timeout_s=") and "\n" not in message
    assert message.endswith("is not valid; expected seconds > 0 and at most 604800 (7 days)")
    with pytest.raises(ValueError, match="--initialization_timeout_s="):
        processes.roll_call(f"127.0.0.1:{_port()}", 2, 1, value)
    assert processes.check_timeout(7 * 24 * 3600) == 7 * 24 * 3600


@jax_only
def test_an_infinite_timeout_is_one_line_and_status_2_in_the_program():
    """M11: --initialization_timeout_s=inf: one line, exit status 2, no
    traceback, no wait."""
    result = subprocess.run(
        [sys.executable, "-m", "keras_identity_cli.train", "--model=highway_net",
         "--depth=10", f"--coordinator_address=127.0.0.1:{_port()}", "--num_processes=2",
         "--process_id=1", "--initialization_timeout_s=inf"],
        capture_output=True, text=True, timeout=120)
    assert result.returncode == 2, result.stderr[-2000:]
    errors = error_lines(result.stderr)
    assert errors == ["error: --initialization_timeout_s=inf is not valid; expected seconds > "
                      "0 and at most 604800 (7 days)"], result.stderr[-2000:]
    assert "Traceback" not in result.stderr


def test_the_port_is_free_for_jax_the_moment_the_roll_call_ends():
    """Process 0 hangs up as soon as it has said "ok" (no parting wait): the
    connections it leaves in TIME_WAIT on the port do not keep JAX's
    coordination service (gRPC, which sets SO_REUSEADDR) from listening
    there at once."""
    port = _port()
    address = f"127.0.0.1:{port}"
    zero = Process(address, 3, 0, 10)
    _listening(port)
    others = [Process(address, 3, i, 10) for i in (1, 2)]
    assert [p.join() for p in (zero, *others)] == ["ok", "ok", "ok"]
    assert zero.seconds < 5
    with socket.socket() as service:
        service.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        service.bind(("", port))
        service.listen()
    processes.check_port_free(address)


@jax_only
def test_without_the_roll_call_jax_aborts_naming_no_process():
    """Why the roll call exists (the module's docstring): a process whose
    peer never comes gets no Python error from jax.distributed.initialize,
    but an abort after its timeout whose message names neither the missing
    process nor the address.  Should JAX ever say so in one line, this fails:
    then the roll call may leave that case to JAX."""
    address = f"127.0.0.1:{_port()}"
    code = (f"import jax; jax.distributed.initialize({address!r}, 2, 1, "
            f"initialization_timeout=2); print('connected')")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            timeout=120, env=dict(os.environ, JAX_PLATFORMS="cpu"))
    assert result.returncode < 0 and "connected" not in result.stdout, result.stderr[-2000:]
    assert "DEADLINE_EXCEEDED" in result.stderr and "Traceback" not in result.stderr
    assert address not in result.stderr and "process 0" not in result.stderr

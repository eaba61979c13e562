"""castor's endpoint and operator surfaces met from the outside: hostile flags, peers and paths.

Each test drives a real ``python -m castor`` subprocess (so what a user or another local
process meets is what is checked) and waits on the process or on a deadline, never on a sleep.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from tests.support.other_user import another_user_listening, heard_up_to_our_end

from .conftest import castor_argv, serve_env

pytestmark = pytest.mark.timeout(120)


def _runtime_dir(tmp: Path) -> Path:
    xdg = tmp / "xdg"
    xdg.mkdir(mode=0o700, exist_ok=True)
    return xdg


@pytest.mark.parametrize("extra", [
    ("--console-token-file", "CONSOLE_TOKEN"),  # without --console
    ("--console", "127.0.0.1:0", "--console-token-file", "CONSOLE_TOKEN"),  # a token file others may read
], ids=["console-token-without-console", "console-token-readable-by-others"])
def test_a_serve_refused_at_its_flags_leaves_no_token_file_behind(tmp_path, extra):
    """``castor serve --tcp`` whose console flags are refused used to have made the endpoint's
    token file first and exit 2 leaving it in the runtime directory: a secret nobody removes,
    one per refused start. A refused start now leaves the runtime directory as it found it."""
    xdg = _runtime_dir(tmp_path)
    console_token = tmp_path / "console.token"
    console_token.write_text("c" * 32 + "\n")
    console_token.chmod(0o644)
    argv = castor_argv("serve", "--tcp", "127.0.0.1:0",
                       *(str(console_token) if a == "CONSOLE_TOKEN" else a for a in extra))
    done = subprocess.run(argv, env={**serve_env(tmp_path), "XDG_RUNTIME_DIR": str(xdg)}, cwd=str(tmp_path),
                          stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2, done.stderr
    assert len(done.stderr.strip().splitlines()) == 1 and done.stderr.startswith("castor: "), done.stderr
    assert "Traceback" not in done.stderr
    assert sorted(p.name for p in xdg.rglob("*") if not p.is_dir()) == []


class _Listener:
    """A plain TCP listener on every local address that records what its first peer sends."""

    def __init__(self) -> None:
        import socket
        import threading

        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.sock.bind(("0.0.0.0", 0))
        self.sock.listen(4)
        self.port = self.sock.getsockname()[1]
        self.received = b""
        self.accepted = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        try:
            peer, _ = self.sock.accept()
        except OSError:
            return
        self.accepted.set()
        with peer:
            peer.settimeout(5)
            try:
                while chunk := peer.recv(1 << 16):
                    self.received += chunk
            except OSError:
                pass

    def close(self) -> None:
        self.sock.close()


def _non_loopback_address() -> str:
    """An address of this machine that is not loopback (a peer elsewhere could reach it)."""
    import socket

    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        try:
            probe.connect(("192.0.2.1", 9))  # TEST-NET-1: no packet is sent by a UDP connect
            address = probe.getsockname()[0]
        except OSError:
            address = ""
    if not address or address.startswith("127."):
        pytest.skip("this machine has no non-loopback IPv4 address")
    return address


def test_a_token_is_never_sent_to_a_non_loopback_address(tmp_path):
    """``castor serve`` listens on loopback only because the token travels in clear text; but
    ``castor inspect --tcp HOST:PORT --token-file F`` (and ``Client.connect_tcp(..., token_file=F)``)
    connected to any host and sent the token in its first frame: a mistyped or planted address
    handed the endpoint's secret to whoever listened there, across the network. Now a token is
    never sent off this machine: ``forbidden`` before anything connects (inspect: one line, exit 2)."""
    from castor.client import Client
    from castor.messages.errors import Forbidden

    token_file = tmp_path / "endpoint.token"
    token_file.write_text("s" * 43 + "\n")
    token_file.chmod(0o600)
    host = _non_loopback_address()
    listener = _Listener()
    try:
        done = subprocess.run(castor_argv("inspect", "--tcp", f"{host}:{listener.port}", "--token-file",
                                          str(token_file)),
                              env=serve_env(tmp_path), cwd=str(tmp_path), stdin=subprocess.DEVNULL,
                              capture_output=True, text=True, timeout=60)
        assert done.returncode == 2, done.stderr
        assert done.stderr.startswith("castor: forbidden:") and len(done.stderr.strip().splitlines()) == 1, \
            done.stderr
        with pytest.raises(Forbidden):
            Client.connect_tcp(host, listener.port, token_file=str(token_file), default_timeout=5)
        with pytest.raises(Forbidden):
            Client.connect_tcp(host, listener.port, token="s" * 43, default_timeout=5)
        assert not listener.accepted.is_set() and b"s" * 43 not in listener.received
    finally:
        listener.close()


def _console_handler_threads() -> int:
    import threading

    return sum("process_request_thread" in t.name for t in threading.enumerate())


def _console_handler_threads_settled(bound: int) -> int:
    """The handler threads, once none is a handler that gave its slot back but has not yet ended
    (its slot is released in its thread's last frame, and the next connection's thread may start
    before that thread is gone: one more for a moment, never more). Waits at most 5 s for the
    count to come within ``bound``; a count that stays above it is returned as it is."""
    import time

    deadline = time.monotonic() + 5
    count = _console_handler_threads()
    while count > bound and time.monotonic() < deadline:
        time.sleep(0.01)
        count = _console_handler_threads()
    return count


def test_a_crowd_of_silent_console_connections_costs_a_bounded_number_of_threads():
    """The console's listener is open to every local user, before any token: each connection it
    accepted got a thread of castor's process until its request arrived (10 s of silence, or
    forever for a peer trickling a byte every few seconds), with no bound on how many, and a
    listen backlog of 5 (a burst of connections waited a second per six in SYN retries). A crowd
    of them could take the threads the runtime's actors need. Now at most MAX_CONNECTIONS are
    served at once, the backlog takes a burst, and when the slots are full the connection that
    has waited longest for its request is closed to make room: a request still gets its answer
    while the crowd keeps coming."""
    import http.client
    import socket
    import time

    from castor.console.server import MAX_CONNECTIONS, ConsoleServer

    console = ConsoleServer(None, "127.0.0.1", 0, token="t" * 32).start()
    crowd: list[socket.socket] = []
    try:
        deadline = time.monotonic() + 30
        for _ in range(4 * MAX_CONNECTIONS):
            peer = socket.create_connection(("127.0.0.1", console.port), timeout=max(0.1, deadline - time.monotonic()))
            peer.sendall(b"G")  # the start of a request line that never ends
            crowd.append(peer)
            assert _console_handler_threads_settled(MAX_CONNECTIONS) <= MAX_CONNECTIONS
        assert time.monotonic() < deadline, "a burst of connections waited on a small listen backlog"
        # The oldest silent peers were closed to make room for the newer ones.
        first = crowd[0]
        first.settimeout(10)
        assert first.recv(4096) == b""
        # A request is served while the crowd holds every slot.
        conn = http.client.HTTPConnection("127.0.0.1", console.port, timeout=10)
        try:
            conn.request("GET", "/", headers={"Host": f"127.0.0.1:{console.port}"})
            assert conn.getresponse().status == 401  # served (and refused for want of the token)
        finally:
            conn.close()
        assert _console_handler_threads_settled(MAX_CONNECTIONS) <= MAX_CONNECTIONS
    finally:
        for peer in crowd:
            peer.close()
        console.stop()


def test_a_console_with_every_slot_mid_request_answers_503_at_once(monkeypatch):
    """When no connection is waiting for its request (every slot is serving one), a newcomer is
    answered 503 at once and closed: the accepting thread never waits on it."""
    import socket
    import threading

    from castor.console import server as console_server

    release = threading.Event()
    entered: list[int] = []  # one entry per request being served

    def slow_page(*_base: str) -> str:
        entered.append(1)
        release.wait(30)
        return "page"

    monkeypatch.setattr(console_server, "MAX_CONNECTIONS", 2)
    monkeypatch.setattr(console_server.pages, "tree_page", slow_page)
    console = console_server.ConsoleServer(None, "127.0.0.1", 0, token="t" * 32).start()
    busy: list[socket.socket] = []
    try:
        head = (f"GET / HTTP/1.1\r\nHost: 127.0.0.1:{console.port}\r\nAuthorization: Bearer {'t' * 32}\r\n\r\n")
        for _ in range(2):
            peer = socket.create_connection(("127.0.0.1", console.port), timeout=10)
            peer.sendall(head.encode())
            busy.append(peer)
        both_served = threading.Event()
        while len(entered) < 2 and not both_served.wait(0.05):  # bounded by the test's timeout
            pass
        with socket.create_connection(("127.0.0.1", console.port), timeout=10) as newcomer:
            answer = b""
            while chunk := newcomer.recv(4096):
                answer += chunk
        assert answer.startswith(b"HTTP/1.1 503"), answer
    finally:
        release.set()
        for peer in busy:
            peer.close()
        console.stop()


def test_a_console_peer_trickling_its_request_is_closed_at_the_request_deadline(monkeypatch):
    """The console's 10 s was per read: a peer sending one byte of its request line every few
    seconds held its connection (and a thread, and now one of the bounded slots) for as long as
    it liked, so a handful of them kept the console from everyone. The request line and headers
    must now all arrive within SOCKET_TIMEOUT_S of the connection asking (here 1 s)."""
    import socket
    import threading
    import time

    from castor.console import server as console_server

    monkeypatch.setattr(console_server, "SOCKET_TIMEOUT_S", 1.0)
    console = console_server.ConsoleServer(None, "127.0.0.1", 0, token="t" * 32).start()
    try:
        peer = socket.create_connection(("127.0.0.1", console.port), timeout=10)
        peer.settimeout(0.2)
        started = time.monotonic()
        closed = threading.Event()
        pace = threading.Event()
        request = b"GET /" + b"a" * 1000
        for byte in request:
            try:
                peer.sendall(bytes([byte]))
                if peer.recv(4096) == b"":
                    closed.set()
                    break
            except TimeoutError:
                pass
            except OSError:
                closed.set()
                break
            if time.monotonic() - started > 20:
                break
            pace.wait(0.1)  # the attack's own pace: a byte every tenth of a second
        assert closed.is_set(), "the trickling peer was never closed"
        assert time.monotonic() - started < 10
        peer.close()
    finally:
        console.stop()


def test_console_peers_pipelining_requests_they_never_read_cannot_lock_a_token_holder_out(monkeypatch):
    """A peer without the token sent its requests back to back (HTTP/1.1 keeps the connection
    open) and never read the answers: each 401 was written, the socket's buffers filled, and the
    handler blocked writing the next one -- a connection whose request had arrived, so it was never
    the one evicted to make room. A few such peers held every slot, and the user, token in hand,
    was answered 503 for as long as they kept sending (and until castor had answered every request
    they had queued). A request the console refuses (401, 403) is now the connection's last: it is
    answered and closed, so a peer without the token holds a slot for one small answer at most."""
    import http.client
    import socket
    import time

    from castor.console import server as console_server

    token = "t" * 32
    monkeypatch.setattr(console_server, "MAX_CONNECTIONS", 4)
    console = console_server.ConsoleServer(None, "127.0.0.1", 0, token=token).start()
    crowd: list[socket.socket] = []
    try:
        burst = f"GET / HTTP/1.1\r\nHost: 127.0.0.1:{console.port}\r\n\r\n".encode() * 2000
        for _ in range(8):
            peer = socket.socket()
            peer.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # and it never reads
            peer.connect(("127.0.0.1", console.port))
            peer.setblocking(False)
            crowd.append(peer)
        deadline = time.monotonic() + 3  # the crowd keeps sending while the user asks
        while time.monotonic() < deadline:
            for peer in crowd:
                try:
                    peer.send(burst)
                except OSError:  # its buffers are full, or the console closed it
                    pass
            time.sleep(0.05)  # the attack's own pace
        statuses = []
        for _ in range(3):
            conn = http.client.HTTPConnection("127.0.0.1", console.port, timeout=10)
            try:
                conn.request("GET", "/", headers={"Host": f"127.0.0.1:{console.port}",
                                                         "Authorization": f"Bearer {token}"})
                statuses.append(conn.getresponse().status)
            finally:
                conn.close()
            for peer in crowd:
                try:
                    peer.send(burst)
                except OSError:
                    pass
        assert statuses == [200, 200, 200], statuses
    finally:
        for peer in crowd:
            peer.close()
        console.stop()


def test_console_peers_that_reset_their_connections_cannot_fill_castor_s_stderr(capfd, monkeypatch):
    """The console's server printed a traceback on stderr (where `castor serve` logs, often to a
    file) for every connection that ended in an error of the peer's making: a reset before its
    request was whole, an answer it had gone away from. Any local user could write about 2 KB
    there per connect, for as long as they liked. Such an ending is now a debug line of castor's
    log; stderr hears nothing of it."""
    import socket
    import struct
    import threading

    from castor.console import server as console_server
    from tests.support.waiting import wait_for

    ended: list[int] = []
    serve_one = console_server._Server.process_request_thread

    def counted(self: console_server._Server, request: socket.socket, address: object) -> None:
        try:
            serve_one(self, request, address)
        finally:
            ended.append(1)

    monkeypatch.setattr(console_server._Server, "process_request_thread", counted)
    console = console_server.ConsoleServer(None, "127.0.0.1", 0, token="t" * 32).start()
    try:
        capfd.readouterr()
        heads = (b"GET / HTTP/1.1\r\nHost: x\r\n", b"G", b"GET / HTTP/1.1\r\n\r\n" * 200)
        sent = threading.Event()
        for head in heads:
            for _ in range(5):
                peer = socket.create_connection(("127.0.0.1", console.port), timeout=10)
                peer.sendall(head)
                sent.wait(0.02)  # the request reaches the console before the reset
                peer.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))  # a reset
                peer.close()
        wait_for(lambda: len(ended) == 5 * len(heads), timeout=30, what="every connection's handler ended")
        err = capfd.readouterr().err
        assert "Traceback" not in err and "Exception occurred" not in err, err[-2000:]
    finally:
        console.stop()


def test_a_console_request_head_is_bounded_before_the_token_is_checked():
    """The console read a request's headers as the standard library does: up to 100 lines of 64 KiB
    each, all kept until the blank line, before any token was checked. Every local user could make
    castor hold 6 MB per connection, 400 MB across its 64 slots (and keep it so, a new connection
    for each one closed). The headers of a request may now be MAX_HEAD_BYTES in all; past that the
    answer is 431 and the connection is closed."""
    import socket

    from castor.console.server import MAX_HEAD_BYTES, ConsoleServer

    console = ConsoleServer(None, "127.0.0.1", 0, token="t" * 32).start()
    try:
        peer = socket.create_connection(("127.0.0.1", console.port), timeout=10)
        peer.sendall(f"GET / HTTP/1.1\r\nHost: 127.0.0.1:{console.port}\r\n".encode())
        line = b"X-Filler: " + b"a" * 60_000 + b"\r\n"
        sent = 0
        try:
            for _ in range(50):  # 3 MB, under the standard library's 100 lines
                peer.sendall(line)
                sent += len(line)
        except OSError:  # the console closed it
            pass
        peer.settimeout(5)
        try:
            answer = peer.recv(4096)
        except ConnectionResetError:
            answer = b""
        except TimeoutError:
            answer = b"(nothing: the console was still reading)"
        assert answer == b"" or answer.startswith(b"HTTP/1.1 431"), answer[:100]
        assert sent <= 2 * MAX_HEAD_BYTES + 2 * len(line) or answer.startswith(b"HTTP/1.1 431"), sent
        peer.close()
    finally:
        console.stop()


@pytest.mark.parametrize("request_head", [
    "GET / HTTP/1.1\r\nHost: {good}\r\nHost: evil.example\r\n",  # two Hosts: the first was checked
    "GET / HTTP/1.1\r\nHost: evil.example\r\nHost: {good}\r\n",
    "GET http://evil.example/ HTTP/1.1\r\nHost: {good}\r\n",  # absolute form: its authority is the host
], ids=["good-then-evil", "evil-then-good", "absolute-form"])
def test_a_console_request_naming_another_host_anywhere_is_refused(request_head):
    """The DNS-rebinding check read the first ``Host`` header only: a request with a second one
    naming another host (which a proxy or a later reader may take as the host), or in absolute
    form naming another authority (which HTTP/1.1 says overrides ``Host``), was served 200 with
    the token. A request must name the console's own address exactly once, and nothing else."""
    import socket

    from castor.console.server import ConsoleServer

    token = "t" * 32
    console = ConsoleServer(None, "127.0.0.1", 0, token=token).start()
    try:
        head = request_head.format(good=f"127.0.0.1:{console.port}")
        with socket.create_connection(("127.0.0.1", console.port), timeout=10) as peer:
            peer.sendall(f"{head}Authorization: Bearer {token}\r\nConnection: close\r\n\r\n".encode())
            answer = b""
            while chunk := peer.recv(65536):
                answer += chunk
        assert answer.split(b"\r\n", 1)[0] in (b"HTTP/1.1 403 Forbidden", b"HTTP/1.1 400 Bad Request"), answer[:200]
    finally:
        console.stop()


@pytest.mark.skipif(not hasattr(__import__("os"), "geteuid") or __import__("os").geteuid() != 0,
                    reason="needs root to listen as another user")
def test_a_token_is_never_sent_to_a_unix_socket_another_user_listens_on(tmp_path):
    """A socket in a shared sticky directory (``/tmp/castor.sock``, which ``serve`` accepts) can be
    planted by another user while castor's serve is down: ``castor inspect --socket PATH
    --token-file F`` (and ``Client.connect_unix(..., token_file=F)``) connected and sent F's
    token in its hello to whoever listened there. Now a client checks the listener's user
    (``SO_PEERCRED``) first: another user's socket is ``forbidden`` and hears no token."""
    import shutil
    import socket
    import tempfile

    from castor.client import Client
    from castor.messages.errors import Forbidden

    shared = Path(tempfile.mkdtemp(prefix="castor-shared-", dir="/tmp"))  # the other user must reach it
    shared.chmod(0o1777)  # sticky and world-writable, like /tmp
    path = shared / "castor.sock"
    token_file = tmp_path / "endpoint.token"
    token_file.write_text("s" * 43 + "\n")
    token_file.chmod(0o600)
    try:
        with another_user_listening(path) as (_, heard):
            done = subprocess.run(castor_argv("inspect", "--socket", str(path), "--token-file", str(token_file)),
                                  env=serve_env(tmp_path), cwd=str(tmp_path), stdin=subprocess.DEVNULL,
                                  capture_output=True, text=True, timeout=60)
            assert done.stderr.startswith("castor: forbidden:") and len(done.stderr.strip().splitlines()) == 1, \
                done.stderr
            with pytest.raises(Forbidden):
                Client.connect_unix(str(path), token_file=str(token_file), default_timeout=5)
            # What the other user heard: nothing with the token in it.
            probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            probe.connect(str(path))
            assert b"s" * 43 not in heard_up_to_our_end(probe, heard)
    finally:
        shutil.rmtree(shared, ignore_errors=True)


@pytest.mark.skipif(not hasattr(__import__("os"), "geteuid") or __import__("os").geteuid() != 0,
                    reason="needs root to listen as another user")
def test_a_client_without_a_token_never_talks_to_a_loopback_port_another_user_listens_on(tmp_path):
    """``Client.connect_tcp(HOST, PORT)`` without a token checked nobody on a loopback port: a
    harness said hello and opened its session on another user's listener. The listener's user is
    checked (``/proc/net/tcp``) token or not on this machine: ``forbidden``, nothing sent."""
    import socket

    from castor.client import Client
    from castor.messages.errors import Forbidden

    with another_user_listening(("127.0.0.1", 0)) as (port, read_end):
        with pytest.raises(Forbidden) as refused:
            Client.connect_tcp("127.0.0.1", port, default_timeout=5)
        assert refused.value.data.get("reason") == "peer_uid"
        assert heard_up_to_our_end(socket.create_connection(("127.0.0.1", port)), read_end) == b"END"


@pytest.mark.skipif(not hasattr(__import__("os"), "geteuid") or __import__("os").geteuid() != 0,
                    reason="needs root to listen as another user")
def test_a_client_without_a_token_never_talks_to_a_unix_socket_another_user_listens_on(tmp_path):
    """``Client.connect_unix(PATH)`` without a token checked nobody: a harness on a socket another
    user planted in a shared sticky directory (while castor's serve was down) said hello and
    opened its session there, handing that user the project's path and every request. The
    listener's user is checked token or not: another user's socket is ``forbidden`` and hears
    nothing (a real castor of another user refuses such a client anyway)."""
    import shutil
    import socket
    import tempfile

    from castor.client import Client
    from castor.messages.errors import Forbidden

    shared = Path(tempfile.mkdtemp(prefix="castor-shared-", dir="/tmp"))  # the other user must reach it
    shared.chmod(0o1777)
    path = shared / "castor.sock"
    try:
        with another_user_listening(path) as (_, heard):
            with pytest.raises(Forbidden) as refused:
                Client.connect_unix(str(path), default_timeout=5)
            assert refused.value.data.get("reason") == "peer_uid"
            probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            probe.connect(str(path))
            assert heard_up_to_our_end(probe, heard) == b"END"  # not even a hello
    finally:
        shutil.rmtree(shared, ignore_errors=True)


@pytest.mark.skipif(not hasattr(__import__("os"), "geteuid") or __import__("os").geteuid() != 0,
                    reason="needs root to listen as another user")
@pytest.mark.parametrize("family", ["ipv4", "ipv6"])
def test_a_token_is_never_sent_to_a_tcp_port_another_user_listens_on(tmp_path, family):
    """A loopback port is anyone's to take while castor's serve is down (or before it starts):
    another user listening on the port a ``--token-file`` serve uses heard the token in the
    hello of ``castor inspect --tcp HOST:PORT --token-file F`` (and of ``Client.connect_tcp``),
    and could then open a trusted session on the real serve once it was back. Now a client asks
    the kernel who owns the other end (``/proc/net/tcp``) first: another user's listener is
    ``forbidden`` and hears no token."""
    import socket

    from castor.client import Client
    from castor.messages.errors import Forbidden

    if family == "ipv6" and not socket.has_ipv6:
        pytest.skip("no IPv6")
    host = "127.0.0.1" if family == "ipv4" else "::1"
    token_file = tmp_path / "endpoint.token"
    token_file.write_text("t" * 43 + "\n")
    token_file.chmod(0o600)
    # Made as that user (tests/support/other_user.py): made as root, a check before the accept
    # saw root (allowed) and the token went out (a CI flake).
    with another_user_listening((host, 0)) as (port, read_end):
        shown = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
        done = subprocess.run(castor_argv("inspect", "--tcp", shown, "--token-file", str(token_file)),
                              env=serve_env(tmp_path), cwd=str(tmp_path), stdin=subprocess.DEVNULL,
                              capture_output=True, text=True, timeout=60)
        assert done.stderr.startswith("castor: forbidden:") and len(done.stderr.strip().splitlines()) == 1, \
            done.stderr
        with pytest.raises(Forbidden) as refused:
            Client.connect_tcp(host, port, token_file=str(token_file), default_timeout=5)
        assert refused.value.data.get("reason") == "peer_uid"
        # What the other user heard: nothing with the token in it.
        assert b"t" * 43 not in heard_up_to_our_end(socket.create_connection((host, port)), read_end)


def test_a_client_with_a_token_still_reaches_castor_s_own_tcp_serve(tmp_path):
    """The owner check passes for castor's own user's listener (``serve`` in a subprocess)."""
    import socket

    from castor.endpoint.listeners import tcp_peer_is_us

    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.bind(("127.0.0.1", 0))
    listener.listen(1)
    try:
        sock = socket.create_connection(listener.getsockname()[:2], timeout=5)
        try:
            assert tcp_peer_is_us(sock)
        finally:
            sock.close()
    finally:
        listener.close()


def test_a_console_asked_for_on_localhost_is_shown_at_the_address_it_listens_on(tmp_path):
    """``castor serve --console localhost:PORT`` listened on 127.0.0.1 alone but printed
    ``http://localhost:PORT/`` beside its token file. A browser (and any resolver whose hosts file
    has ``::1 localhost``) tries ``[::1]:PORT`` first -- an address castor does not hold, which any
    local user may take -- so the user's ``?token=`` went to another user's listener. The console
    is now shown at the address it is bound to, and still answers a ``Host: localhost`` request."""
    import re
    import urllib.request

    xdg = _runtime_dir(tmp_path)
    argv = castor_argv("serve", "--socket", str(tmp_path / "c.sock"), "--console", "localhost:0")
    proc = subprocess.Popen(argv, env={**serve_env(tmp_path), "XDG_RUNTIME_DIR": str(xdg)}, cwd=str(tmp_path),
                            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        line = proc.stderr.readline()
        match = re.search(r"console: (http://([^/]+)/) \(token file: ([^)]+)\)", line)
        assert match is not None, line
        url, authority, token_file = match.groups()
        assert authority.startswith("127.0.0.1:"), line
        token = Path(token_file).read_text().strip()
        with urllib.request.urlopen(f"{url}api/actors?token={token}", timeout=10) as reply:
            assert reply.status == 200
        port = authority.rsplit(":", 1)[1]
        request = urllib.request.Request(f"{url}api/actors", headers={"Host": f"localhost:{port}",
                                                                      "Authorization": f"Bearer {token}"})
        with urllib.request.urlopen(request, timeout=10) as reply:
            assert reply.status == 200
    finally:
        proc.terminate()
        proc.wait(30)
        proc.stderr.close()


def _other_users_dir(path: Path, mode: int = 0o777) -> Path:
    import os

    path.mkdir(mode=mode)
    path.chmod(mode)
    os.chown(path, 65534, 65534)
    return path


@pytest.mark.skipif(not hasattr(__import__("os"), "geteuid") or __import__("os").geteuid() != 0,
                    reason="needs root to give a directory to another user")
@pytest.mark.parametrize("command", [("soak", "--sessions", "1", "--casts", "1", "--seconds", "1", "--no-icarus"),
                                     ("demo", "--quiet")], ids=["soak", "demo"])
@pytest.mark.parametrize("where", ["another-users-dir", "world-writable", "under-another-users-dir"])
def test_a_workdir_another_user_could_plant_files_in_is_refused_before_anything_is_written(tmp_path, command,
                                                                                             where):
    """``castor soak`` and ``castor demo`` took any existing ``--workdir`` and wrote into it by name:
    in a directory another user owns or may write to, a ``soak.log``/``demo.log`` they planted as a
    link took castor's log lines into any file of castor's user (``~/.bashrc``), and project files
    they planted there (``projects/soak-0/.pi/pi-materia.json``) chose what the run's *trusted*
    sessions execute. Such a workdir -- or one under a directory another user owns -- is now
    refused (``forbidden``, one line, exit 2) before a file is written."""
    import os

    victim = tmp_path / "victim_rc"
    victim.write_text("# the user's own file\n")
    if where == "another-users-dir":
        work = _other_users_dir(tmp_path / "shared", 0o755)
    elif where == "world-writable":
        work = tmp_path / "shared"
        work.mkdir()
        work.chmod(0o777)
    else:
        work = _other_users_dir(tmp_path / "theirs", 0o755) / "mine"
        work.mkdir()
    log = work / ("soak.log" if command[0] == "soak" else "demo.log")
    os.symlink(victim, log)
    before = sorted(p.name for p in work.iterdir())
    done = subprocess.run(castor_argv(command[0], "--workdir", str(work), *command[1:]), env=serve_env(tmp_path),
                          cwd=str(tmp_path), stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=100)
    assert done.returncode == 2, (done.returncode, done.stderr[-2000:])
    assert done.stderr.startswith("castor: forbidden:") and len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert victim.read_text() == "# the user's own file\n"
    assert sorted(p.name for p in work.iterdir()) == before


@pytest.mark.skipif(not hasattr(__import__("os"), "geteuid") or __import__("os").geteuid() != 0,
                    reason="needs root to listen as another user")
def test_another_user_on_the_other_address_of_localhost_never_keeps_a_client_from_castor(tmp_path, monkeypatch):
    """castor's serve binds one address of ``localhost`` (127.0.0.1); where the name also resolves
    to ``::1`` first, another user listening on ``[::1]:PORT`` made every ``localhost:PORT`` client
    refuse (``peer_uid``) instead of trying 127.0.0.1, where castor was. The client now tries each
    address and takes the first whose listener is its own user's; the other user hears nothing."""
    import socket

    from castor.client import Client
    from castor.endpoint import Dispatcher, Server

    if not socket.has_ipv6:
        pytest.skip("no IPv6")
    token = "t" * 43
    dispatcher = Dispatcher()
    dispatcher.register("echo", lambda params, _ctx: params)
    server = Server(dispatcher, tcp=("127.0.0.1", 0), token=token).start()
    port = server.address[1]
    real = socket.getaddrinfo

    def localhost_v6_first(host, *args, **kwargs):
        if host == "localhost":
            return [*real("::1", *args, **kwargs), *real("127.0.0.1", *args, **kwargs)]
        return real(host, *args, **kwargs)

    try:
        with another_user_listening(("::1", port)) as (_, read_end):
            monkeypatch.setattr(socket, "getaddrinfo", localhost_v6_first)
            with Client.connect_tcp("localhost", port, token=token, default_timeout=5) as client:
                assert client.call("echo", {"ok": 1}) == {"ok": 1}
            monkeypatch.undo()
            assert token.encode() not in heard_up_to_our_end(socket.create_connection(("::1", port)), read_end)
    finally:
        server.stop()

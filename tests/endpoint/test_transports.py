"""Round trips over every transport, both directions, and the listener rules."""

from __future__ import annotations

import os
import socket
import stat
import threading

import pytest

from castor.client import Client
from castor.endpoint import Server
from castor.endpoint.dispatch import Dispatcher
from castor.endpoint.listeners import bind_unix
from castor.endpoint.transport import PipeTransport
from castor.messages.errors import Conflict, Forbidden, InvalidConfig, InvalidParams, NotFound

from .conftest import build_dispatcher, start_server


def exercise(client: Client) -> None:
    """The same conversation on every transport."""
    hello = client.call("runtime.hello", {"client": "test"})
    assert "echo" in hello["methods"] and hello["capabilities"] == ["test"]
    assert client.call("echo", {"s": "héllo", "b": b"\x00\xff", "n": [1, 2.5, None]}) == \
        {"s": "héllo", "b": b"\x00\xff", "n": [1, 2.5, None]}
    assert client.call("add", {"a": 2, "b": 3}) == 5
    with pytest.raises(InvalidParams):
        client.call("add", {"a": "x"})
    with pytest.raises(NotFound) as info:
        client.call("fail")
    assert info.value.data == {"cast_id": "c1"}
    # castor → client request, answered by a client handler
    client.on_request("session.append_entry", lambda p: {"stored": p["entry"]})
    out = client.call("call_back", {"method": "session.append_entry", "params": {"entry": "e1"}})
    assert out == {"result": {"stored": "e1"}}
    # a server request for a method the client does not have
    out = client.call("call_back", {"method": "model.list"})
    assert out["error"] == "unknown_method"


def test_unix_round_trip(client: Client) -> None:
    exercise(client)


def test_tcp_round_trip(gates) -> None:
    srv = Server(build_dispatcher(gates), tcp=("127.0.0.1", 0), token="t" * 32).start()
    try:
        host, port = srv.address
        with Client.connect_tcp(host, port, default_timeout=10, token="t" * 32) as client:
            exercise(client)
            sock = client.connection.transport._sock
            assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY)
    finally:
        srv.stop()


def test_stdio_round_trip_in_process(gates) -> None:
    """Stdio mode on pipes instead of the process's own fd 0/1."""
    c2s_r, c2s_w = os.pipe()
    s2c_r, s2c_w = os.pipe()
    shutdown = threading.Event()
    srv = Server(build_dispatcher(gates), stdio=True, stdin_fd=c2s_r, stdout_fd=s2c_w,
                 on_shutdown=shutdown.set).start()
    client = Client(PipeTransport(s2c_r, c2s_w), default_timeout=10)
    exercise(client)
    client.close()  # EOF on the server's stdin shuts the whole server down
    assert srv.wait(5) and shutdown.is_set()


def test_server_notifications_reach_client_handlers(client: Client) -> None:
    got = threading.Event()
    seen = []
    client.on_notification("ui.status", lambda p: (seen.append(len(p["blob"])), got.set()))
    assert client.call("push", {"count": 1, "size": 10}) == {"sent": 1}
    assert got.wait(5) and seen == [10]


def test_client_notifications_are_dispatched_without_response(client: Client, gates) -> None:
    client.notify("call_back", {"method": "model.list"})
    assert gates.done.wait(5)
    assert gates.results["model.list"]["error"] == "unknown_method"


def test_concurrent_callers_share_one_client(client: Client) -> None:
    errors = []

    def worker(k: int) -> None:
        for i in range(100):
            if client.call("echo", {"k": k, "i": i}) != {"k": k, "i": i}:
                errors.append((k, i))

    threads = [threading.Thread(target=worker, args=(k,)) for k in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert not errors


@pytest.mark.parametrize("host", ["LOCALHOST", "LocalHost"])
def test_localhost_in_any_case_is_the_loopback(gates, host) -> None:
    """A host name is case-insensitive: ``--tcp LOCALHOST:0`` (and ``--console``) was refused as a
    non-loopback host while ``localhost`` was taken; the client reaches it by that name too."""
    srv = Server(build_dispatcher(gates), tcp=(host, 0), token="t" * 32).start()
    try:
        _addr, port = srv.address
        with Client.connect_tcp(host, port, default_timeout=10, token="t" * 32) as client:
            assert client.call("add", {"a": 2, "b": 3}) == 5
    finally:
        srv.stop()


@pytest.mark.parametrize("host", ["0.0.0.0", "192.168.1.10", "::", "example.com"])
def test_tcp_refuses_non_loopback_hosts(gates, host) -> None:
    with pytest.raises(Forbidden) as info:
        Server(build_dispatcher(gates), tcp=(host, 0)).start()
    assert "loopback" in info.value.message


def test_unix_socket_is_private(server: Server) -> None:
    assert stat.S_IMODE(os.stat(server.address).st_mode) == 0o600


def test_stale_socket_is_replaced_and_live_one_refused(gates, sock_dir) -> None:
    path = os.path.join(sock_dir, "c.sock")
    stale = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    stale.bind(path)
    stale.close()  # file left behind, nobody listening
    srv = start_server(gates, sock_dir)
    try:
        with Client.connect_unix(path) as c:
            assert c.call("add", {"a": 1}) == 1
        with pytest.raises(Conflict):
            bind_unix(path)  # a live server is never displaced
    finally:
        srv.stop()
    assert not os.path.exists(path)  # removed on stop


def test_non_socket_file_is_never_replaced(gates, sock_dir) -> None:
    path = os.path.join(sock_dir, "c.sock")
    with open(path, "w") as f:
        f.write("precious")
    with pytest.raises(Conflict):
        start_server(gates, sock_dir)
    with open(path) as f:
        assert f.read() == "precious"


def test_stop_closes_connections_fails_pending_and_runs_hook(gates, sock_dir) -> None:
    hook = threading.Event()
    srv = start_server(gates, sock_dir, on_shutdown=hook.set)
    client = Client.connect_unix(srv.address)
    pending = client.call_async("block", timeout=10)
    assert gates.entered.wait(5)
    assert len(srv.connections()) == 1
    srv.stop()
    assert hook.is_set() and srv.connections() == []
    with pytest.raises(Exception) as info:
        pending.result()
    assert info.value.code == "cancelled"  # ConnectionClosed
    assert client.connection.wait_closed(5)
    with pytest.raises(OSError):
        Client.connect_unix(srv.address)


def test_exactly_one_mode_is_required() -> None:
    with pytest.raises(InvalidConfig):
        Server(Dispatcher(), stdio=True, tcp=("127.0.0.1", 0))
    with pytest.raises(InvalidConfig):
        Server(Dispatcher())


def test_connection_limit_refuses_extra_clients(gates, sock_dir) -> None:
    srv = start_server(gates, sock_dir, max_connections=1)
    try:
        with Client.connect_unix(srv.address) as first:
            assert first.call("add", {"a": 1}) == 1
            from .conftest import RawPeer
            extra = RawPeer(srv.address)
            frames = extra.read_until_eof()
            assert frames and frames[0][1] == "error" and frames[0][2][0]["code"] == "mailbox_full"
            assert first.call("add", {"a": 2}) == 2
    finally:
        srv.stop()


@pytest.mark.timeout(30)
@pytest.mark.parametrize("kind", ["socket", "pipe"])
def test_a_read_allocates_what_arrived_and_big_writes_arrive_whole(kind: str) -> None:
    """A read copies out what arrived from the transport's own buffer: no RECV_CHUNK-sized block
    per read (that churned the malloc arenas of a long-lived server, or cost mmap/munmap per frame;
    docs/performance.md, bench/longrun.py), and a write bigger than the buffer arrives intact."""
    import tracemalloc

    from castor.endpoint.transport import RECV_CHUNK, SocketTransport

    if kind == "socket":
        left, right = socket.socketpair()
        reader, writer = SocketTransport(left), SocketTransport(right)
    else:
        r1, w1 = os.pipe()
        r2, w2 = os.pipe()
        reader, writer = PipeTransport(r1, w2), PipeTransport(r2, w1)
    try:
        writer.sendall(b"x" * 100)
        tracemalloc.start()
        try:
            assert reader.read_available() == b"x" * 100
            assert tracemalloc.get_traced_memory()[1] < RECV_CHUNK // 4
        finally:
            tracemalloc.stop()
        payload = os.urandom(3 * RECV_CHUNK + 17)
        sender = threading.Thread(target=writer.sendall, args=(payload,))
        sender.start()
        got = bytearray()
        while len(got) < len(payload):
            chunk = reader.read_available()
            assert chunk
            assert len(chunk) <= RECV_CHUNK
            got += chunk
        sender.join(10)
        assert bytes(got) == payload
    finally:
        reader.close()
        writer.close()


@pytest.mark.timeout(30)
@pytest.mark.parametrize("op", ["read", "write"])
def test_a_pipe_closed_under_a_read_or_write_never_touches_the_pipe_that_reuses_its_numbers(
        op: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """A connection's reader passes the transport's ``closed`` check and is descheduled before its
    ``readv`` (a writer before its ``write``); another thread closes the transport, and the next
    pipe the process opens takes the same fd numbers. Were the fds closed at once, the old thread
    would read the new pipe's bytes (a request lost: the flake of the interrupted-call test) or
    write into it. The fds stay open until the last read or write in progress returns."""
    a_r, a_w = os.pipe()  # the transport reads a_r
    b_r, b_w = os.pipe()  # and writes b_w
    transport = PipeTransport(a_r, b_w)
    os.write(a_w, b"old")  # what the paused read finds (poll said readable)
    paused, go = threading.Event(), threading.Event()
    real_readv, real_write = os.readv, os.write
    me: list[int] = []

    def gated_readv(fd: int, buffers: list) -> int:
        if threading.get_ident() in me:
            paused.set()
            assert go.wait(10)
        return real_readv(fd, buffers)

    def gated_write(fd: int, data: bytes) -> int:
        if threading.get_ident() in me:
            paused.set()
            assert go.wait(10)
        return real_write(fd, data)

    monkeypatch.setattr(os, "readv", gated_readv)
    monkeypatch.setattr(os, "write", gated_write)
    got: dict[str, object] = {}

    def old_thread() -> None:
        me.append(threading.get_ident())
        try:
            got["value"] = transport.read_available() if op == "read" else transport.sendall(b"stale")
        except OSError as exc:
            got["error"] = exc.errno

    t = threading.Thread(target=old_thread)
    t.start()
    assert paused.wait(10)
    transport.close()
    new_r, new_w = os.pipe()  # the numbers a closed transport would have given back
    new_b_r, new_b_w = os.pipe()
    try:
        os.write(new_w, b"new request")
        go.set()
        t.join(10)
        assert not t.is_alive()
        if op == "read":
            assert got == {"value": b"old"}
        # the new pipes carry only their own bytes
        os.write(new_b_w, b"mine")
        assert real_readv(new_r, [bytearray(64)]) == len(b"new request")
        assert os.read(new_b_r, 64) == b"mine"
        # and the old transport's fds are closed now: its peers see end of stream
        assert os.read(b_r, 64) == (b"stale" if op == "write" else b"")
        assert os.read(b_r, 64) == b""
        with pytest.raises(OSError):
            os.write(a_w, b"x")  # the read end is gone (EPIPE; SIGPIPE is ignored by Python)
    finally:
        for fd in (new_r, new_w, new_b_r, new_b_w, a_w, b_r):
            os.close(fd)


@pytest.mark.timeout(30)
def test_a_socket_directory_that_refuses_writes_names_the_socket_not_castors_scaffolding(tmp_path, monkeypatch):
    """`castor serve --socket RO/c.sock` on a read-only mount said ``storage_unavailable:
    RO/.csgdb31eer: Read-only file system``: the private directory the socket is bound in before
    its rename, a name the user never gave. The error names the socket's path."""
    import errno
    import tempfile

    from castor.cli.common import os_error_text

    def refused(prefix: str = "", dir: str = "") -> str:  # noqa: A002 - tempfile's keyword
        raise OSError(errno.EROFS, os.strerror(errno.EROFS), os.path.join(dir, prefix + "gdb31eer"))

    monkeypatch.setattr(tempfile, "mkdtemp", refused)
    path = str(tmp_path / "c.sock")
    with pytest.raises(OSError) as failed:
        bind_unix(path)
    assert failed.value.filename == path, failed.value
    assert os_error_text(failed.value) == f"{path}: Read-only file system (EROFS)"


@pytest.mark.timeout(30)
def test_a_client_refused_for_too_many_connections_is_told_why_not_only_cancelled(gates, sock_dir) -> None:
    """The server refuses a connection past its limit with a ``mailbox_full`` notification, then
    closes. castor's client read it into ``client.errors`` only; a call made on that connection
    failed ``cancelled: connection closed``, and a harness saw no reason. Once the client has read
    the notification, the call raises the server's typed error (chained to the close). (A call
    written before the notification is read fails its write and stays ``cancelled``.)"""
    from castor.messages.errors import MailboxFull
    from tests.support.waiting import poll_until

    srv = start_server(gates, sock_dir, max_connections=1)
    try:
        with Client.connect_unix(srv.address) as first:
            assert first.call("add", {"a": 1}) == 1
            with Client.connect_unix(srv.address) as extra:
                assert poll_until(lambda: extra.errors and extra.closed, timeout=10)
                with pytest.raises(MailboxFull) as refused:
                    extra.call("add", {"a": 2}, timeout=10)
                assert "too many connections" in refused.value.message
                assert refused.value.__cause__ is not None and refused.value.__cause__.code == "cancelled"
            assert first.call("add", {"a": 3}) == 3
    finally:
        srv.stop()


def _refused_socket(address: str) -> socket.socket:
    """A connection the server has refused and closed already (its ``error`` notification waits,
    unread, in this socket): nothing this client writes from now on reaches anyone."""
    import select

    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.connect(address)
    poller = select.poll()
    poller.register(sock, select.POLLRDHUP)  # the server's close (its notification comes first)
    events = poller.poll(10_000)
    assert events and events[0][1] & (select.POLLRDHUP | select.POLLHUP), "the server did not refuse the connection"
    return sock


@pytest.mark.timeout(60)
def test_a_call_written_before_the_refusal_was_read_raises_the_refusal_not_cancelled(gates, sock_dir) -> None:
    """The server refuses a connection past its limit with a ``mailbox_full`` notification and
    closes it. A client whose call went out before it had read that notification failed the
    write (``EPIPE``) and closed at once, the notification still unread in its socket: the call
    ended ``cancelled`` (``write failed: Broken pipe``), most of the time, and the harness never
    learnt why. The client now reads what the server sent before a failed write closes the
    connection, so every call the refusal ended -- sent before or after, ``call`` or
    ``call_async`` -- raises the server's ``mailbox_full``, chained to the close's ``cancelled``."""
    from castor.client import _caller_socket
    from castor.messages.errors import MailboxFull

    srv = start_server(gates, sock_dir, max_connections=1)
    try:
        with Client.connect_unix(srv.address) as first:
            assert first.call("add", {"a": 1}) == 1
            for attempt in range(20):  # the reader and the write race: each ordering must hold
                with Client(_caller_socket(_refused_socket(srv.address))) as extra:
                    if attempt % 2:
                        pending = extra.call_async("add", {"a": 2}, timeout=10)
                        with pytest.raises(MailboxFull) as refused:
                            pending.result()
                    else:
                        with pytest.raises(MailboxFull) as refused:
                            extra.call("add", {"a": 2}, timeout=10)
                    assert "too many connections" in refused.value.message, attempt
                    assert refused.value.__cause__ is not None and refused.value.__cause__.code == "cancelled"
                    with pytest.raises(MailboxFull):  # and a call after it: the same reason
                        extra.call_async("add", {"a": 3}).result()
            assert first.call("add", {"a": 3}) == 3
    finally:
        srv.stop()


@pytest.mark.timeout(30)
def test_a_call_the_user_cancelled_stays_cancelled_after_a_refused_notification(gates, sock_dir) -> None:
    """An ``error`` notification that did not end the connection (a refused frame) is not the
    reason a call fails when the user closes the client: that call stays ``cancelled``. The
    client took any ``error`` notification of the last 2 s for the server's parting reason."""
    from castor.endpoint.errors import ConnectionClosed

    srv = start_server(gates, sock_dir)
    try:
        client = Client.connect_unix(srv.address, default_timeout=10)
        try:
            client.connection.transport.sendall(b"\x07")  # a bare number: refused, the connection stays
            from tests.support.waiting import wait_for

            wait_for(lambda: client.errors, timeout=10, what="the server's invalid_frame notification")
            assert client.call("add", {"a": 1}) == 1
            pending = client.call_async("block", {}, timeout=10)
            assert gates.entered.wait(10)
        finally:
            client.close()
        with pytest.raises(ConnectionClosed) as cancelled:
            pending.result()
        assert cancelled.value.data["reason"] == "client closed"
        with pytest.raises(ConnectionClosed):
            client.call("add", {"a": 2})
    finally:
        gates.release.set()
        srv.stop()


@pytest.mark.timeout(30)
def test_params_a_client_cannot_send_are_invalid_params_not_internal_and_nothing_is_lost(client: Client) -> None:
    """Params msgpack cannot carry (an object, data nested past the packer's depth) or over the
    protocol's limits are the caller's input, never sent. ``call`` raised ``internal`` -- the code
    for castor's own bugs -- and ``notify`` a bare ``TypeError``/``ValueError``. Now both raise
    ``invalid_params`` (``data.reason``, ``may_have_started: false``) and the connection goes on."""
    deep: object = 0
    for _ in range(2000):
        deep = [deep]
    cases = [({"o": object()}, "params_not_serialisable"), ({"deep": deep}, "params_not_serialisable"),
             ({"n": 2**70}, "params_not_serialisable"), ({"s": "x" * (9 << 20)}, "params_too_large")]
    for params, reason in cases:
        with pytest.raises(InvalidParams) as bad:
            client.call("echo", params)
        assert bad.value.data["reason"] == reason and bad.value.may_have_started is False, bad.value
        assert bad.value.data["method"] == "echo"
    for params, _reason in cases[:3]:
        with pytest.raises(InvalidParams) as bad:
            client.notify("echo", params)
        assert bad.value.data["reason"] == "params_not_serialisable"
    assert not client.closed and client.call("add", {"a": 4}) == 4


@pytest.mark.timeout(30)
def test_a_call_s_timeout_must_be_a_deadline(client: Client, gates) -> None:
    """Every call has a deadline. A NaN timeout never passed (``now >= nan`` is false): the call
    waited for ever; a string raised a bare ``TypeError``; zero or below sent the request and then
    gave up on it at once (``may_have_started: true``), work started for nobody. Now NaN, infinity
    and non-numbers are ``invalid_params`` and zero or below ``timeout`` with
    ``may_have_started: false``, nothing sent either way; the connection goes on."""
    from castor.messages.errors import Timeout

    for bad in (float("nan"), float("inf"), "5", [1]):
        with pytest.raises(InvalidParams) as refused:
            client.call("block", {}, timeout=bad)
        assert refused.value.data["reason"] == "invalid_timeout" and refused.value.may_have_started is False
        with pytest.raises(InvalidParams):
            client.call_async("block", {}, timeout=bad)
    for passed in (0, -1, 0.0):
        with pytest.raises(Timeout) as late:
            client.call("block", {}, timeout=passed)
        assert late.value.may_have_started is False and late.value.data["reason"] == "deadline_passed"
    assert not gates.entered.is_set(), "a call with no deadline was sent"
    assert client.call("add", {"a": 5}, timeout=5) == 5


@pytest.mark.timeout(30)
def test_a_connection_still_closing_holds_no_slot(gates, sock_dir, monkeypatch) -> None:
    """A connection is marked closed at once, but its slot is given back by the last step of its
    close (its callbacks). A client arriving in between, on a full endpoint, was refused
    ``mailbox_full``: the closing connection counted, and being closed, it could not be evicted to
    make room. Seen as a flaky refusal right after a readiness probe's connect-and-close."""
    from castor.endpoint.server import Server as ServerClass

    releasing, release = threading.Event(), threading.Event()
    untrack = ServerClass._untrack

    def held_untrack(self, conn) -> None:
        releasing.set()
        release.wait(20)
        untrack(self, conn)

    monkeypatch.setattr(ServerClass, "_untrack", held_untrack)
    srv = start_server(gates, sock_dir, max_connections=1)
    try:
        probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        probe.connect(srv.address)
        probe.close()  # the server sees its end of stream and closes it: held before the slot is given back
        assert releasing.wait(10)
        with Client.connect_unix(srv.address, default_timeout=10) as second:
            assert second.call("add", {"a": 1}) == 1
        release.set()
    finally:
        release.set()
        srv.stop()


@pytest.mark.timeout(30)
def test_a_replaced_send_nowait_carries_every_write_of_the_hot_paths(server: Server, client: Client) -> None:
    """The caller's request and the server's inline answer are written with the socket's own
    ``send`` in the connection's frame (no transport frame a write). A ``send_nowait`` replaced on
    the transport -- tests make a peer fail so -- must still carry each of those writes, on both
    sides, or a failure it stands for would not happen."""
    assert client.call("echo", {"x": 0}) == {"x": 0}  # the server's connection exists, its worker reads
    [served] = server.connections()
    written: dict[str, list[bytes]] = {"client": [], "server": []}
    for side, transport in (("client", client.connection.transport), ("server", served.transport)):
        real = transport.send_nowait

        def counting(data: bytes | memoryview, real=real, side=side) -> int | None:
            written[side].append(bytes(data))
            return real(data)

        transport.send_nowait = counting
    for i in range(1, 4):
        assert client.call("echo", {"x": i}) == {"x": i}
    assert len(written["client"]) == 3 and all(b"echo" in frame for frame in written["client"])
    assert len(written["server"]) == 3

"""Connection guarantees: isolation, bounds, deadlines, prompt failure on close."""

from __future__ import annotations

import os
import socket
import threading
import time

import msgpack
import pytest

from castor.client import Client
from castor.endpoint import ConnectionClosed, ConnectionSettings, Server
from castor.endpoint.transport import SocketTransport
from castor.messages.errors import CastorError, MailboxFull, Timeout
from tests.support.waiting import poll_until

from .conftest import SMALL_QUEUE, RawPeer, start_server


def test_slow_client_never_stalls_another(gates, sock_dir) -> None:
    """A peer that never reads overflows only its own queue and is closed; others keep going."""
    srv = start_server(gates, sock_dir, settings=SMALL_QUEUE)
    try:
        stuck = RawPeer(srv.address)
        stuck.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        assert poll_until(lambda: len(srv.connections()) == 1)
        stuck_conn = srv.connections()[0]
        good = Client.connect_unix(srv.address, default_timeout=5)
        # The stuck peer asks for 2000 x 64 KiB of notifications and never reads them.
        stuck.send_value([0, 1, "push", [{"count": 2000, "size": 65536}]])
        assert gates.done.wait(5), "the producer blocked on a stuck peer"
        assert gates.results["push"] < 2000
        assert stuck_conn.wait_closed(5) and "overflow" in stuck_conn.close_reason
        assert stuck_conn not in srv.connections()
        for i in range(50):
            assert good.call("echo", {"i": i}) == {"i": i}
        good.close()
    finally:
        srv.stop()


def test_slow_handler_does_not_block_reading(client: Client, gates) -> None:
    slow = client.call_async("block", timeout=10)
    assert gates.entered.wait(5)
    # Same connection: fast calls are answered while "block" still runs.
    for i in range(20):
        assert client.call("add", {"a": i}, timeout=5) == i
    assert not slow.done()
    gates.release.set()
    assert slow.result() == "released"


def test_slow_inline_handler_hands_reading_over(client: Client, server: Server, gates) -> None:
    """The thread running "block" held the reader role; another worker took it over."""
    slow = client.call_async("block", timeout=10)
    assert gates.entered.wait(5)
    assert client.call("add", {"a": 1}, timeout=5) == 1
    conn = server.connections()[0]
    assert conn.counters["role_steals"] >= 1
    gates.release.set()
    assert slow.result() == "released"


def test_server_notification_while_client_is_idle(client: Client) -> None:
    got = threading.Event()
    client.on_notification("ui.notify", lambda p: got.set())
    assert client.call("push_later", {"delay": 0.05}) == "scheduled"
    assert got.wait(5), "nobody was reading the idle client's socket"


def test_a_reading_thread_handler_has_run_before_the_call_that_read_it_returns(client: Client) -> None:
    seen: list[int] = []
    client.on_notification("ui.status", lambda p: seen.append(threading.get_ident()), on_reading_thread=True)
    for n in range(1, 101):
        assert client.call("push", {"size": 1, "count": 3}) == {"sent": 3}
        # Sent before the answer, so handled before the call returned, by the thread that read them.
        assert len(seen) == 3 * n
    # That is the calling thread whenever it reads its own reply, as it does here call after call.
    # (On a slow host the client's worker may take the reader role back between two calls, after
    # _RETAKE_AFTER: it then reads and handles them itself, still before the reply it reads next.)
    me = threading.get_ident()
    assert seen.count(me) >= len(seen) // 2, f"{seen.count(me)} of {len(seen)} on the calling thread"
    # Registered again without the flag: back on the client's worker threads.
    done = threading.Event()
    elsewhere: list[int] = []

    def on_worker(_p: dict) -> None:
        elsewhere.append(threading.get_ident())
        done.set()

    client.on_notification("ui.status", on_worker)
    assert client.call("push", {"size": 1, "count": 1}) == {"sent": 1}
    assert done.wait(5) and elsewhere[0] != threading.get_ident()


def test_a_reading_thread_handler_still_runs_while_no_call_waits(client: Client) -> None:
    got = threading.Event()
    client.on_notification("ui.notify", lambda p: got.set(), on_reading_thread=True)
    assert client.call("push_later", {"delay": 0.05}) == "scheduled"
    assert got.wait(5), "a notification read by the client's own worker was not handled"


def test_server_calls_client_from_a_non_handler_thread(client: Client, server: Server) -> None:
    client.on_request("model.list", lambda p: {"models": [{"id": "m"}]})
    assert client.call("echo", {}) == {}
    conn = server.connections()[0]
    results = []
    threads = [threading.Thread(target=lambda: results.append(conn.call("model.list", {}, timeout=5)))
               for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    assert results == [{"models": [{"id": "m"}]}] * 4


def test_caller_blocked_in_recv_fails_promptly_on_close(client: Client, gates) -> None:
    errors = []
    t = threading.Thread(target=lambda: errors.append(_capture(lambda: client.call("block", timeout=30))))
    t.start()
    assert gates.entered.wait(5)
    client.close()
    t.join(5)  # the handler blocks 10 s and the call's deadline is 30 s: only the close ends it first
    assert not t.is_alive()
    assert isinstance(errors[0], ConnectionClosed)


def _capture(fn):
    try:
        return fn()
    except Exception as exc:  # returned for the assertion
        return exc


def test_outbound_call_deadline_and_late_reply_counted(client: Client, server: Server) -> None:
    answer = threading.Event()

    def slow_entry(params):
        answer.wait(10)
        return {"ok": True}

    client.on_request("session.append_entry", slow_entry)
    out = client.call("call_back", {"method": "session.append_entry", "timeout": 0.2})
    assert out["error"] == "timeout" and out["data"]["may_have_started"] is True  # the entry answers after 10 s
    assert not answer.is_set()
    answer.set()
    conn = server.connections()[0]
    assert poll_until(lambda: conn.counters["late_replies"] == 1)
    assert conn.counters["call_timeouts"] == 1


def test_client_call_deadline(client: Client, gates) -> None:
    with pytest.raises(Timeout) as info:
        client.call("block", timeout=0.1)
    assert info.value.may_have_started is True
    gates.release.set()
    assert poll_until(lambda: client.connection.counters["late_replies"] == 1)
    assert client.call("add", {"a": 1}) == 1


def test_pending_calls_fail_promptly_on_close(client: Client, gates) -> None:
    pending = [client.call_async("block", timeout=30) for _ in range(3)]
    assert gates.entered.wait(5)
    client.close()
    for p in pending:  # cancelled by the close, not ended by their 30 s deadline or the 10 s handler
        with pytest.raises(ConnectionClosed) as info:
            p.result()
        assert info.value.code == "cancelled" and info.value.may_have_started
    assert not gates.release.is_set()
    with pytest.raises(ConnectionClosed):
        client.call("echo", {})


def test_server_side_pending_call_fails_when_client_disconnects(client: Client, gates) -> None:
    entered = threading.Event()
    client.on_request("classifier.complete", lambda p: (entered.set(), time.sleep(30)))
    client.call_async("call_back", {"method": "classifier.complete", "timeout": 30})
    assert entered.wait(5)
    client.connection.transport.close()  # vanish without answering
    assert gates.done.wait(5)
    assert gates.results["classifier.complete"]["type"] == "ConnectionClosed"


def test_in_flight_limit_answers_mailbox_full(gates, sock_dir) -> None:
    settings = ConnectionSettings(max_in_flight=2, max_workers=4)
    srv = start_server(gates, sock_dir, settings=settings)
    try:
        with Client.connect_unix(srv.address, default_timeout=10) as c:
            held = [c.call_async("block") for _ in range(2)]
            assert poll_until(lambda: [c.stats()["in_flight"] for c in srv.connections()] == [2])
            with pytest.raises(MailboxFull):
                c.call("echo", {})
            gates.release.set()
            assert [h.result() for h in held] == ["released", "released"]
            assert c.call("echo", {"x": 1}) == {"x": 1}
    finally:
        srv.stop()


def test_handler_crash_is_internal_and_connection_survives(client: Client) -> None:
    for _ in range(3):
        with pytest.raises(Exception) as info:
            client.call("boom")
        assert info.value.code == "internal" and "ZeroDivision" not in info.value.message
    assert client.call("add", {"a": 4}) == 4


def test_wrong_shape_frames_keep_the_connection(server: Server) -> None:
    peer = RawPeer(server.address)
    peer.send_value([7, 1, 2])                    # unknown frame type → error notification
    assert peer.read()[:2] == [2, "error"]
    peer.send_value([0, 5, 99, [{}]])             # valid msgid, bad method → answered on msgid 5
    frame = peer.read()
    assert frame[0:2] == [1, 5] and frame[2]["code"] == "invalid_frame"
    peer.send_value([0, 6, "echo", {"not": "wrapped"}])
    frame = peer.read()
    assert frame[0:2] == [1, 6] and frame[2]["code"] == "invalid_params"
    peer.send_value([0, 7, "nope", [{}]])
    assert peer.read()[2]["code"] == "unknown_method"
    peer.send_value([0, 8, "echo", [{"still": "alive"}]])
    assert peer.read() == [1, 8, None, {"still": "alive"}]
    peer.close()


def test_undecodable_bytes_close_only_that_connection(server: Server, client: Client) -> None:
    peer = RawPeer(server.address)
    peer.send(b"\xc1\xc1\xc1")
    frames = peer.read_until_eof()
    assert frames == [[2, "error", [{"code": "invalid_frame", "message": frames[0][2][0]["message"]}]]]
    assert client.call("echo", {"ok": 1}) == {"ok": 1}


def test_frames_split_and_batched_arbitrarily(server: Server) -> None:
    peer = RawPeer(server.address)
    blob = b"".join(msgpack.packb([0, i, "add", [{"a": i}]]) for i in range(50))
    for i in range(0, len(blob), 3):
        peer.send(blob[i:i + 3])
    answers = {peer.read()[1]: None for _ in range(50)}
    assert sorted(answers) == list(range(50))
    peer.close()


def test_half_closed_peer_still_gets_its_answers(server: Server) -> None:
    peer = RawPeer(server.address)
    peer.send(b"".join(msgpack.packb([0, i, "add", [{"a": i}]]) for i in range(5)))
    peer.sock.shutdown(socket.SHUT_WR)
    frames = peer.read_until_eof()
    assert sorted(f[3] for f in frames) == [0, 1, 2, 3, 4]


def test_connections_release_their_file_descriptors(server: Server) -> None:
    def open_fds() -> int:
        return len(os.listdir("/proc/self/fd"))

    with Client.connect_unix(server.address) as warm:
        warm.call("echo", {})
    assert poll_until(lambda: server.connections() == [])
    base = open_fds()
    for i in range(50):
        with Client.connect_unix(server.address) as c:
            assert c.call("echo", {"i": i}) == {"i": i}
    assert poll_until(lambda: server.connections() == [] and open_fds() <= base)


def test_a_result_or_notification_over_the_limits_is_never_sent(client: Client) -> None:
    """The peer's decoder (same limits) would drop the whole connection on it: the caller gets a
    typed error instead, and the connection goes on."""
    from castor.endpoint.framing import FrameLimits

    limit = FrameLimits().max_str_len
    assert len(client.call("huge", {"size": 1000})) == 1000
    with pytest.raises(CastorError) as too_big:
        client.call("huge", {"size": limit + 1})
    assert too_big.value.code == "internal" and too_big.value.data["reason"] == "result_too_large"
    assert client.call("push", {"size": limit + 1, "count": 1}) == {"sent": 0}  # refused, logged
    elements = FrameLimits().max_array_len
    with pytest.raises(CastorError) as too_long:  # a small frame (~70 KB) over the element limit
        client.call("many", {"count": elements + 1})
    assert too_long.value.data["reason"] == "result_too_large"
    assert len(client.call("many", {"count": elements})) == elements
    assert client.call("add", {"a": 1, "b": 2}) == 3  # the same connection, still fine


@pytest.mark.timeout(60)
def test_a_client_that_waits_for_each_reply_is_never_refused_at_the_in_flight_limit(
        gates, sock_dir, monkeypatch) -> None:
    # The request's slot stops counting for the limit before its response is written: the next
    # request, sent the moment the reply arrives, may reach the reader before the handler's thread
    # is done. The handler's thread is held back after each response here to make that certain.
    from castor.endpoint import connection as connection_module

    real_send = connection_module.Connection._send

    def send_then_stall(self, frame, *args, **kwargs):
        sent = real_send(self, frame, *args, **kwargs)
        if bytes(frame[:2]) == b"\x94\x01":  # a response frame: [1, msgid, error, result]
            time.sleep(0.005)
        return sent

    monkeypatch.setattr(connection_module.Connection, "_send", send_then_stall)
    settings = ConnectionSettings(max_in_flight=1, max_workers=2)
    srv = start_server(gates, sock_dir, settings=settings)
    try:
        with Client.connect_unix(srv.address, default_timeout=10) as c:
            for n in range(50):
                assert c.call("echo", {"n": n}) == {"n": n}
    finally:
        srv.stop()


@pytest.mark.timeout(30)
def test_workers_a_burst_of_slow_handlers_grew_end_once_idle_and_the_pool_grows_again(gates, sock_dir) -> None:
    """A long-lived connection gives back the threads a burst needed, keeps one, and grows again."""
    srv = start_server(gates, sock_dir, settings=ConnectionSettings(worker_idle_exit=0.2))
    client = Client.connect_unix(srv.address, default_timeout=10)
    try:
        slow = [client.call_async("block", timeout=10) for _ in range(3)]
        assert gates.entered.wait(5)
        conn = srv.connections()[0]
        # Each slow handler overtaken keeps its thread; reading went on, on a new one.
        assert poll_until(lambda: conn.stats()["threads"] >= 3, timeout=5)
        assert client.call("add", {"a": 1}, timeout=5) == 1
        gates.release.set()
        assert [c.result() for c in slow] == ["released"] * 3
        assert poll_until(lambda: conn.stats()["threads"] == 1, timeout=10), conn.stats()
        assert conn.counters["workers_exited_idle"] >= 2
        assert conn.stats()["threads"] == 1  # the last one stays
        for i in range(20):
            assert client.call("add", {"a": i}, timeout=5) == i
        # The pool grows again: a slow handler is overtaken and calls are still answered meanwhile.
        gates.release.clear()
        gates.entered.clear()
        again = client.call_async("block", timeout=10)
        assert gates.entered.wait(5)
        assert client.call("add", {"a": 2}, timeout=5) == 2
        gates.release.set()
        assert again.result() == "released"
    finally:
        gates.release.set()
        client.close()
        srv.stop()


@pytest.mark.timeout(30)
def test_a_write_that_fails_closes_without_running_the_close_callbacks_on_the_writing_thread(
        client: Client, server: Server) -> None:
    """Any thread may write (an actor's, inside a handler) and a write that finds the peer gone
    closes the connection. Its close callbacks close the connection's sessions, which waits for
    their actors -- the writer's among them, were the callbacks run on the writer's thread (it
    waited the whole close bound). They run on a thread of their own: the write returns at once."""
    import errno

    assert client.call("echo", {"x": 1}) == {"x": 1}
    [conn] = server.connections()
    release = threading.Event()
    ran_on: list[str] = []

    def slow_callback(_conn) -> None:
        ran_on.append(threading.current_thread().name)
        release.wait(20)  # a session close waiting for the writer's own actor

    conn.add_close_callback(slow_callback)

    def broken(_data):
        raise BrokenPipeError(errno.EPIPE, "Broken pipe")

    conn.transport.send_nowait = broken
    outcome: list[bool] = []
    writer = threading.Thread(target=lambda: outcome.append(conn.notify("ui.status", {"key": "k", "text": "t"})),
                              name="an-actor-thread")
    writer.start()
    writer.join(5)
    try:
        assert not writer.is_alive(), "the failed write waited for the close callbacks"
        assert outcome == [False]
        assert conn.closed and conn.close_reason.startswith("write failed")
        assert poll_until(lambda: ran_on, timeout=5)
        assert ran_on != ["an-actor-thread"]
        assert conn not in server.connections()
    finally:
        release.set()


@pytest.mark.timeout(30)
@pytest.mark.parametrize(("marker", "kind"), [(b"\xdb", "string"), (b"\xc6", "binary")])
def test_a_string_or_binary_announced_over_its_limit_closes_the_connection_at_its_header(
        server: Server, client: Client, marker: bytes, kind: str) -> None:
    """msgpack checks a string's length only once the whole string is buffered: a peer announcing
    a 100 MiB string was read until 16 MiB of it had arrived (the frame limit), held in memory,
    however slowly it sent it. Now the header alone closes the connection, with the reason."""
    peer = RawPeer(server.address)
    peer.send(b"\x94\x00\x01\xa4echo\x91\x81\xa1k" + marker + (100 * 2**20).to_bytes(4, "big") + b"z" * 1000)
    frames = peer.read_until_eof(timeout=10)  # no more bytes are sent: the header must do
    [[kind_, method, [error]]] = frames
    assert (kind_, method, error["code"]) == (2, "error", "invalid_frame")
    assert f"a {kind} of {100 * 2**20} bytes announced, over the 8388608-byte {kind} limit" in error["message"]
    assert client.call("echo", {"ok": 1}) == {"ok": 1}  # the other connection goes on


@pytest.mark.timeout(30)
def test_a_connection_s_log_lines_name_it_as_its_threads_do(server):
    """An accepted connection is renamed ``unix-N`` (``castor inspect`` lists its threads as
    ``castor-unix-N-w1 for /endpoint/unix-N``), but its log lines kept the name it had a moment
    before, ``conn-N``: an operator could not tie a connection's log to what inspect showed."""
    from loguru import logger

    from castor.supervision.threads import running_threads

    lines: list[dict] = []
    sink = logger.add(lambda m: lines.append(dict(m.record["extra"], message=m.record["message"])), level="DEBUG")
    try:
        client = Client.connect_unix(server.address, default_timeout=10)
        assert client.call("echo", {"x": 1}) == {"x": 1}
        owners = {row["owner"] for row in running_threads("/endpoint")
                  if row["owner"].startswith("/endpoint/") and "client" not in row["owner"]}  # the server's side

        def closed() -> list[dict]:
            return [ln for ln in lines if ln["message"].startswith("connection closed") and "client" not in ln["conn"]]

        client.close()
        assert poll_until(closed, timeout=10), lines
    finally:
        logger.remove(sink)
    assert owners == {f"/endpoint/{closed()[0]['conn']}"}, (owners, closed())


@pytest.mark.timeout(60)
def test_a_storm_of_failing_notifications_writes_one_warning_not_one_each(server):
    """A notification whose handler fails (here: an unknown method) has nobody to answer but the
    log, and a warning line each let a peer that sends them in a loop write the log full (200 000 of
    them wrote 18 MB in 10 s). Now one warning names the first, later ones within the interval are
    debug lines and counted; the next warning says how many there were. Other calls go on."""
    from loguru import logger

    warnings: list[str] = []
    sink = logger.add(lambda m: warnings.append(m.record["message"]), level="WARNING",
                      filter=lambda r: r["message"].startswith("notification "))
    try:
        with Client.connect_unix(server.address, default_timeout=10) as client:
            assert client.call("echo", {"x": 1}) == {"x": 1}
            [conn] = server.connections()
            frame = msgpack.packb([2, "no.such.method", [{}]])
            client.connection.transport.sendall(frame * 2000)

            def handled() -> int:  # failed in the handler, or refused over the in-flight limit (under load)
                return conn.counters["notifications_failed"] + conn.counters["rejected_in_flight"]

            assert poll_until(lambda: handled() == 2000, timeout=30), conn.counters
            failed = conn.counters["notifications_failed"]
            assert failed > 100, conn.counters
            assert client.call("echo", {"x": 2}) == {"x": 2}
            first = list(warnings)
            conn._notify_gate.warned_at -= 3600  # the interval has passed: the next failure warns with the count
            client.connection.transport.sendall(frame)
            assert poll_until(lambda: conn.counters["notifications_failed"] == failed + 1, timeout=10)
    finally:
        logger.remove(sink)
    assert len(first) == 1 and "no.such.method" in first[0] and "unknown_method" in first[0], first
    assert len(warnings) == 2, warnings
    assert f"({failed - 1} more notifications failed since the last such line)" in warnings[1], warnings


@pytest.mark.timeout(30)
@pytest.mark.parametrize("error, expected", [
    ("boom", "boom"),  # a bare string: what many msgpack-rpc peers send
    ({"code": 5, "message": "numbered"}, "numbered"),
    ({"message": "no code"}, "no code"),
])
def test_an_answer_whose_error_slot_is_not_castor_s_map_fails_its_call_at_once(error, expected) -> None:
    """A response on a call's msgid whose error is not ``nil`` or a map with a string code was taken
    for a bad frame and dropped: the call waited for its whole deadline (a turn's: minutes) and
    ended ``timeout`` as if the peer had never answered. It now fails at once, typed: the peer's own
    text in the message, an unknown or missing code kept in ``data.wire_code`` (as for any code
    castor does not know). The connection goes on."""
    left, right = socket.socketpair()
    client = Client(SocketTransport(left), default_timeout=20)
    peer = msgpack.Unpacker(raw=False)
    try:
        def next_request() -> list:
            right.settimeout(10)
            while True:
                for frame in peer:
                    if frame[0] == 0:
                        return frame
                peer.feed(right.recv(65536))

        started = time.monotonic()
        pending = client.call_async("work", {})
        right.sendall(msgpack.packb([1, next_request()[1], error, None]))
        with pytest.raises(CastorError) as failed:
            pending.result()
        assert time.monotonic() - started < 10 and not isinstance(failed.value, Timeout), failed.value
        assert expected in failed.value.message and failed.value.code == "internal"
        if isinstance(error, dict):
            assert failed.value.data["wire_code"] == str(error.get("code"))
        pending = client.call_async("again", {})
        right.sendall(msgpack.packb([1, next_request()[1], None, "fine"]))
        assert pending.result() == "fine"
    finally:
        client.close()
        right.close()


@pytest.mark.timeout(30)
def test_a_write_the_gone_peer_refuses_still_lets_the_answers_it_sent_resolve_their_calls() -> None:
    """The peer answered a call and then went away; before anything read that answer, the next
    call's write failed (``EPIPE``) and closed the connection: the answered call failed
    ``cancelled`` too, its answer lost in the socket, and the peer's ``error`` notification with it.
    The close now reads what the peer sent before it went: the answered call gets its result, a
    trailing ``error`` notification is handled, and only the call that was never answered fails.
    (No reader runs here -- the connection is not started -- so the write always comes first.)"""
    from castor.endpoint import Dispatcher
    from castor.endpoint.connection import Connection

    left, right = socket.socketpair()
    seen: list[dict] = []
    dispatcher = Dispatcher(builtin_hello=False)
    dispatcher.register("error", lambda params, _ctx: seen.append(params), on_reading_thread=True)
    conn = Connection(SocketTransport(left), dispatcher, name="no-reader")
    try:
        answered = conn.call_async("first", {}, timeout=10)
        peer = msgpack.Unpacker(raw=False)
        right.settimeout(10)
        peer.feed(right.recv(65536))
        [request] = list(peer)
        right.sendall(msgpack.packb([1, request[1], None, "the answer"])
                      + msgpack.packb([2, "error", [{"code": "mailbox_full", "message": "bye"}]]))
        right.close()
        with pytest.raises(CastorError):  # the write finds the peer gone: closed, never answered
            conn.call_async("second", {}, timeout=10).result()
        assert conn.closed and conn.close_reason.startswith("write failed")
        assert answered.result() == "the answer"
        assert seen == [{"code": "mailbox_full", "message": "bye"}]
    finally:
        conn.close()


@pytest.mark.parametrize("attempt", range(10))  # either side may go first: ten tries
def test_a_peer_gone_before_the_invalid_frame_notice_still_reads_as_invalid_frame(sock_dir, attempt) -> None:
    """A peer that sends bytes that are no msgpack-rpc and closes at once: the notice castor writes
    back fails (EPIPE), and the close read "write failed" (a CI run saw it) -- the calls fail with
    the reason castor decided to close for, ``invalid_frame``, whichever came first."""
    path = os.path.join(sock_dir, f"noise-{attempt}.sock")
    listener = socket.socket(socket.AF_UNIX)
    listener.bind(path)
    listener.listen(1)
    gone = threading.Event()

    def noise() -> None:
        conn, _ = listener.accept()
        conn.sendall(b"\xc1" * 16)  # 0xc1: never used in msgpack
        conn.close()
        gone.set()

    threading.Thread(target=noise, daemon=True).start()
    try:
        client = Client.connect_unix(path, default_timeout=5)
        assert gone.wait(5)
        with pytest.raises(ConnectionClosed) as raised:
            client.call("echo", {})
        assert str((raised.value.data or {}).get("reason", "")).startswith("invalid_frame"), raised.value.data
        client.close()
    finally:
        listener.close()

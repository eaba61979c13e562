"""A call interrupted from outside -- a signal handler raising on the main thread, as Ctrl-C's
``KeyboardInterrupt`` does -- propagates unchanged and leaves a connection that either works as
before (struck before the request reached the writer, or after the reply was taken) or is closed
with reason ``interrupted`` (struck while writing or waiting), and nothing stuck: no lock released
under another thread's hold, no thread waiting for a reader role nobody holds, no stranded call on
another thread, no idle client deaf to the server.

How the interrupt is placed: an interval timer fires 10-400 us into a call, and its handler raises
only when the frame it interrupted is inside the connection's or the client's code (anywhere
else it does nothing), so every raise this test counts struck inside a call. The client idles a
few milliseconds before each call, so its worker holds the reader role and the call often waits for
the hand-over: the waits the fix changed. Before the fix, runs of this test left a connection with
its waiting-callers count stuck at 1, raised ``RuntimeError: release unlocked lock`` from a
condition's wait, and left idle clients deaf to the server's notifications.
"""

from __future__ import annotations

import signal
import threading
import time
from collections.abc import Iterator
from types import FrameType

import pytest

from castor.client import Client
from castor.endpoint import Server
from castor.endpoint.connection import Connection
from castor.endpoint.errors import ConnectionClosed
from tests.endpoint.conftest import Gates, build_dispatcher, connect_over_pipes, start_server
from tests.support.waiting import poll_until

pytestmark = pytest.mark.skipif(threading.current_thread() is not threading.main_thread(),
                                reason="signal handlers run on the main thread only")

_INSIDE = ("castor/endpoint/", "castor/client.py")


class Interrupted(BaseException):
    """Stands for KeyboardInterrupt (a BaseException, so no ``except Exception`` takes it)."""


class AlarmTimeout(TimeoutError):
    """The other common kind: ``signal.alarm`` with a handler raising an ordinary exception."""


def _inside_a_call(frame: FrameType | None) -> bool:
    if frame is not None and frame.f_code.co_filename.endswith(("_weakrefset.py", "weakref.py")):
        return False  # a weakref callback run by the collector: Python ignores what it raises
    while frame is not None:
        name = frame.f_code.co_filename.replace("\\", "/")
        if any(part in name for part in _INSIDE):
            return True
        frame = frame.f_back
    return False


@pytest.fixture
def thread_failures() -> Iterator[list[str]]:
    """Exceptions that ended any thread during the test (a lock released under another thread's
    hold shows up here, as ``RuntimeError`` in the thread that held it)."""
    failures: list[str] = []
    old = threading.excepthook

    def hook(args: threading.ExceptHookArgs) -> None:
        failures.append(f"{args.thread.name if args.thread else '?'}: {args.exc_type.__name__}: {args.exc_value}")

    threading.excepthook = hook
    try:
        yield failures
    finally:
        threading.excepthook = old


class _PipeServer:
    """A server connection on a pair of pipes, in this process: a client on pipes has no receive
    timeout, so its callers wait in ``poll`` (the other waiting path)."""

    def __init__(self, gates: Gates) -> None:
        self.gates = gates
        self.connections: list[Connection] = []

    def connect(self) -> Client:
        server, client = connect_over_pipes(build_dispatcher(self.gates), default_timeout=10)
        self.connections.append(server)
        return client

    def stop(self) -> None:
        for conn in self.connections:
            conn.close("test over")


@pytest.mark.timeout(120)
@pytest.mark.parametrize("transport", ["unix", "pipe"])
@pytest.mark.parametrize("kind", [Interrupted, AlarmTimeout], ids=["base-exception", "exception"])
def test_a_call_interrupted_anywhere_leaves_a_working_or_a_closed_connection_and_nothing_hangs(
        kind: type[BaseException], transport: str, gates: Gates, sock_dir: str,
        thread_failures: list[str]) -> None:
    srv: Server | _PipeServer = start_server(gates, sock_dir) if transport == "unix" else _PipeServer(gates)

    def connect() -> Client:
        return (Client.connect_unix(srv.address, default_timeout=10) if isinstance(srv, Server)
                else srv.connect())
    struck = {"n": 0, "missed": 0}

    def handler(_signum: int, frame: FrameType | None) -> None:
        if _inside_a_call(frame):
            struck["n"] += 1
            raise kind("interrupt")
        struck["missed"] += 1

    old = signal.signal(signal.SIGALRM, handler)
    interrupted = completed = kept = closed = 0
    try:
        deadline = time.monotonic() + 20
        n = 0
        while time.monotonic() < deadline and interrupted < 60:
            n += 1
            client = connect()
            conn = client.connection
            try:
                # A second thread's call on the same connection, waiting when the interrupt comes:
                # it must end (answered, or ConnectionClosed), never hang.
                other: dict[str, object] = {}
                gates.release.clear()

                def other_call(client: Client = client, other: dict[str, object] = other) -> None:
                    try:
                        other["result"] = client.call("block", {}, timeout=10)
                    except ConnectionClosed as exc:
                        other["closed"] = exc.data.get("reason")

                t = threading.Thread(target=other_call, name="other-caller")
                t.start()
                assert gates.entered.wait(5)
                gates.entered.clear()
                for i in range(20):
                    time.sleep(0.003)  # idle: the client's worker takes the reader role back
                    signal.setitimer(signal.ITIMER_REAL, 0.00001 * (1 + (n * 7 + i) % 40))
                    try:
                        assert client.call("echo", {"i": i}, timeout=5) == {"i": i}
                        completed += 1
                    except kind:
                        interrupted += 1
                        break
                    finally:
                        signal.setitimer(signal.ITIMER_REAL, 0)
                else:
                    gates.release.set()
                    t.join(10)
                    assert not t.is_alive()
                    assert other == {"result": "released"}
                    continue
                assert not conn._mutex.locked() or poll_until(lambda conn=conn: not conn._mutex.locked())
                if not conn.closed:
                    # Struck before the request reached the writer or after the reply was taken:
                    # the connection is as it was. It answers, nothing waits for the reader role,
                    # the abandoned call (if sent) is dropped when its reply comes, and an idle
                    # client still reads what the server sends on its own.
                    kept += 1
                    assert client.call("echo", {"again": True}, timeout=5) == {"again": True}
                    gates.release.set()
                    t.join(10)
                    assert not t.is_alive() and other == {"result": "released"}
                    assert not conn._waiting_callers  # no call left: nobody waits for the role
                    assert poll_until(lambda conn=conn: not conn._pending), conn._pending
                    got = threading.Event()
                    client.on_notification("ui.notify", lambda _p, got=got: got.set())
                    assert client.call("push_later", {"delay": 0.02}) == "scheduled"
                    assert got.wait(5), "nobody read the idle client's socket after the interrupt"
                    continue
                # Struck while writing or waiting: closed, promptly and for good.
                closed += 1
                assert conn.close_reason == "interrupted"
                assert conn.counters["calls_interrupted"] == 1
                started = time.monotonic()
                with pytest.raises(ConnectionClosed) as info:
                    client.call("echo", {}, timeout=5)
                assert info.value.data.get("reason") == "interrupted"
                assert time.monotonic() - started < 1.0
                t.join(10)
                assert not t.is_alive(), "a call on another thread hung after the interrupt"
                assert other in ({"closed": "interrupted"}, {"result": "released"})
                # Every thread of the connection leaves, and its wake pipe is given back.
                assert poll_until(lambda conn=conn: conn.stats()["threads"] == 0), conn.stats()
                assert poll_until(lambda conn=conn: conn._fds_released)
                assert not conn._waiting_callers
                assert conn._role is None
            finally:
                gates.release.set()
                signal.setitimer(signal.ITIMER_REAL, 0)
                client.close()
        signal.signal(signal.SIGALRM, signal.SIG_IGN)
        assert interrupted >= 20 and closed >= 5, (interrupted, closed, kept, completed, struck)
        assert thread_failures == []
        # The server is unharmed: a fresh client still works, and notifications still reach it.
        with connect() as client:
            got = threading.Event()
            client.on_notification("ui.notify", lambda _p: got.set())
            assert client.call("push_later", {"delay": 0.02}) == "scheduled"
            assert got.wait(5), "nobody read the idle client's socket"
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)
        srv.stop()


@pytest.mark.timeout(30)
def test_a_reply_wait_interrupted_leaves_the_resolver_unharmed(gates: Gates, sock_dir: str,
                                                               thread_failures: list[str]) -> None:
    """The PendingCall's gate is a plain lock: a wait interrupted on it holds nothing, so the
    thread that later resolves the call (a reader) is not hit by a lock released under it."""
    from castor.endpoint.connection import PendingCall

    class _Conn:
        def await_reply(self, _call: PendingCall) -> None:
            raise AssertionError("not used")

    call = PendingCall(_Conn(), 1, "m", time.monotonic() + 5)  # type: ignore[arg-type]

    def handler(_signum: int, _frame: FrameType | None) -> None:
        raise Interrupted

    old = signal.signal(signal.SIGALRM, handler)
    try:
        signal.setitimer(signal.ITIMER_REAL, 0.02)
        with pytest.raises(Interrupted):
            call.wait_resolved(5)
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)
    resolver = threading.Thread(target=call.resolve, args=(None, "answer"))
    resolver.start()
    resolver.join(5)
    assert call.wait_resolved(1) and call.result() == "answer"
    assert call.wait_resolved(1), "a second waiter passes too"
    assert thread_failures == []

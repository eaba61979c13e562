"""Fixtures for the endpoint tests: a real server on a real socket, raw peers."""

from __future__ import annotations

import os
import socket
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import msgpack
import pytest

from castor.client import Client
from castor.endpoint import ConnectionSettings, Context, Dispatcher, Params, Server
from castor.endpoint.connection import Connection
from castor.endpoint.transport import PipeTransport
from castor.messages.errors import CastorError


class AddParams(Params):
    a: int
    b: int = 0


class Gates:
    """Events the test methods block on, so tests synchronise without sleeps."""

    def __init__(self) -> None:
        self.release = threading.Event()
        self.entered = threading.Event()
        self.results: dict[str, Any] = {}
        self.done = threading.Event()


def build_dispatcher(gates: Gates) -> Dispatcher:
    d = Dispatcher(capabilities={"test"})
    d.register("echo", lambda params, _ctx: params)
    d.register("add", lambda p, _ctx: p.a + p.b, AddParams)
    d.register("boom", lambda _p, _ctx: 1 / 0)

    def typed_fail(_p: dict, _ctx: Context) -> None:
        raise CastorError("no such cast", code="not_found", data={"cast_id": "c1"})

    d.register("fail", typed_fail)

    def block(_p: dict, _ctx: Context) -> str:
        gates.entered.set()
        if not gates.release.wait(10):
            raise RuntimeError("gate never released")
        return "released"

    d.register("block", block)

    def call_back(params: dict, ctx: Context) -> Any:
        """Call the client's ``method`` and report what happened."""
        try:
            result = ctx.call(params["method"], params.get("params", {}), timeout=params.get("timeout", 5))
            outcome = {"result": result}
        except CastorError as exc:
            outcome = {"error": exc.code, "type": type(exc).__name__, "data": exc.data}
        gates.results[params["method"]] = outcome
        gates.done.set()
        return outcome

    d.register("call_back", call_back)

    def push(params: dict, ctx: Context) -> dict:
        """Notify the peer ``count`` times with ``size`` bytes; never blocks."""
        blob = b"x" * params["size"]
        sent = 0
        for _ in range(params["count"]):
            if not ctx.connection.notify("ui.status", {"blob": blob}):
                break
            sent += 1
        gates.results["push"] = sent
        gates.done.set()
        return {"sent": sent}

    d.register("push", push)

    def push_later(params: dict, ctx: Context) -> str:
        """Answer first, then notify from another thread while no call is in flight."""
        conn = ctx.connection
        threading.Timer(params.get("delay", 0.05), lambda: conn.notify("ui.notify", {"message": "later"})).start()
        return "scheduled"

    d.register("push_later", push_later)
    d.register("huge", lambda params, _ctx: "x" * params["size"])  # a result of any size
    d.register("many", lambda params, _ctx: [0] * params["count"])  # an array of any length
    return d


@pytest.fixture
def gates() -> Iterator[Gates]:
    g = Gates()
    yield g
    g.release.set()


@pytest.fixture
def sock_dir() -> Iterator[str]:
    # Short path: AF_UNIX paths are limited to 107 bytes.
    d = tempfile.mkdtemp(prefix="cep-")
    yield d
    for name in os.listdir(d):
        try:
            os.unlink(os.path.join(d, name))
        except OSError:
            pass
    os.rmdir(d)


def connect_over_pipes(dispatcher: Dispatcher, **client_kwargs: Any) -> tuple[Connection, Client]:
    """A server-side connection and a client joined by two pipes in this process (the stdio case,
    where callers wait in ``poll``: pipes have no receive timeout). Close both when done."""
    to_server_r, to_server_w = os.pipe()
    to_client_r, to_client_w = os.pipe()
    server = Connection(PipeTransport(to_server_r, to_client_w, peer="test-stdio"), dispatcher,
                        name="pipe-srv").start()
    return server, Client(PipeTransport(to_client_r, to_server_w, peer="test-stdio"), **client_kwargs)


def start_server(gates: Gates, sock_dir: str, **kwargs: Any) -> Server:
    return Server(build_dispatcher(gates), unix_path=os.path.join(sock_dir, "c.sock"), **kwargs).start()


@pytest.fixture
def server(gates: Gates, sock_dir: str) -> Iterator[Server]:
    srv = start_server(gates, sock_dir)
    yield srv
    srv.stop()


@pytest.fixture
def client(server: Server) -> Iterator[Client]:
    c = Client.connect_unix(server.address, default_timeout=10)
    yield c
    c.close()


class RawPeer:
    """A raw socket peer that speaks bytes, for malformed input and stuck clients."""

    def __init__(self, address: str | tuple[str, int]) -> None:
        family = socket.AF_UNIX if isinstance(address, str) else socket.AF_INET
        self.sock = socket.socket(family, socket.SOCK_STREAM)
        self.sock.connect(address)
        self.unpacker = msgpack.Unpacker(raw=False, strict_map_key=False)

    def send(self, data: bytes) -> None:
        self.sock.sendall(data)

    def send_value(self, value: Any) -> None:
        self.send(msgpack.packb(value, use_bin_type=True))

    def read(self, timeout: float = 5.0) -> Any:
        """The next frame; raises EOFError on close, TimeoutError on silence."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                return next(self.unpacker)
            except StopIteration:
                pass
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError("no frame in time")
            self.sock.settimeout(remaining)
            try:
                data = self.sock.recv(65536)
            except TimeoutError:
                raise TimeoutError("no frame in time") from None
            except OSError as exc:
                raise EOFError(str(exc)) from None
            if not data:
                raise EOFError("closed")
            self.unpacker.feed(data)

    def read_until_eof(self, timeout: float = 5.0) -> list[Any]:
        frames: list[Any] = []
        while True:
            try:
                frames.append(self.read(timeout))
            except EOFError:
                return frames

    def close(self) -> None:
        self.sock.close()


SMALL_QUEUE = ConnectionSettings(max_outbound_bytes=256 * 1024, max_outbound_frames=1000)


@contextmanager
def unix_listener() -> Iterator[tuple[str, socket.socket]]:
    """A listening Unix socket in a fresh directory, for a fake peer a test writes itself; closed after."""
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "fake.sock")
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            listener.bind(path)
            listener.listen(1)
            yield path, listener
        finally:
            listener.close()


def first_frame(peer: socket.socket, unpacker: msgpack.Unpacker) -> Any:
    """The first whole frame ``peer`` sends (what follows it stays in ``unpacker``)."""
    frame = None
    while frame is None:
        data = peer.recv(1 << 16)
        if not data:
            raise ConnectionError("the peer closed before a whole frame")
        unpacker.feed(data)
        frame = next(iter(unpacker), None)
    return frame

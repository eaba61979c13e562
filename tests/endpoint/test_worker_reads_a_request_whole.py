"""A server worker takes a request in one step when one read brings exactly that request, whole,
and answers it with one write when its handler sent nothing; every other shape of what a read
brings goes through the decoder as before, with the same answers (docs/performance.md, the
endpoint section).

A raw peer writes requests in each shape -- whole, split over two writes, two in one write, after a
notification, with a malformed frame ahead, not msgpack -- and reads the answers off the socket.
"""

from __future__ import annotations

import os
import socket
import tempfile
import time
from collections.abc import Iterator
from typing import Any

import msgpack
import pytest

from castor.endpoint import Dispatcher, Server
from castor.endpoint.dispatch import Context

pytestmark = pytest.mark.timeout(30)


@pytest.fixture
def peer() -> Iterator[tuple[socket.socket, list[dict[str, Any]]]]:
    seen: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "castor.sock")
        dispatcher = Dispatcher()
        dispatcher.register("echo", lambda params, _ctx: params)

        def with_footer(params: dict[str, Any], ctx: Context) -> dict[str, Any]:
            ctx.notify("ui.status", {"text": "footer"})  # corked: written with the answer
            return params

        dispatcher.register("echo.footer", with_footer)
        dispatcher.register("seen", lambda params, _ctx: seen.append(params))
        server = Server(dispatcher, unix_path=path).start()
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.connect(path)
        sock.settimeout(10)
        try:
            yield sock, seen
        finally:
            sock.close()
            server.stop()


def _frames(sock: socket.socket, count: int) -> list[Any]:
    unpacker = msgpack.Unpacker(raw=False)
    got: list[Any] = []
    while len(got) < count:
        data = sock.recv(65536)
        if not data:
            break
        unpacker.feed(data)
        got.extend(unpacker)
    return got


def _request(msgid: int, method: str = "echo", **params: Any) -> bytes:
    return msgpack.packb([0, msgid, method, [params]])


def test_a_whole_request_is_answered(peer: tuple[socket.socket, list[dict[str, Any]]]) -> None:
    sock, _ = peer
    for msgid in range(3):
        sock.sendall(_request(msgid, n=msgid))
        assert _frames(sock, 1) == [[1, msgid, None, {"n": msgid}]]


def test_a_request_split_over_two_writes_is_answered(peer: tuple[socket.socket, list[dict[str, Any]]]) -> None:
    sock, _ = peer
    frame = _request(7, text="split")
    sock.sendall(frame[:4])
    time.sleep(0.05)  # the worker's first read ends inside the frame
    sock.sendall(frame[4:])
    assert _frames(sock, 1) == [[1, 7, None, {"text": "split"}]]


def test_two_requests_in_one_write_are_both_answered_in_order(
        peer: tuple[socket.socket, list[dict[str, Any]]]) -> None:
    sock, _ = peer
    sock.sendall(_request(1, n=1) + _request(2, n=2))
    assert _frames(sock, 2) == [[1, 1, None, {"n": 1}], [1, 2, None, {"n": 2}]]


def test_a_notification_then_a_request_in_one_write(peer: tuple[socket.socket, list[dict[str, Any]]]) -> None:
    sock, seen = peer
    sock.sendall(msgpack.packb([2, "seen", [{"k": "v"}]]) + _request(3, n=3))
    assert _frames(sock, 1) == [[1, 3, None, {"n": 3}]]
    assert seen == [{"k": "v"}]


def test_a_request_whose_handler_notifies_gets_the_notification_first(
        peer: tuple[socket.socket, list[dict[str, Any]]]) -> None:
    sock, _ = peer
    sock.sendall(_request(4, "echo.footer", n=4))
    assert _frames(sock, 2) == [[2, "ui.status", [{"text": "footer"}]], [1, 4, None, {"n": 4}]]


def test_a_malformed_request_read_whole_is_refused_with_its_msgid(
        peer: tuple[socket.socket, list[dict[str, Any]]]) -> None:
    sock, _ = peer
    sock.sendall(msgpack.packb([0, 5, "echo", "not an array"]))
    [answer] = _frames(sock, 1)
    assert answer[:2] == [1, 5] and answer[2]["code"] == "invalid_params"
    sock.sendall(_request(6, n=6))  # the connection stays usable
    assert _frames(sock, 1) == [[1, 6, None, {"n": 6}]]


def test_bytes_that_are_not_msgpack_close_the_connection(peer: tuple[socket.socket, list[dict[str, Any]]]) -> None:
    sock, _ = peer
    sock.sendall(b"\xc1")
    frames = _frames(sock, 2)  # the error notification, then the end of stream
    assert frames and frames[0][0] == 2 and frames[0][1] == "error"
    assert sock.recv(65536) == b""

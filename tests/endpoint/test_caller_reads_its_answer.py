"""A caller that reads its own answer takes it in one step when one read brings exactly that
answer, whole; every other shape of what a read brings goes through the decoder as before, with
the same outcome (docs/performance.md, the endpoint section).

A fake server answers each request in the shape the request names: split over two writes, after a
notification in the same write, as an error, after an answer to no call, as bytes that are not
msgpack. The call's result, error, or the connection's close is what the general path gives.
"""

from __future__ import annotations

import os
import socket
import tempfile
import threading
import time
from collections.abc import Iterator
from typing import Any

import msgpack
import pytest

from castor.client import Client
from castor.endpoint.errors import ConnectionClosed
from castor.messages.errors import CastorError, NotFound, Timeout


def _answer(peer: socket.socket, msgid: int, shape: str, params: dict[str, Any]) -> None:
    answer = msgpack.packb([1, msgid, None, {"echo": params}])
    if shape == "whole":
        peer.sendall(answer)
    elif shape == "split":
        peer.sendall(answer[:3])
        time.sleep(0.05)  # the client's first read ends inside the frame
        peer.sendall(answer[3:])
    elif shape == "after a notification":
        peer.sendall(msgpack.packb([2, "ui.status", [{"text": "footer"}]]) + answer)
    elif shape == "error":
        peer.sendall(msgpack.packb([1, msgid, {"code": "not_found", "message": "no such thing"}, None]))
    elif shape == "after an answer to no call":
        peer.sendall(msgpack.packb([1, 4_000_000, None, "stray"]))
        time.sleep(0.02)
        peer.sendall(answer)
    elif shape == "late":
        time.sleep(0.3)  # past the call's deadline: its answer is counted late
        peer.sendall(answer)
    elif shape == "not msgpack":
        peer.sendall(b"\xc1")  # never used in msgpack
    else:  # pragma: no cover - the test's own table
        raise AssertionError(shape)


@pytest.fixture
def fake_server() -> Iterator[str]:
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "fake.sock")
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        listener.bind(path)
        listener.listen(1)

        def serve() -> None:
            peer, _ = listener.accept()
            unpacker = msgpack.Unpacker(raw=False)
            with peer:
                while True:
                    try:
                        data = peer.recv(65536)
                    except OSError:
                        return
                    if not data:
                        return
                    unpacker.feed(data)
                    for frame in unpacker:
                        if frame[0] == 0:  # a request (the client's parting error notification is not)
                            params = frame[3][0]
                            _answer(peer, frame[1], params["shape"], params)

        server = threading.Thread(target=serve, daemon=True)
        server.start()
        try:
            yield path
        finally:
            listener.close()


@pytest.mark.timeout(30)
def test_every_shape_of_an_answer_gives_the_general_paths_outcome(fake_server: str) -> None:
    client = Client.connect_unix(fake_server)
    footers: list[dict[str, Any]] = []
    client.on_notification("ui.status", footers.append, on_reading_thread=True)
    try:
        for shape in ("whole", "split", "after a notification", "after an answer to no call", "whole"):
            params = {"shape": shape, "n": 1}
            assert client.call("echo", params) == {"echo": params}, shape
        assert footers == [{"text": "footer"}], "the notification read with the answer ran before the call returned"
        assert client.connection.counters["unmatched_replies"] == 1

        with pytest.raises(NotFound):
            client.call("echo", {"shape": "error"})

        with pytest.raises(Timeout):
            client.call("echo", {"shape": "late"}, timeout=0.1)
        assert client.call("echo", {"shape": "whole"}) == {"echo": {"shape": "whole"}}
        assert client.connection.counters["late_replies"] == 1

        with pytest.raises(CastorError) as failed:
            client.call("echo", {"shape": "not msgpack"}, timeout=5)
        assert isinstance(failed.value, ConnectionClosed)
        assert client.connection.close_reason is not None
        assert client.connection.close_reason.startswith("invalid_frame")
    finally:
        client.close()

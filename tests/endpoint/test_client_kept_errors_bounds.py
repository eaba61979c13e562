"""The ``error`` notifications a client keeps are cut as a peer's error is cut on the way in.

``Client.errors`` kept the latest 100 notifications whole: a broken or hostile server sending 100
of them with megabytes of message (a frame may hold 16 MiB) cost the client over a gigabyte. Each
is now kept cut: its message at ``MAX_WIRE_MESSAGE_CHARS``, each string in its data at
``MAX_WIRE_DATA_CHARS``, a code castor does not know (kept in ``data.wire_code``) at
``MAX_WIRE_CODE_CHARS``; data still larger than ``MAX_KEPT_ERROR_DATA_BYTES`` (many items, or
strings nested deeper than the cut reaches) is replaced by a note of its size.
"""

from __future__ import annotations

import threading

import msgpack
import pytest

from castor.client import MAX_KEPT_ERROR_DATA_BYTES, Client
from castor.messages.errors import MAX_WIRE_CODE_CHARS, MAX_WIRE_DATA_CHARS, MAX_WIRE_MESSAGE_CHARS

from .conftest import first_frame, unix_listener

_BIG = 2 * 1024 * 1024


@pytest.mark.timeout(30)
def test_the_error_notifications_a_client_keeps_are_cut() -> None:
    with unix_listener() as (path, listener):

        def fake_server() -> None:
            peer, _ = listener.accept()
            request = first_frame(peer, msgpack.Unpacker(raw=False))
            huge = [{"code": "internal", "message": "m" * _BIG, "data": {"detail": "d" * _BIG}},
                    {"code": "a_code_of_its_own" * 10_000, "message": "n" * _BIG},
                    {"code": "internal", "message": "many", "data": {"values": [[1] * 60_000] * 30}},
                    {"code": "internal", "message": "deep", "data": {"a": {"b": {"c": {"d": {"e": "x" * _BIG}}}}}}]
            for params in huge:
                peer.sendall(msgpack.packb([2, "error", [params]]))
            peer.sendall(msgpack.packb([1, request[1], None, "ok"]))
            peer.recv(1)  # until the client goes
            peer.close()

        server_thread = threading.Thread(target=fake_server, daemon=True)
        server_thread.start()
        try:
            with Client.connect_unix(path, default_timeout=15) as client:
                assert client.call("work", {}) == "ok"
                kept = list(client.errors)
        finally:
            server_thread.join(10)
    assert len(kept) == 4
    for error in kept[:2]:
        assert len(error["message"]) < MAX_WIRE_MESSAGE_CHARS + 100
        assert error["message"].endswith(f"(cut: {_BIG} characters)")
    assert kept[0]["code"] == "internal"
    assert len(kept[0]["data"]["detail"]) < MAX_WIRE_DATA_CHARS + 100
    assert len(kept[1]["data"]["wire_code"]) < MAX_WIRE_CODE_CHARS + 100
    for error in kept[2:]:  # what the string cuts do not reach: many items, or nesting
        assert len(msgpack.packb(error["data"])) <= MAX_KEPT_ERROR_DATA_BYTES
        assert "cut" in error["data"]

"""A peer's error text is cut on the way in, as castor cuts its own on the way out.

An error the peer answers a call with used to keep its message whole: a harness that answered
castor's ``session.append_entry`` with megabytes of message (or a server a client) put every byte
of it into the warning line that reports the entry lost, and into whatever else showed the error.
"""

from __future__ import annotations

import threading

import msgpack
import pytest

from castor.client import Client
from castor.messages.errors import MAX_WIRE_CODE_CHARS, MAX_WIRE_MESSAGE_CHARS, CastorError

from .conftest import first_frame, unix_listener


@pytest.mark.timeout(30)
@pytest.mark.parametrize("code", ["not_found", "some_code_of_its_own" * 10_000])
def test_a_peers_megabyte_error_message_reaches_the_caller_cut(code: str) -> None:
    with unix_listener() as (path, listener):
        def fake_server() -> None:
            peer, _ = listener.accept()
            request = first_frame(peer, msgpack.Unpacker(raw=False))
            peer.sendall(msgpack.packb([1, request[1], {"code": code, "message": "m" * (2 * 1024 * 1024)}, None]))
            peer.recv(1)  # until the client goes
            peer.close()

        server_thread = threading.Thread(target=fake_server, daemon=True)
        server_thread.start()
        with Client.connect_unix(path, default_timeout=10) as client:
            with pytest.raises(CastorError) as answered:
                client.call("anything", {})
        server_thread.join(10)
    assert answered.value.message.startswith("m" * MAX_WIRE_MESSAGE_CHARS)
    assert answered.value.message.endswith(f"(cut: {2 * 1024 * 1024} characters)")
    assert len(answered.value.message) < MAX_WIRE_MESSAGE_CHARS + 100
    assert len(answered.value.data.get("wire_code", "")) < MAX_WIRE_CODE_CHARS + 100

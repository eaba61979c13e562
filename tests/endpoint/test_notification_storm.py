"""A storm of notifications for a method the receiver does not serve costs it nothing on the wire.

docs/protocol.md: an unknown method in a notification gets *nothing* back (it is logged). Such
notifications used to take an in-flight slot each like any other job, so a storm of them (a peer
pushing status lines its counterpart has no handler for) overran the bound: each one over it was
answered with a ``mailbox_full`` ``error`` notification, and a peer that was not reading at that
moment saw those answers fill castor's outbound queue until castor closed the connection -- the
client's own call then failed ``cancelled`` ("outbound queue overflow") for the peer's chatter.
"""

from __future__ import annotations

import socket
import threading
from typing import Any

import msgpack
import pytest

from castor.client import Client
from castor.endpoint import Server

from .conftest import Gates, RawPeer, first_frame, unix_listener

STORM = 20_000


def _storm(method: str) -> bytes:
    return b"".join(msgpack.packb([2, method, [{"i": i}]]) for i in range(STORM))


@pytest.mark.timeout(30)
def test_a_client_survives_a_notification_storm_it_has_no_handler_for_and_answers_none_of_it() -> None:
    with unix_listener() as (path, listener):
        received: list[Any] = []
        served = threading.Event()

        def fake_server() -> None:
            peer, _ = listener.accept()
            unpacker = msgpack.Unpacker(raw=False)
            request = first_frame(peer, unpacker)
            # Not reading while it pushes: what the client sends back piles up on its side.
            peer.sendall(_storm("ui.unhandled") + msgpack.packb([1, request[1], None, "ok"]))
            served.wait(20)
            peer.shutdown(socket.SHUT_WR)
            try:
                while chunk := peer.recv(1 << 16):
                    unpacker.feed(chunk)
            except ConnectionResetError:  # the client closed with frames of ours unread
                pass
            received.extend(unpacker)
            peer.close()

        server_thread = threading.Thread(target=fake_server, daemon=True)
        server_thread.start()
        client = Client.connect_unix(path, default_timeout=15)
        try:
            assert client.call("work", {}) == "ok"
            assert not client.closed
            assert client.connection.counters["rejected_in_flight"] == 0
        finally:
            served.set()
            server_thread.join(20)
            client.close()
        assert received == [], f"the client answered the storm: {received[:3]} ({len(received)} frames)"


@pytest.mark.timeout(30)
def test_castor_answers_no_notification_of_an_unknown_method_even_in_a_storm(server: Server, gates: Gates) -> None:
    peer = RawPeer(server.address)
    try:
        # Seven handlers hold seven of the eight workers: the reader queues what it reads.
        peer.send(b"".join(msgpack.packb([0, 100 + n, "block", [{}]]) for n in range(7)))
        assert gates.entered.wait(10)
        peer.send(_storm("nobody.serves.this") + msgpack.packb([0, 1, "echo", [{"x": 1}]]))
        gates.release.set()
        values: list[Any] = []
        while [1, 1, None, {"x": 1}] not in values:
            values.append(peer.read(20))
        assert [v for v in values if v[:1] == [2]] == [], "castor answered notifications of an unknown method"
        assert server.connections()[0].counters["rejected_in_flight"] == 0
    finally:
        peer.close()

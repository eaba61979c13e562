"""A close that flushes stops waiting once the peer is gone for good.

After the peer's end of stream, castor (and the client, the same ``Connection``) flushes what it
still has queued for up to the drain time before it closes. When the peer then went away entirely,
the writer's next write failed and the writer stopped -- but the flush went on waiting for the
frames still queued behind it, which nobody would ever write, for the whole drain: the connection
(and, before the end of stream failed them at once, the calls waiting on it) closed that late.
"""

from __future__ import annotations

import socket
import threading

import pytest

from castor.client import Client
from castor.endpoint import ConnectionSettings
from castor.endpoint.errors import ConnectionClosed
from tests.support.waiting import wait_for

from .conftest import unix_listener

BLOB = "z" * (4 << 20)  # far more than the socket buffer: the writer keeps some of each queued


@pytest.mark.timeout(30)
def test_calls_fail_cancelled_as_soon_as_the_peer_is_gone_not_after_the_drain() -> None:
    with unix_listener() as (path, listener):
        accepted: list[socket.socket] = []
        ready = threading.Event()

        def accept() -> None:
            accepted.append(listener.accept()[0])
            ready.set()

        threading.Thread(target=accept, daemon=True).start()
        client = Client.connect_unix(path, settings=ConnectionSettings(drain_timeout=15), default_timeout=20)
        try:
            assert ready.wait(10)
            peer = accepted[0]
            calls = [client.call_async("work", {"blob": BLOB}) for _ in range(3)]
            peer.shutdown(socket.SHUT_WR)  # end of stream: the client drains what it queued
            # the client read the end of stream and flushes (frames still queued behind its writer)
            wait_for(lambda: client.connection._eof, 10, "the client to read the end of stream")
            # frames still unwritten: queued, or taken by the writer, which blocks writing them (it
            # may hold all three at once, leaving the queue empty)
            assert client.connection.stats()["outbound_frames"] > 0 or client.connection._writer_busy
            peer.close()  # and now gone: the writer's next write fails
            for call in calls:  # no answer can come after the end of stream
                with pytest.raises(ConnectionClosed):
                    call.result()
            assert client.connection.wait_closed(5), "the close waited out the drain for a peer that was gone"
        finally:
            client.close()

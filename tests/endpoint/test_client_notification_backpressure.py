"""The client loses no notification of a method it serves, however fast the server sends them.

Its in-flight bound (64 jobs) used to drop every such notification over it -- each with an
``error`` notification back -- once its handlers were busy: a server that pushed a burst of
status lines while the client's handlers ran lost most of them. Now a notification over the
bound waits for a slot: reading pauses (back-pressure on the server), except while a call waits
for its response, which may be behind the burst: reading then goes on, queueing them, so the call
still returns -- including a call a notification handler makes itself.
"""

from __future__ import annotations

import socket
import threading
from typing import Any

import msgpack
import pytest

from castor.client import Client
from tests.support.waiting import wait_for

from .conftest import first_frame, unix_listener

BURST = 2_000  # far over the client's 64 in-flight slots and its 8 workers


@pytest.mark.timeout(60)
def test_a_burst_of_served_notifications_behind_a_calls_response_loses_none_and_the_call_returns() -> None:
    with unix_listener() as (path, listener):
        done = threading.Event()
        received: list[Any] = []

        def fake_server() -> None:
            peer, _ = listener.accept()
            unpacker = msgpack.Unpacker(raw=False)
            request = first_frame(peer, unpacker)
            peer.sendall(b"".join(msgpack.packb([2, "tick", [{"i": i}]]) for i in range(BURST))
                         + msgpack.packb([1, request[1], None, "ok"]))
            done.wait(30)
            peer.shutdown(socket.SHUT_WR)
            try:
                while chunk := peer.recv(1 << 16):
                    unpacker.feed(chunk)
            except ConnectionResetError:
                pass
            received.extend(unpacker)
            peer.close()

        handled: list[int] = []
        lock = threading.Lock()
        release = threading.Event()

        def tick(params: dict[str, Any]) -> None:
            release.wait(30)  # every handler busy until the call has returned
            with lock:
                handled.append(params["i"])

        server_thread = threading.Thread(target=fake_server, daemon=True)
        server_thread.start()
        client = Client.connect_unix(path, default_timeout=20)
        client.on_notification("tick", tick)
        try:
            assert client.call("work", {}) == "ok"  # its response was behind all of them
            release.set()
            wait_for(lambda: len(handled) == BURST, timeout=30, what="every notification handled")
            assert sorted(handled) == list(range(BURST))
            assert client.connection.counters["rejected_in_flight"] == 0
            assert not client.closed
        finally:
            release.set()
            done.set()
            server_thread.join(20)
            client.close()
        assert [f for f in received if f[:2] == [2, "error"]] == [], "the client refused notifications"


@pytest.mark.timeout(60)
def test_a_handler_that_calls_the_server_during_a_burst_is_answered_and_nothing_is_lost() -> None:
    """Back-pressure cannot deadlock: every slot is held by a handler waiting for the server's
    answer to its own call, and those answers come behind the rest of the burst."""
    with unix_listener() as (path, listener):
        stop = threading.Event()
        write = threading.Lock()

        def fake_server() -> None:
            peer, _ = listener.accept()
            unpacker = msgpack.Unpacker(raw=False)

            def flood() -> None:
                for i in range(BURST):
                    with write:
                        peer.sendall(msgpack.packb([2, "ask", [{"i": i}]]))

            flooder = threading.Thread(target=flood, daemon=True)
            flooder.start()
            while not stop.is_set():  # answer every call as it comes (the flood may be blocked)
                try:
                    chunk = peer.recv(1 << 16)
                except OSError:
                    break
                if not chunk:
                    break
                unpacker.feed(chunk)
                for frame in unpacker:
                    if frame[0] == 0:
                        with write:
                            peer.sendall(msgpack.packb([1, frame[1], None, frame[3][0]["i"]]))
            flooder.join(20)
            peer.close()

        server_thread = threading.Thread(target=fake_server, daemon=True)
        server_thread.start()
        answers: list[int] = []
        lock = threading.Lock()
        client = Client.connect_unix(path, default_timeout=20)

        def ask(params: dict[str, Any]) -> None:
            answer = client.call("echo", {"i": params["i"]})
            with lock:
                answers.append(answer)

        client.on_notification("ask", ask)
        try:
            wait_for(lambda: len(answers) == BURST, timeout=45, what="every handler's call answered")
            assert sorted(answers) == list(range(BURST))
            assert client.connection.counters["rejected_in_flight"] == 0
        finally:
            stop.set()
            client.close()
            server_thread.join(20)


@pytest.mark.timeout(60)
def test_reading_ahead_for_a_call_is_bounded_and_past_it_the_call_times_out_losing_nothing() -> None:
    """A call whose response is behind more than ``max_read_ahead_bytes`` of notifications waiting
    for a slot stops reading there: memory stays bounded and the call ends at its deadline
    (``timeout``); the notifications all run once the handlers are free."""
    from castor.endpoint.connection import ConnectionSettings
    from castor.messages.errors import Timeout

    with unix_listener() as (path, listener):
        done = threading.Event()

        def fake_server() -> None:
            peer, _ = listener.accept()
            unpacker = msgpack.Unpacker(raw=False)
            request = first_frame(peer, unpacker)
            peer.sendall(b"".join(msgpack.packb([2, "tick", [{"i": i, "pad": "x" * 100}]]) for i in range(BURST))
                         + msgpack.packb([1, request[1], None, "ok"]))
            done.wait(30)
            peer.close()

        handled: list[int] = []
        lock = threading.Lock()
        release = threading.Event()

        def tick(params: dict[str, Any]) -> None:
            release.wait(30)
            with lock:
                handled.append(params["i"])

        server_thread = threading.Thread(target=fake_server, daemon=True)
        server_thread.start()
        client = Client.connect_unix(path, default_timeout=20,
                                     settings=ConnectionSettings(max_read_ahead_bytes=16 * 1024))
        client.on_notification("tick", tick)
        try:
            with pytest.raises(Timeout):
                client.call("work", {}, timeout=1.0)
            stats = client.connection.stats()
            assert stats["notifications_waiting_bytes"] <= 16 * 1024 + 200  # one frame past the bound at most
            assert stats["in_flight"] < BURST  # it stopped reading: the rest waited in the socket
            release.set()
            wait_for(lambda: len(handled) == BURST, timeout=30, what="every notification handled")
            assert sorted(handled) == list(range(BURST))
            assert client.connection.counters["rejected_in_flight"] == 0
        finally:
            release.set()
            done.set()
            server_thread.join(20)
            client.close()

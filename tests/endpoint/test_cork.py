"""A handler's notifications go out with its response, never later than they would have.

An inline handler's frames are corked and written with its response in one write (one wake-up of
the peer instead of two); the cork never reorders frames and never holds one for long: a slow
handler's frames go out at its grace, a request it makes goes out at once (with what it corked
before), and a large frame is not corked.
"""

from __future__ import annotations

import os
import threading
from typing import Any

import msgpack
import pytest

from castor.client import Client
from castor.endpoint import Context, Dispatcher, Server

from .conftest import RawPeer

pytestmark = pytest.mark.timeout(30)


@pytest.fixture
def rig(sock_dir: str):
    release = threading.Event()
    answers: dict[str, Any] = {}
    d = Dispatcher()

    def notify_then(params: dict, ctx: Context) -> str:
        ctx.notify("ui.status", {"text": "first"})
        if params.get("block"):
            release.wait(10)
        if params.get("call"):
            answers["call"] = ctx.call("client.ping", {}, timeout=5)
        ctx.notify("ui.status", {"text": "second"})
        return "done"

    d.register("notify_then", notify_then)
    d.register("big", lambda params, ctx: ctx.notify("ui.status", {"blob": b"x" * params["size"]}) or "done")
    server = Server(d, unix_path=os.path.join(sock_dir, "k.sock")).start()
    yield server, release, answers
    release.set()
    server.stop()


def frames(peer: RawPeer, n: int) -> list[Any]:
    out: list[Any] = []
    while len(out) < n:
        data = peer.sock.recv(65536)
        assert data, "connection closed"
        peer.unpacker.feed(data)
        out.extend(peer.unpacker)
    return out


def test_notifications_then_the_response_in_order(rig) -> None:
    server, _, _ = rig
    peer = RawPeer(server.address)
    peer.sock.sendall(msgpack.packb([0, 7, "notify_then", [{}]]))
    got = frames(peer, 3)
    assert got == [[2, "ui.status", [{"text": "first"}]], [2, "ui.status", [{"text": "second"}]],
                   [1, 7, None, "done"]]


def test_a_blocked_handlers_notification_is_not_held_for_its_response(rig) -> None:
    server, release, _ = rig
    client = Client.connect_unix(server.address, default_timeout=10)
    try:
        seen = threading.Event()
        client.on_notification("ui.status", lambda p: seen.set() if p.get("text") == "first" else None)
        pending = client.call_async("notify_then", {"block": True})
        assert seen.wait(5), "the notification waited for the handler"
        assert not pending.done()  # the handler is still blocked
        release.set()
        assert pending.result() == "done"
    finally:
        client.close()


def test_a_request_the_handler_makes_goes_out_at_once_after_what_it_corked(rig) -> None:
    server, _, answers = rig
    peer = RawPeer(server.address)
    peer.sock.sendall(msgpack.packb([0, 1, "notify_then", [{"call": True}]]))
    first, request = frames(peer, 2)
    assert first == [2, "ui.status", [{"text": "first"}]]
    assert request[0] == 0 and request[2] == "client.ping"  # not held behind the cork: no deadlock
    peer.sock.sendall(msgpack.packb([1, request[1], None, "pong"]))
    assert frames(peer, 2) == [[2, "ui.status", [{"text": "second"}]], [1, 1, None, "done"]]
    assert answers["call"] == "pong"


def test_a_large_notification_is_not_corked(rig) -> None:
    server, _, _ = rig
    peer = RawPeer(server.address)
    peer.sock.sendall(msgpack.packb([0, 3, "big", [{"size": 200_000}]]))
    note, response = frames(peer, 2)
    assert note[1] == "ui.status" and len(note[2][0]["blob"]) == 200_000
    assert response == [1, 3, None, "done"]

"""A peer that sends half a frame and stops is closed; it no longer holds its slot for ever.

The idle timeout spares a connection that holds a session (a harness may be quiet for hours), so
a peer that opened one and then stalled halfway through a frame -- a hung writer, or a slot held on
purpose -- kept its connection slot, its session and what it sent of the frame (up to the 16 MiB
frame limit) until castor stopped. A frame begun and left without a byte for
``frame_stall_timeout`` now closes the connection with a typed ``timeout`` saying so; every other
connection goes on.
"""

from __future__ import annotations

import msgpack
import pytest

from castor.client import Client
from castor.endpoint import Server
from tests.support.waiting import wait_for

from .conftest import Gates, RawPeer, build_dispatcher


@pytest.mark.timeout(30)
def test_a_peer_that_holds_a_session_and_stalls_halfway_through_a_frame_is_closed_saying_why(
        gates: Gates, sock_dir: str) -> None:
    server = Server(build_dispatcher(gates), unix_path=f"{sock_dir}/s.sock", frame_stall_timeout=0.5,
                    idle_timeout=None).start()  # off: as it is for a connection holding a session
    try:
        stalled = RawPeer(server.address)
        stalled.send_value([0, 1, "echo", [{"x": 1}]])
        assert stalled.read(5) == [1, 1, None, {"x": 1}]
        conn = server.connections()[0]
        frame = msgpack.packb([0, 2, "echo", [{"x": "y" * 10_000}]])
        stalled.send(frame[: len(frame) // 2])
        with Client.connect_unix(server.address, default_timeout=10) as other:
            wait_for(lambda: conn.incomplete_frame() is not None, what="the half frame read")
            assert other.call("echo", {"x": 2}) == {"x": 2}
            parting = stalled.read_until_eof(10)
            assert [f[2][0]["code"] for f in parting if f[:2] == [2, "error"]] == ["timeout"]
            assert parting[-1][2][0]["data"]["reason"] == "frame_stalled"
            assert conn.closed
            assert other.call("echo", {"x": 3}) == {"x": 3}  # nothing lost for the others
        stalled.close()
    finally:
        server.stop()


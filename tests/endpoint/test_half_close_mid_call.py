"""A peer that ends its stream (``shutdown(SHUT_WR)``) while castor waits on a call to it.

Nothing can answer that call any more: the peer's end of stream is the last it sends. The call used
to wait until the drain ended (2 s) and the connection closed -- and the request of the peer's whose
handler made it, still running, was then never answered, though the peer was still reading.
docs/protocol.md: requests the peer sent are answered while the stream is writable within the drain.
"""

from __future__ import annotations

import socket
import time

import pytest

from castor.endpoint import Server

from .conftest import RawPeer


@pytest.mark.timeout(30)
def test_a_call_to_a_peer_that_ended_its_stream_fails_at_once_and_its_handler_is_answered(server: Server) -> None:
    peer = RawPeer(server.address)
    try:
        peer.send_value([0, 1, "call_back", [{"method": "harness.thing", "timeout": 20}]])
        request = peer.read(10)
        assert request[:3] == [0, request[1], "harness.thing"]
        ended_at = time.monotonic()
        peer.sock.shutdown(socket.SHUT_WR)  # our last word: we still read
        answer = peer.read(10)
        assert answer[:3] == [1, 1, None], answer
        assert answer[3]["error"] == "cancelled"
        assert answer[3]["data"]["reason"] == "eof"
        assert time.monotonic() - ended_at < 1.5, "the call waited out the drain"
        assert peer.read_until_eof(10) == []
    finally:
        peer.close()

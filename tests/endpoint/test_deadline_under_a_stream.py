"""A call's deadline holds while the peer never stops sending.

The thread waiting for its answer reads the stream itself, and it used to look at its deadline only
when a read came back empty (the 20 ms receive timeout). A peer that kept sending frames other than
the answer -- ``error`` notifications, notifications nobody serves, answers to other calls -- so kept
the call waiting for ever, past any timeout (docs/protocol.md: every call has a deadline).
"""

from __future__ import annotations

import os
import socket
import tempfile
import threading
import time

import msgpack
import pytest

from castor.client import Client
from castor.messages.errors import Timeout

FRAMES = {
    "error notifications": [2, "error", [{"code": "internal", "message": "chatter"}]],
    "notifications nobody serves": [2, "ui.unhandled", [{"text": "chatter"}]],
    "answers to no call": [1, 4_000_000, None, "chatter"],
}


@pytest.mark.timeout(30)
@pytest.mark.parametrize("chatter", list(FRAMES))
def test_a_call_times_out_while_the_server_streams_other_frames(chatter: str) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "fake.sock")
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        listener.bind(path)
        listener.listen(1)
        stop = threading.Event()

        def stream() -> None:
            peer, _ = listener.accept()
            burst = msgpack.packb(FRAMES[chatter]) * 200
            try:
                while not stop.is_set():
                    peer.sendall(burst)
            except OSError:
                pass  # the client went
            finally:
                peer.close()

        streamer = threading.Thread(target=stream, daemon=True)
        streamer.start()
        client = Client.connect_unix(path)
        try:
            started = time.monotonic()
            with pytest.raises(Timeout):
                client.call("work", {}, timeout=0.5)
            assert time.monotonic() - started < 3, "the deadline was not honoured"
        finally:
            stop.set()
            client.close()
            streamer.join(10)
            listener.close()

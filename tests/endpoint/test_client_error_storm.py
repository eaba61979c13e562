"""A server that sends ``error`` notifications in a loop cannot write the client's log full.

The client logged a warning line for each one (its whole params); a broken or hostile server sending
them as fast as it could filled the embedder's log. Now: one warning, then at most one every
``NOTIFICATION_FAILURE_LOG_INTERVAL_S`` saying how many came since -- as castor does for the
notifications a harness sends that fail. ``client.errors`` still keeps the latest 100.
"""

from __future__ import annotations

import threading

import msgpack
import pytest
from loguru import logger

from castor.client import Client

from .conftest import first_frame, unix_listener


@pytest.mark.timeout(30)
def test_a_storm_of_error_notifications_is_one_warning_and_the_latest_hundred_kept() -> None:
    with unix_listener() as (path, listener):

        def fake_server() -> None:
            peer, _ = listener.accept()
            unpacker = msgpack.Unpacker(raw=False)
            request = first_frame(peer, unpacker)
            storm = b"".join(msgpack.packb([2, "error", [{"code": "internal", "message": f"n{i}"}]])
                             for i in range(2000))
            peer.sendall(storm + msgpack.packb([1, request[1], None, "ok"]))
            peer.recv(1)  # until the client goes
            peer.close()

        server_thread = threading.Thread(target=fake_server, daemon=True)
        server_thread.start()
        warnings: list[str] = []
        sink = logger.add(lambda m: warnings.append(m.record["message"]), level="WARNING",
                          filter=lambda r: r["message"].startswith("server reported an error"))
        try:
            with Client.connect_unix(path, default_timeout=15) as client:
                assert client.call("work", {}) == "ok"
                assert len(client.errors) == 100 and client.errors[-1]["message"] == "n1999"
        finally:
            logger.remove(sink)
            server_thread.join(10)
        assert len(warnings) == 1, f"{len(warnings)} warnings for one storm"

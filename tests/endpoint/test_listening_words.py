"""The endpoint's "listening on" log line names its address as an operator writes it.

A TCP endpoint logged ``castor endpoint listening on ('127.0.0.1', 41234)``, a Python tuple, where
``castor serve``'s own line and every hint say ``tcp:127.0.0.1:41234``.
"""

from __future__ import annotations

import pytest
from loguru import logger

from castor.endpoint import Dispatcher, Server
from castor.endpoint.server import listening_words

pytestmark = pytest.mark.timeout(30)


@pytest.mark.parametrize(("address", "words"), [
    (("127.0.0.1", 8123), "tcp:127.0.0.1:8123"),
    (("::1", 8123), "tcp:[::1]:8123"),
    ("/run/user/1000/castor.sock", "unix:/run/user/1000/castor.sock"),
    ("stdio", "stdio"),
    (None, "stdio"),
])
def test_listening_words(address, words):
    assert listening_words(address) == words


def test_a_tcp_endpoint_logs_where_it_listens_as_host_and_port():
    lines: list[str] = []
    sink = logger.add(lambda m: lines.append(m.record["message"]), level="INFO")
    server = Server(Dispatcher(), tcp=("127.0.0.1", 0), token="t" * 32)
    try:
        server.start()
        host, port = server.address  # type: ignore[misc]
    finally:
        server.stop()
        logger.remove(sink)
    said = [line for line in lines if "listening on" in line]
    assert said == [f"castor endpoint listening on tcp:{host}:{port}"], lines

"""The endpoint's own log lines name where they come from in the JSON log, as an actor's do:
``/endpoint`` for the server (listening, stopping, a refused connection, a handler that raised,
with the method as ``msg_type``), ``/endpoint/CONN`` for one connection's lines (the owner its
threads show in ``castor inspect``). They read ``-``, so an operator filtering the log by source
could not find them."""

from __future__ import annotations

import io
import json
import os

import pytest

from castor.client import Client
from castor.endpoint.dispatch import Context, Dispatcher
from castor.endpoint.server import Server
from castor.logs import configure_logging
from castor.messages.errors import CastorError
from tests.support.waiting import wait_for

pytestmark = pytest.mark.timeout(30)


def test_the_endpoint_s_lines_name_the_endpoint_and_the_connection(sock_dir: str) -> None:
    def boom(_params: dict, _ctx: Context) -> None:
        raise RuntimeError("a bug")

    dispatcher = Dispatcher()
    dispatcher.register("tests.boom", boom)
    sink = io.StringIO()
    configure_logging("DEBUG", json=True, sink=sink)
    try:
        server = Server(dispatcher, unix_path=os.path.join(sock_dir, "log.sock")).start()
        try:
            with Client.connect_unix(os.path.join(sock_dir, "log.sock")) as client, \
                    pytest.raises(CastorError):
                client.call("tests.boom", {}, timeout=5)

            def closed() -> list[dict]:  # the served connection's (the client's own may come first)
                return [r for r in (json.loads(line)["record"] for line in sink.getvalue().splitlines())
                        if r["message"].startswith("connection closed")
                        and r["extra"].get("conn", "").startswith("unix-")]

            wait_for(closed, timeout=10, what="the served connection's closing line")
        finally:
            server.stop()
    finally:
        configure_logging("ERROR", json=False)
    records = [json.loads(line)["record"] for line in sink.getvalue().splitlines()]
    [listening] = [r for r in records if r["message"].startswith("castor endpoint listening")]
    assert listening["extra"]["actor"] == "/endpoint"
    [raised] = [r for r in records if r["message"].startswith("handler for tests.boom raised")]
    assert raised["extra"]["actor"] == "/endpoint" and raised["extra"]["msg_type"] == "tests.boom"
    served = [r for r in records if r["message"].startswith("connection closed") and r["extra"].get("conn", "")
              .startswith("unix-")]
    assert served and all(r["extra"]["actor"] == f"/endpoint/{r['extra']['conn']}" for r in served)
    assert all(r["extra"]["actor"] != "-" for r in records if r["extra"].get("conn", "").startswith("unix-"))

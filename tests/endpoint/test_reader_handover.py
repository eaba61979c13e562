"""The reader role is never lost on a pipe connection (the stdio case a harness uses).

A castor-side caller (a thread that is not a request handler, like the session mirror's
``session.append_entry``) waits while a worker holds the reader role; if that worker reads the
caller's reply before handing the role over, the caller finds its call done and leaves. Something
must still read what the peer sends next — before the fix, nobody did until castor's next call.
"""

from __future__ import annotations

import threading
import time

import pytest

from castor.endpoint.connection import Connection
from castor.endpoint.dispatch import Dispatcher
from tests.endpoint.conftest import connect_over_pipes

ROUNDS = 60


@pytest.mark.timeout(120)
def test_peer_requests_are_read_after_every_castor_call_on_a_pipe(monkeypatch) -> None:
    # Widen the race the way a busy scheduler does: the caller is descheduled between sending its
    # call and waiting for it (the reply is read by the worker meanwhile), and the worker between
    # reading that reply and resolving it (the caller starts waiting for the role meanwhile).
    resolve, wait_for_reply = Connection._on_response, Connection.await_reply

    def slow_resolve(self: Connection, msgid: int, error: object, result: object) -> None:
        time.sleep(0.01)
        resolve(self, msgid, error, result)

    def late_wait(self: Connection, call: object) -> None:
        time.sleep(0.005)
        wait_for_reply(self, call)

    monkeypatch.setattr(Connection, "_on_response", slow_resolve)
    monkeypatch.setattr(Connection, "await_reply", late_wait)
    dispatcher = Dispatcher()
    dispatcher.register("ping", lambda _p, _ctx: "pong")
    server, client = connect_over_pipes(dispatcher, default_timeout=2.0)
    client.on_request("session.append_entry", lambda _p: {"ok": True})
    try:
        assert client.call("ping") == "pong"
        for round_no in range(ROUNDS):
            done = threading.Event()
            outcome: list[object] = []

            def append(outcome: list[object] = outcome, done: threading.Event = done) -> None:
                try:
                    outcome.append(server.call("session.append_entry", {}, timeout=5))
                except Exception as exc:  # noqa: BLE001 - reported by the assertion below
                    outcome.append(exc)
                finally:
                    done.set()

            threading.Thread(target=append, daemon=True).start()
            assert done.wait(10), f"round {round_no}: castor's call never finished"
            assert outcome == [{"ok": True}], f"round {round_no}: {outcome}"
            # The peer speaks next; castor must read it although no castor call is waiting.
            assert client.call("ping", timeout=2.0) == "pong", f"round {round_no}"
    finally:
        client.close()
        server.close("test over")

"""A handler's early answer (``Context.early_answer``): exactly one response, sent at once.

What it is for: the Icarus hooks answer a waiting harness at once (an ``/icarus off``, an abort)
from another thread while the handler's thread is still inside a worker call it made itself.
"""

from __future__ import annotations

import threading
from typing import Any

import pytest

from castor.client import Client
from castor.endpoint import ConnectionSettings, Context, Dispatcher, Server
from castor.messages.errors import CastorError
from tests.support.waiting import poll_until

pytestmark = pytest.mark.timeout(60)


class Rig:
    """A server whose methods answer early in the ways the tests need; events to synchronise on."""

    def __init__(self, sock_dir: str, settings: ConnectionSettings | None = None) -> None:
        self.release = threading.Event()
        self.returned = threading.Event()
        self.answers: list[Any] = []
        d = Dispatcher()
        d.register("echo", lambda params, _ctx: params)
        d.register("early_then_block", self.early_then_block)
        d.register("early_from_elsewhere", self.early_from_elsewhere)
        d.register("early_then_raise", self.early_then_raise)
        d.register("race", self.race)
        d.register("note", self.note)
        self.server = Server(d, unix_path=f"{sock_dir}/early.sock", settings=settings).start()
        self.client = Client.connect_unix(f"{sock_dir}/early.sock", default_timeout=10)

    def early_then_block(self, params: dict[str, Any], ctx: Context) -> str:
        answer = ctx.early_answer()
        assert answer is not None
        answer({"early": params.get("n")})
        self.release.wait(10)
        self.returned.set()
        return "the handler's own value"  # dropped: the early answer went out

    def early_from_elsewhere(self, _params: dict[str, Any], ctx: Context) -> str:
        answer = ctx.early_answer()
        assert answer is not None
        threading.Thread(target=answer, args=({"from": "another thread"},)).start()
        self.release.wait(10)  # the handler is still running when the answer goes out
        self.returned.set()
        return "late"

    def early_then_raise(self, _params: dict[str, Any], ctx: Context) -> None:
        answer = ctx.early_answer()
        assert answer is not None
        answer("answered")
        raise CastorError("failed after answering", code="conflict")

    def race(self, params: dict[str, Any], ctx: Context) -> dict[str, str]:
        answer = ctx.early_answer()
        assert answer is not None
        other = threading.Thread(target=answer, args=({"by": "early"},))
        other.start()
        if params["join"]:
            other.join()
        return {"by": "handler"}

    def note(self, _params: dict[str, Any], ctx: Context) -> None:
        self.answers.append(ctx.early_answer())

    def close(self) -> None:
        self.release.set()
        self.client.close()
        self.server.stop()


@pytest.fixture
def rig(sock_dir):
    r = Rig(sock_dir)
    yield r
    r.close()


def test_an_early_answer_reaches_the_caller_while_the_handler_still_runs(rig):
    assert rig.client.call("early_then_block", {"n": 1}, timeout=5) == {"early": 1}
    assert not rig.returned.is_set()  # answered, and the handler has not returned
    rig.release.set()
    assert rig.returned.wait(5)
    assert rig.client.call("echo", {"after": True}) == {"after": True}  # its own return went nowhere
    counters = rig.client.connection.counters
    assert counters["unmatched_replies"] == 0 and counters["late_replies"] == 0


def test_another_thread_answers_while_the_handler_waits(rig):
    assert rig.client.call("early_from_elsewhere", {}, timeout=5) == {"from": "another thread"}
    assert not rig.returned.is_set()
    rig.release.set()
    assert rig.returned.wait(5)
    assert rig.client.call("echo", {"n": 2}) == {"n": 2}
    assert rig.client.connection.counters["unmatched_replies"] == 0


def test_an_error_after_the_early_answer_is_not_sent(rig):
    assert rig.client.call("early_then_raise", {}) == "answered"
    assert rig.client.call("echo", {"n": 3}) == {"n": 3}
    assert rig.client.connection.counters["unmatched_replies"] == 0


def test_an_early_answer_racing_the_handlers_own_gives_exactly_one_response(rig):
    for n in range(300):
        assert rig.client.call("race", {"join": n % 2 == 0}) in ({"by": "early"}, {"by": "handler"})
    assert rig.client.call("echo", {"n": 4}) == {"n": 4}
    counters = rig.client.connection.counters
    assert counters["unmatched_replies"] == 0 and counters["late_replies"] == 0
    (conn,) = rig.server.connections()
    # The server releases a request's slot just after writing its response, so the client can read
    # the last answer first: wait (with a deadline) for the slot to be released, then check that
    # no slot was released twice (the count would go below zero).
    assert poll_until(lambda: conn.stats()["in_flight"] <= 0, timeout=5), conn.stats()
    assert conn.stats()["in_flight"] == 0  # every slot released, once


def test_a_notification_has_no_early_answer(rig):
    rig.client.notify("note", {})
    assert rig.client.call("echo", {"n": 5}) == {"n": 5}  # the notification was handled before
    assert rig.answers == [None]


def test_the_next_request_is_admitted_once_the_early_answer_is_out(sock_dir):
    """With one request in flight allowed, a handler still running after its early answer does not
    hold the peer's next request back (its slot counts as answered)."""
    rig = Rig(sock_dir, settings=ConnectionSettings(max_in_flight=1))
    try:
        assert rig.client.call("early_then_block", {"n": 6}, timeout=5) == {"early": 6}
        assert not rig.returned.is_set()
        assert rig.client.call("echo", {"n": 7}, timeout=5) == {"n": 7}  # not refused mailbox_full
        rig.release.set()
        assert rig.returned.wait(5)
    finally:
        rig.close()

"""An ask without ``timeout=`` still has a deadline: ``DEFAULT_ASK_TIMEOUT``.

Most of castor's own asks pass no timeout and rely on this default, so both its value (finite,
carried by the ask) and its effect (the ask ends ``Timeout``) are checked here.
"""

from __future__ import annotations

import math
import threading
import time

import pytest

from castor.messages.errors import Timeout
from castor.supervision import DEFAULT_ASK_TIMEOUT, ActorSystem, ChildSpec
from castor.supervision import handle as handle_module

from .helpers import Block, Journal, Ping, worker


def test_the_default_ask_deadline_is_finite_and_carried_by_every_ask_without_timeout():
    assert math.isfinite(DEFAULT_ASK_TIMEOUT) and 0 < DEFAULT_ASK_TIMEOUT <= 60
    journal = Journal()
    system = ActorSystem([ChildSpec("w", worker("w", journal))])
    try:
        handle = system.lookup("/root/w")
        before = time.monotonic()
        pending = handle.ask_pending(Ping(n=1))
        after = time.monotonic()
        deadline = pending._deadline  # noqa: SLF001 - the deadline the ask carries is the point
        assert before + DEFAULT_ASK_TIMEOUT <= deadline <= after + DEFAULT_ASK_TIMEOUT
        assert pending.result() == ("w", 1, 1)
    finally:
        system.shutdown(10)


@pytest.mark.timeout(30)
def test_an_ask_without_timeout_ends_timeout_once_the_default_deadline_passes(monkeypatch):
    """With the default made short, an ask (no ``timeout=``) to a handler that blocks ends
    ``Timeout(may_have_started=True)``; the handler is released only after the ask has ended, so
    an ask without a deadline would have returned the handler's answer instead."""
    monkeypatch.setattr(handle_module, "DEFAULT_ASK_TIMEOUT", 0.2)
    journal = Journal()
    system = ActorSystem([ChildSpec("w", worker("w", journal))])
    ended = threading.Event()
    outcome: list = []

    def ask() -> None:
        try:
            outcome.append(system.lookup("/root/w").ask(Block(key="gate")))
        except Exception as exc:  # noqa: BLE001 - recorded for the assertions
            outcome.append(exc)
        finally:
            ended.set()

    try:
        asker = threading.Thread(target=ask, daemon=True)
        asker.start()
        assert journal.event("gate:entered").wait(10)
        ended.wait(15)  # the gate holds the handler up to 10 s: only a deadline ends the ask first
        journal.event("gate").set()
        assert ended.wait(15)
        assert len(outcome) == 1 and isinstance(outcome[0], Timeout), outcome
        assert outcome[0].may_have_started is True
    finally:
        journal.event("gate").set()
        system.shutdown(10)

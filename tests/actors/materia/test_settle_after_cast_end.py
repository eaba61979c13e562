"""A user run settling as a cast of the session ends: the cast's actor stops between the session
listing it live and the withdrawal ask reaching it. It had no user turn pending (it ended), so
there is nothing to withdraw and nothing to warn about."""

from __future__ import annotations

from typing import Any

import pytest
from loguru import logger

from castor.actors.materia.session_actor import SessionActor
from castor.messages.errors import ActorStopped

from .helpers import open_session

pytestmark = pytest.mark.timeout(30)


class _EndedCast:
    """TEST FAKE of a live cast's handle whose actor exits (its cast complete) before the ask."""

    path = "/root/session/s1/cast/c-ended"
    asked = 0

    def ask(self, _message: Any, timeout: float | None = None) -> Any:
        self.asked += 1
        raise ActorStopped("exited (stopped), restart=transient")


def test_a_cast_that_ended_as_a_user_run_settled_is_no_warning(runtime_factory, project, monkeypatch):
    rt = runtime_factory()
    open_session(rt, "s1", project, [])
    ended = _EndedCast()
    monkeypatch.setattr(SessionActor, "_live", lambda _self: {"c-ended": ended})
    warnings: list[str] = []
    sink = logger.add(lambda m: warnings.append(str(m)), level="WARNING")
    try:
        assert rt.dispatch_event("s1", "agent_settled", {"aborted": False, "turn_id": None}) == {}
    finally:
        logger.remove(sink)
    assert ended.asked == 1
    assert [w for w in warnings if "withdraw" in w] == []

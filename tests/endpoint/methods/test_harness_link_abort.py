"""WireHarness: stopping a turn castor sent (``agent.abort_turn``) and the harness's late end of it.

The connection is a recording stand-in (only ``notify`` and its settings are used here); the
endpoint-level behaviour is in tests/actors/materia/test_abort_endpoint.py.
"""

from __future__ import annotations

from typing import Any

import pytest

from castor.endpoint.connection import ConnectionSettings
from castor.endpoint.harness_link import REMEMBERED_STOPPED, WireHarness
from castor.messages.errors import NotFound
from castor.ports.agent import TurnOutcome, TurnRequest


class RecordingConnection:
    def __init__(self, *, open_: bool = True) -> None:
        self.settings = ConnectionSettings()
        self.sent: list[tuple[str, dict[str, Any]]] = []
        self.open = open_

    def notify(self, method: str, params: dict[str, Any]) -> bool:
        if self.open:
            self.sent.append((method, params))
        return self.open


def link_with_turn(turn_id: str = "cast:Socket-1:1:1", *, open_: bool = True):
    conn = RecordingConnection(open_=open_)
    link = WireHarness(conn, "s1")  # type: ignore[arg-type]  # a recording stand-in connection
    got: list[TurnOutcome] = []
    link.run_turn(TurnRequest(turn_id=turn_id, cast_id="cast", socket_id="Socket-1", visit=1, prompt="p"), got.append)
    return conn, link, got


def aborts(conn: RecordingConnection) -> list[dict[str, Any]]:
    return [params for method, params in conn.sent if method == "agent.abort_turn"]


def test_abort_turn_tells_the_harness_answers_the_turn_at_once_and_only_once() -> None:
    conn, link, got = link_with_turn()
    assert link.abort_turn("cast:Socket-1:1:1", "cast_aborted") is True
    assert aborts(conn) == [{"session_id": "s1", "turn_id": "cast:Socket-1:1:1", "reason": "cast_aborted"}]
    assert len(got) == 1 and got[0].stop_reason == "aborted" and got[0].error.kind == "cancelled"
    assert link.abort_turn("cast:Socket-1:1:1") is False and link.cancel("cast:Socket-1:1:1") is None
    assert len(aborts(conn)) == 1 and len(got) == 1 and link.pending_turns() == []


def test_the_late_end_of_a_stopped_turn_is_ignored_once_and_an_unknown_one_is_not_found() -> None:
    _conn, link, got = link_with_turn()
    link.abort_turn("cast:Socket-1:1:1")
    assert link.turn_ended({"turn_id": "cast:Socket-1:1:1", "text": "late", "aborted": True}) is False
    assert len(got) == 1  # nothing more was delivered
    with pytest.raises(NotFound):  # a second end of it is a duplicate
        link.turn_ended({"turn_id": "cast:Socket-1:1:1", "text": "late"})
    with pytest.raises(NotFound):
        link.turn_ended({"turn_id": "never-sent"})


def test_an_answered_turn_is_never_stopped() -> None:
    conn, link, got = link_with_turn()
    assert link.turn_ended({"turn_id": "cast:Socket-1:1:1", "text": "done", "stop_reason": "stop"}) is True
    assert link.abort_turn("cast:Socket-1:1:1") is False and aborts(conn) == [] and got[0].text == "done"


@pytest.mark.parametrize("noted,expected", [(None, "cast_stopped"), ("cast_restarted", "cast_restarted"),
                                            ("cast_aborted", "cast_aborted")])
def test_cancel_uses_the_reason_noted_for_it(noted: str | None, expected: str) -> None:
    conn, link, _got = link_with_turn()
    if noted is not None:
        link.note_stop_reason("cast:Socket-1:1:1", noted)
    link.note_stop_reason("not-pending", "cast_aborted")  # ignored: only a pending turn keeps a note
    link.cancel("cast:Socket-1:1:1")
    assert [a["reason"] for a in aborts(conn)] == [expected]
    assert link._reasons == {}


def test_a_closed_connection_still_answers_the_turn_and_ignores_its_end() -> None:
    conn, link, got = link_with_turn(open_=False)
    assert link.abort_turn("cast:Socket-1:1:1") is True
    assert conn.sent == [] and len(got) == 1
    assert link.turn_ended({"turn_id": "cast:Socket-1:1:1"}) is False


def test_only_the_last_stopped_turns_are_remembered() -> None:
    conn = RecordingConnection()
    link = WireHarness(conn, "s1")  # type: ignore[arg-type]  # a recording stand-in connection
    for n in range(REMEMBERED_STOPPED + 10):
        turn_id = f"cast:Socket-1:1:{n}"
        link.run_turn(TurnRequest(turn_id=turn_id, cast_id="cast", socket_id="Socket-1", visit=1, prompt="p"),
                      lambda _o: None)
        link.abort_turn(turn_id)
    assert len(link._stopped) == REMEMBERED_STOPPED
    with pytest.raises(NotFound):
        link.turn_ended({"turn_id": "cast:Socket-1:1:0"})  # forgotten: an unknown turn
    assert link.turn_ended({"turn_id": f"cast:Socket-1:1:{REMEMBERED_STOPPED + 9}"}) is False


def test_every_label_names_its_agent() -> None:
    assert WireHarness.agent_label == "Pi agent"
    from castor.adapters.agents.openai_http import OpenAIChatAgent

    agent = OpenAIChatAgent("http://user:secret@127.0.0.1:9/v1", api_key="k")
    try:
        assert agent.agent_label == "openai HTTP agent (127.0.0.1:9)" and "secret" not in agent.agent_label
    finally:
        agent.close()

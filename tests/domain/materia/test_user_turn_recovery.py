"""Recovery of a user-driven refinement turn whose end the harness never reports (pure engine).

A user-driven turn (``RefinementTurnStarted`` while paused) is run by the harness; only its
``agent_end`` (``TurnEnded``) answers it. These tests prove every other way it can end withdraws it
back to paused — drafts and counters intact — and that anything quoting it afterwards is ignored.
"""

from __future__ import annotations

import json

import pytest

from castor.domain.materia.cast_messages import (
    EVENT_ADAPTER,
    AbortRequested,
    CancelWork,
    ContinueRequested,
    Notify,
    RecastRequested,
    RefinementTurnAbandoned,
    RefinementTurnStarted,
    RunAgentTurn,
    TurnEnded,
)
from castor.domain.materia.engine import CastRejected
from castor.domain.materia.state import CastState

from .scripted import Driver, resolved

KEY = json.dumps(["Socket-1", "__singleton__", 1], separators=(",", ":"))


def paused_with_user_turn() -> tuple[Driver, RunAgentTurn]:
    """The plan loadout paused after castor's first draft, then a user message started a turn."""
    d = Driver(resolved(None, "plan"))
    d.reply("Draft 1: which stack?")
    d.send(RefinementTurnStarted)
    turn = d.pending()
    assert turn.user_driven and d.state.pending.user_driven and d.state.user_turn_pending
    return d, turn


def assert_withdrawn(d: Driver, turn: RunAgentTurn, reason: str) -> None:
    s = d.state
    assert s.paused and s.active and s.pending is None and not s.awaiting_response
    assert s.socket_state == "awaiting_user_refinement" and not s.multi_turn_finalizing
    assert s.multi_turn_refinements[KEY] == 1  # the withdrawn turn is not a draft
    assert s.last_assistant_text == "Draft 1: which stack?" and s.last_json is None
    abandoned = d.events("refinement_turn_abandoned")[-1].data
    assert abandoned == {"socket": "Socket-1", "materia": abandoned["materia"], "visitId": turn.visit_id, "visit": 1,
                         "reason": reason, "refinementTurn": 2}  # no item: its fields left out
    notes = [e for e in d.transitions[-1].effects if isinstance(e, Notify)]
    assert notes and notes[-1].level == "warning" and "withdrawn" in notes[-1].message


@pytest.mark.parametrize("reason", ["settled_without_end", "aborted", "session_shutdown", "session_closed",
                                    "timed_out"])
def test_abandoning_the_pending_user_turn_pauses_the_cast_with_its_drafts(reason: str) -> None:
    d, turn = paused_with_user_turn()
    tr = d.send(RefinementTurnAbandoned, visit_id=turn.visit_id, reason=reason)
    assert_withdrawn(d, turn, reason)
    assert not tr.of_type(RunAgentTurn) and not tr.of_type(CancelWork)  # nothing is sent or cancelled
    assert "refinement_turn_abandoned" in [e.type for e in tr.events()]


def test_after_withdrawal_the_user_can_reply_again_or_continue() -> None:
    d, turn = paused_with_user_turn()
    d.send(RefinementTurnAbandoned, visit_id=turn.visit_id, reason="settled_without_end")
    d.send(RefinementTurnStarted)  # the user types again: turn 2 once more
    again = d.pending()
    assert again.user_driven and again.visit_id != turn.visit_id
    assert d.events("context_refinement")[-1].data["refinementTurn"] == 2
    d.reply("Draft 2: postgres")
    assert d.state.multi_turn_refinements[KEY] == 2 and d.state.paused
    d.send(ContinueRequested)  # no longer refused as "awaiting"
    d.reply({"workItems": [{"id": "a", "title": "A"}]})
    assert d.events("socket_complete")[-1].data["refinementTurn"] == 2
    assert d.pending().socket_id == "Socket-2"


def test_a_late_agent_end_of_the_withdrawn_turn_is_ignored_never_applied() -> None:
    d, turn = paused_with_user_turn()
    d.send(RefinementTurnAbandoned, visit_id=turn.visit_id, reason="settled_without_end")
    before = d.state
    tr = d.send(TurnEnded, visit_id=turn.visit_id, text="Draft 2 (late)", stop_reason="stop")
    assert [e.type for e in tr.events()] == ["outcome_ignored"]
    assert tr.events()[0].data["visitId"] == turn.visit_id and tr.events()[0].data["reason"] == "not-current-visit"
    assert tr.state.model_dump() == {**before.model_dump(), "updated_at": tr.state.updated_at}
    # A second withdrawal of the same turn is ignored as well (never applied twice).
    tr = d.send(RefinementTurnAbandoned, visit_id=turn.visit_id, reason="session_closed")
    assert [e.type for e in tr.events()] == ["outcome_ignored"]


def test_abandoning_anything_but_the_pending_user_turn_changes_nothing() -> None:
    d = Driver(resolved(None, "plan"))
    own = d.pending()  # castor's own first turn (mode refinement, not user-driven)
    assert not own.user_driven and not d.state.user_turn_pending
    tr = d.send(RefinementTurnAbandoned, visit_id=own.visit_id, reason="settled_without_end")
    assert [e.type for e in tr.events()] == ["outcome_ignored"] and d.state.pending.visit_id == own.visit_id
    d.reply("Draft 1")
    d.send(RefinementTurnStarted)
    user = d.pending()
    tr = d.send(RefinementTurnAbandoned, visit_id="cast-1:Socket-1:1:999", reason="settled_without_end")
    assert [e.type for e in tr.events()] == ["outcome_ignored"] and d.state.pending.visit_id == user.visit_id
    d.send(AbortRequested)
    tr = d.send(RefinementTurnAbandoned, visit_id=user.visit_id, reason="aborted")
    assert tr.events()[0].data["reason"] == "cast-inactive" and d.state.aborted


def test_the_normal_end_then_a_settle_records_the_draft_and_nothing_else() -> None:
    d, turn = paused_with_user_turn()
    d.reply("Draft 2")
    after_end = d.state
    assert after_end.multi_turn_refinements[KEY] == 2 and after_end.paused
    tr = d.send(RefinementTurnAbandoned, visit_id=turn.visit_id, reason="settled_without_end")
    assert [e.type for e in tr.events()] == ["outcome_ignored"]
    assert tr.state.multi_turn_refinements == after_end.multi_turn_refinements and tr.state.paused
    assert not d.events("refinement_turn_abandoned")


def test_an_aborted_user_run_is_withdrawn_not_recorded_nor_retried() -> None:
    d, turn = paused_with_user_turn()
    tr = d.send(TurnEnded, visit_id=turn.visit_id, text="half a dra", error="Request was aborted",
                stop_reason="aborted", usage={"total": 7})
    assert_withdrawn(d, turn, "aborted")
    assert not tr.of_type(RunAgentTurn)  # no same-socket retry of a run the user cancelled
    assert d.state.usage.tokens.total == 7  # the tokens were spent all the same
    assert not d.events("same_socket_recovery_start")


def test_a_new_user_message_supersedes_a_turn_whose_end_was_never_reported() -> None:
    d, first = paused_with_user_turn()
    tr = d.send(RefinementTurnStarted)
    second = d.pending()
    assert second.user_driven and second.visit_id != first.visit_id
    types = [e.type for e in tr.events()]
    assert types.index("refinement_turn_abandoned") < types.index("context_refinement")
    assert tr.events("refinement_turn_abandoned")[0].data["reason"] == "superseded"
    assert d.events("context_refinement")[-1].data["refinementTurn"] == 2
    d.send(TurnEnded, visit_id=first.visit_id, text="late first")
    assert d.events("outcome_ignored")[-1].data["visitId"] == first.visit_id
    d.reply("Draft 2")
    assert d.state.multi_turn_refinements[KEY] == 2


def test_continue_is_still_refused_while_the_user_turn_runs() -> None:
    d, _turn = paused_with_user_turn()
    with pytest.raises(CastRejected) as err:
        d.send(ContinueRequested)
    assert err.value.data["reason"] == "awaiting"


def test_a_restart_withdraws_the_user_turn_and_resends_nothing() -> None:
    d, turn = paused_with_user_turn()
    tr = d.send(RecastRequested, after_restart=True)
    assert_withdrawn(d, turn, "restart")
    assert not tr.of_type(RunAgentTurn) and not tr.of_type(CancelWork)
    recast = tr.events("cast_recast")[0].data
    assert recast["paused"] is True and recast["reusedActivePrompt"] is False
    types = [e.type for e in tr.events()]
    assert types == ["refinement_turn_abandoned", "cast_recast"]
    d.send(TurnEnded, visit_id=turn.visit_id, text="the old run's late end")
    assert d.events("outcome_ignored")[-1].data["visitId"] == turn.visit_id
    d.send(ContinueRequested)
    assert d.pending().mode == "finalization"


def test_a_restart_while_paused_resends_nothing() -> None:
    d = Driver(resolved(None, "plan"))
    d.reply("Draft 1")
    turns_before = len(d.turns())
    tr = d.send(RecastRequested, after_restart=True)
    assert d.state.paused and len(d.turns()) == turns_before and not tr.of_type(CancelWork)
    assert [e.type for e in tr.events()] == ["cast_recast"] and tr.events()[0].data["paused"] is True
    assert d.state.multi_turn_refinements[KEY] == 1


def test_an_explicit_recast_of_a_cast_aborted_during_a_user_turn_follows_the_spec() -> None:
    """Spec §5.14: a failed/aborted cast's recast re-sends the stored prompt (here the user turn's);
    only the *resume of an active cast* (after_restart) withdraws instead."""
    d, turn = paused_with_user_turn()
    d.send(AbortRequested)
    d.send(RecastRequested)
    again = d.pending()
    assert not again.user_driven and again.prompt == turn.prompt
    assert d.events("cast_recast")[-1].data["reusedActivePrompt"] is True


def test_the_new_event_and_the_pending_flag_round_trip() -> None:
    d, turn = paused_with_user_turn()
    event = RefinementTurnAbandoned(visit_id=turn.visit_id, reason="aborted", at=5.0)
    assert EVENT_ADAPTER.validate_python(event.model_dump(mode="json")) == event
    assert (
        CastState.from_json(d.state.to_json()) == d.state and CastState.from_json(d.state.to_json()).pending.user_driven
    )
    with pytest.raises(ValueError):
        RefinementTurnAbandoned(visit_id=turn.visit_id, reason="because", at=5.0)

"""Every way a turn can end without an answer (docs/materia.md "When a turn ends without an answer").

One test (or a parametrised family) per row of that decision table, plus one per socket kind
proving that an interrupted turn's text is never taken as the socket's output while its usage is
still recorded. The LLM is the only stand-in: scripted outcomes through the pure engine.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from castor.domain.materia.budget import STOPPED_UNREPORTED_KEY, usage_caveats
from castor.domain.materia.cast_messages import (
    AbortRequested,
    CancelWork,
    ContinueRequested,
    Notify,
    RecastRequested,
    RefinementTurnStarted,
    ReviveRequested,
    RunAgentTurn,
    TurnEnded,
)
from castor.domain.materia.engine import CastRejected, step
from castor.domain.materia.revive import NotRevivable
from castor.domain.materia.state import CastState
from castor.domain.materia.surface import command

from .scripted import Driver, config, resolved

PARTIAL = "PARTIAL-CUT-OFF-TEXT"
USAGE = {"input": 11, "output": 7, "totalTokens": 18}


BUILDER, REVIEWER = "Socket-1", "Socket-2"


def text_cast() -> Driver:
    """The builder (text, Socket-1) then the reviewer (text, Socket-2)."""
    return Driver(resolved(config({
        BUILDER: {"type": "agent", "materia": "A", "edges": [{"when": "always", "to": REVIEWER}]},
        REVIEWER: {"type": "agent", "materia": "A"},
    })))


def json_cast() -> Driver:
    return Driver(resolved(config({
        "Socket-1": {"type": "agent", "materia": "J", "parse": "json", "assign": {"plan": "$.summary"},
                     "edges": [{"when": "always", "to": "Socket-2"}]},
        "Socket-2": {"type": "agent", "materia": "A"},
    })))


def esc(d: Driver, *, text: str = PARTIAL, usage: dict[str, Any] | None = None, **fields: Any):
    """What the harness reports for the user's Esc: ``aborted`` (stop reason "aborted"), maybe text."""
    work = d.pending()
    return d.send(TurnEnded, visit_id=work.visit_id, text=text, stop_reason="aborted",
                  usage=USAGE if usage is None else usage, **fields)


def no_partial_text_kept(d: Driver) -> None:
    for path, write in d.artifacts().items():
        if not path.startswith("contexts/"):
            assert PARTIAL not in write.content, f"the interrupted text reached {path}"
    s = d.state
    assert PARTIAL not in json.dumps(s.data) and PARTIAL not in (s.last_output or "")
    assert PARTIAL not in (s.last_assistant_text or "")


def assert_interrupted(d: Driver, socket: str, turn: RunAgentTurn) -> None:
    s = d.state
    assert s.active and s.interrupted and s.pending is None and not s.awaiting_response
    assert s.socket_state == "interrupted" and s.current_socket_id == socket and not s.failed
    ev = d.events("turn_interrupted")[-1].data
    assert ev["socket"] == socket and ev["visitId"] == turn.visit_id and ev["mode"] == turn.mode
    assert ev["reason"] == "aborted"
    notes = [e for e in d.transitions[-1].effects if isinstance(e, Notify)]
    assert notes and notes[-1].level == "warning"
    assert "interrupted" in notes[-1].message and "/materia continue" in notes[-1].message
    assert "/materia abort" in notes[-1].message
    assert not d.events("socket_complete") or d.events("socket_complete")[-1].data["socket"] != socket
    no_partial_text_kept(d)


# ----------------------------------------------------------------------------- row: the user's Esc


@pytest.mark.parametrize("text", [PARTIAL, ""])
def test_esc_on_a_text_socket_pauses_there_and_continue_reruns_it_under_a_new_visit_id(text: str) -> None:
    d = text_cast()
    turn = d.pending()
    esc(d, text=text)
    assert_interrupted(d, BUILDER, turn)
    assert d.state.usage.tokens.total == 18  # the interrupted turn's usage is recorded
    assert d.events("turn_interrupted")[-1].data["textDiscarded"] is bool(text)
    assert "sockets/Socket-1/1.md" not in d.artifacts()

    d.send(ContinueRequested)
    again = d.pending()
    assert again.socket_id == BUILDER and again.visit == turn.visit == 1
    assert again.visit_id != turn.visit_id and again.prompt == turn.prompt and again.mode == "normal"
    assert d.state.visits[BUILDER] == 1  # the same visit: no limit is spent on a re-run
    assert d.events("turn_resumed")[-1].data["by"] == "continue"
    d.reply("BUILT")
    assert d.artifacts()["sockets/Socket-1/1.md"].content == "BUILT"
    assert d.pending().socket_id == REVIEWER


def test_esc_before_the_provider_reported_usage_records_the_turn_as_reporting_none_not_as_free() -> None:
    """The harness sends no usage for a turn stopped mid-stream (an OpenAI-style stream reports it at
    its end): the turn's record says its tokens were not reported, and the totals' caveat says so."""
    d = text_cast()
    turn = d.pending()
    d.send(TurnEnded, visit_id=turn.visit_id, text=PARTIAL, stop_reason="aborted", usage=None)
    assert_interrupted(d, BUILDER, turn)
    (record,) = d.state.usage.turns
    assert (record.socket, record.unreported, record.tokens.total) == (BUILDER, ["tokens"], 0)
    assert d.events("usage_unreported")[-1].data == {"socket": BUILDER, "taskId": None, "figures": ["tokens"]}


def test_esc_after_tool_call_steps_counts_them_and_says_the_stopped_messages_share_is_missing() -> None:
    """A turn stopped after earlier tool-call steps: the harness sends those steps' usage and says the
    stopped message reported nothing of its own (STOPPED_UNREPORTED_KEY). The steps count; the record
    says the turn's tokens were not all reported, and the cost is an estimate."""
    d = text_cast()
    turn = d.pending()
    steps = {"input": 100, "output": 20, "totalTokens": 120, "cost": {"total": 0.5, "totalFromProvider": True},
             STOPPED_UNREPORTED_KEY: True}
    d.send(TurnEnded, visit_id=turn.visit_id, text=PARTIAL, stop_reason="aborted", usage=steps)
    assert_interrupted(d, BUILDER, turn)
    (record,) = d.state.usage.turns
    assert (record.unreported, record.tokens.total, record.cost.total) == (["tokens"], 120, 0.5)
    assert d.state.usage.costEstimated is True
    assert d.events("usage_unreported")[-1].data == {"socket": BUILDER, "taskId": None, "figures": ["tokens"]}
    assert "1 turn stopped before its last message reported usage" in usage_caveats(d.state.usage)


def test_with_a_budget_the_stopped_messages_missing_share_is_said_once_as_a_warning() -> None:
    d = Driver(resolved(config({
        BUILDER: {"type": "agent", "materia": "A", "edges": [{"when": "always", "to": REVIEWER}]},
        REVIEWER: {"type": "agent", "materia": "A"},
    }, budget={"maxTokens": 100_000})))
    turn = d.pending()
    steps = {"input": 100, "output": 20, "totalTokens": 120, STOPPED_UNREPORTED_KEY: True}
    d.send(TurnEnded, visit_id=turn.visit_id, text=PARTIAL, stop_reason="aborted", usage=steps)
    said = [n for n in d.transitions[-1].of_type(Notify) if "usage" in n.message]
    assert [n.level for n in said] == ["warning"], said
    assert ("Socket-1's turn was stopped before its last message reported usage: its earlier steps' 120 tokens "
            "count") in said[0].message, said


def test_esc_whose_stopped_message_reported_its_usage_is_not_marked() -> None:
    d = text_cast()
    turn = d.pending()
    steps = {"input": 100, "output": 20, "totalTokens": 120, "cost": {"total": 0.5, "totalFromProvider": True}}
    d.send(TurnEnded, visit_id=turn.visit_id, text=PARTIAL, stop_reason="aborted", usage=steps)
    (record,) = d.state.usage.turns
    assert (record.unreported, record.tokens.total) == (None, 120)
    assert d.state.usage.costEstimated is False and not d.events("usage_unreported")


def test_esc_on_a_json_socket_is_no_invalid_json_failure() -> None:
    d = json_cast()
    turn = d.pending()
    esc(d, text='{"summary": "half')
    assert not d.state.failed and d.state.failed_reason is None
    assert_interrupted(d, "Socket-1", turn)
    assert d.state.last_json is None and "plan" not in d.state.data
    d.send(ContinueRequested)
    d.reply({"summary": "the plan"})
    assert d.state.data["plan"] == "the plan" and d.pending().socket_id == "Socket-2"


def test_esc_on_castors_first_multi_turn_draft_records_no_draft() -> None:
    d = Driver(resolved(None, "plan"))
    turn = d.pending()
    assert turn.mode == "refinement" and not turn.user_driven
    esc(d)
    assert_interrupted(d, "Socket-1", turn)
    assert d.state.multi_turn_refinements == {} and not d.events("socket_refinement")
    assert not d.state.paused
    d.send(ContinueRequested)
    again = d.pending()
    assert again.mode == "refinement" and again.prompt == turn.prompt and not again.user_driven
    d.reply("Draft 1")
    assert d.state.paused and [e.data["refinementTurn"] for e in d.events("socket_refinement")] == [1]


def test_esc_on_a_finalisation_turn_keeps_the_drafts_and_continue_finalises_again() -> None:
    d = Driver(resolved(None, "plan"))
    d.reply("Draft 1")
    d.send(ContinueRequested)
    fin = d.pending()
    assert fin.mode == "finalization"
    esc(d, text='{"workItems": [')
    assert_interrupted(d, "Socket-1", fin)
    assert d.state.multi_turn_refinements  # the draft counter is untouched
    assert "sockets/Socket-1/1.md" not in d.artifacts()
    d.send(ContinueRequested)
    again = d.pending()
    assert again.mode == "finalization" and again.prompt == fin.prompt and d.state.multi_turn_finalizing
    d.reply({"workItems": [{"id": "a", "title": "A"}]})
    assert d.artifacts()["sockets/Socket-1/1.md"].manifest["finalized"] is True


def test_esc_on_a_recovery_retry_is_not_retried_again() -> None:
    d = text_cast()
    d.fail_turn("tool call timed out after 30s")
    retry = d.pending()
    assert retry.recovery
    esc(d)
    assert_interrupted(d, BUILDER, retry)
    d.send(ContinueRequested)
    assert d.pending().prompt == retry.prompt
    d.reply("BUILT")
    assert d.pending().socket_id == REVIEWER


def test_esc_on_the_retry_after_a_recovery_compaction_keeps_nothing() -> None:
    d = text_cast()
    d.fail_turn("context_length_exceeded: too many tokens")
    d.compacted(ok=True, result={"tokensBefore": 100, "tokensAfter": 10})
    retry = d.pending()
    assert retry.recovery
    esc(d)
    assert_interrupted(d, BUILDER, retry)
    d.send(ContinueRequested)
    assert d.pending().prompt == retry.prompt
    d.reply("BUILT")
    assert d.artifacts()["sockets/Socket-1/1.md"].content == "BUILT"


def test_an_aborted_turn_that_also_carries_an_error_is_interrupted_not_retried() -> None:
    """A cancel outcome (``stop_reason`` "aborted", ``error`` "agent turn cancelled") is an interruption:
    no same-socket recovery runs a turn the user stopped."""
    d = text_cast()
    turn = d.pending()
    d.send(TurnEnded, visit_id=turn.visit_id, text="", stop_reason="aborted", error="agent turn cancelled")
    assert_interrupted(d, BUILDER, turn)
    assert not d.events("same_socket_recovery_start")


def test_a_late_end_of_the_interrupted_turn_is_ignored() -> None:
    d = text_cast()
    turn = d.pending()
    esc(d)
    late = step(d.state, TurnEnded(visit_id=turn.visit_id, text="LATE", at=50))
    assert [e.type for e in late.events()] == ["outcome_ignored"]
    assert late.state.interrupted


def test_continue_and_recast_after_esc_each_run_one_turn_and_refinement_is_refused() -> None:
    d = text_cast()
    esc(d)
    with pytest.raises(CastRejected) as refused:
        d.send(RefinementTurnStarted)
    assert refused.value.data["reason"] == "not-paused"
    with pytest.raises(NotRevivable):
        d.send(ReviveRequested)
    before = len(d.turns())
    d.send(RecastRequested)  # the user's recast of an interrupted cast: the same as continue
    assert len(d.turns()) == before + 1 and d.events("turn_resumed")[-1].data["by"] == "recast"
    with pytest.raises(CastRejected) as busy:
        d.send(ContinueRequested)  # now the re-run is pending
    assert busy.value.data["reason"] == "awaiting"


# ----------------------------------------------------------------------------- row: abort while a turn runs


def test_abort_while_the_turn_runs_cancels_it_and_no_further_turn_starts() -> None:
    d = text_cast()
    turn = d.pending()
    tr = d.send(AbortRequested)
    assert tr.of_type(CancelWork) == [CancelWork(visit_id=turn.visit_id, reason="cast_aborted")]
    assert not tr.of_type(RunAgentTurn)
    s = d.state
    assert not s.active and s.aborted and s.failed and s.resumable
    assert d.events("cast_end")[-1].data["aborted"] is True
    late = step(s, TurnEnded(visit_id=turn.visit_id, text="LATE", usage=USAGE, at=60))
    assert [e.type for e in late.events()] == ["outcome_ignored"] and not late.of_type(RunAgentTurn)
    d.send(RecastRequested)  # recastable: the same turn again
    assert d.pending().socket_id == BUILDER and d.pending().prompt == turn.prompt


def test_abort_twice_the_second_is_refused_and_changes_nothing() -> None:
    d = text_cast()
    d.send(AbortRequested)
    state = d.state
    with pytest.raises(CastRejected) as second:
        d.send(AbortRequested)
    assert second.value.data["reason"] == "not-active" and d.state is state


def test_esc_then_abort_ends_the_cast_aborted_without_cancelling_anything() -> None:
    d = text_cast()
    esc(d)
    tr = d.send(AbortRequested)
    assert not tr.of_type(CancelWork)  # nothing was pending any more
    assert d.state.aborted and not d.state.active
    d.send(RecastRequested)
    assert d.pending().socket_id == BUILDER


def test_abort_after_the_end_was_applied_cancels_the_next_turn_it_started() -> None:
    """Abort while the turn is ending, end first: the output counts (it was a real answer) and the
    next socket's turn, already dispatched, is cancelled at once."""
    d = text_cast()
    d.reply("BUILT")
    nxt = d.pending()
    assert nxt.socket_id == REVIEWER
    tr = d.send(AbortRequested)
    assert tr.of_type(CancelWork) == [CancelWork(visit_id=nxt.visit_id, reason="cast_aborted")]
    assert d.artifacts()["sockets/Socket-1/1.md"].content == "BUILT"


def test_abort_while_the_turn_is_ending_abort_first_the_end_is_ignored() -> None:
    d = text_cast()
    turn = d.pending()
    d.send(AbortRequested)
    tr = d.send(TurnEnded, visit_id=turn.visit_id, text="BUILT", usage=USAGE)
    assert [e.type for e in tr.events()] == ["outcome_ignored"]
    assert "sockets/Socket-1/1.md" not in d.artifacts() and not tr.of_type(RunAgentTurn)


# ----------------------------------------------------------------------------- row: the turn's deadline


@pytest.mark.parametrize("text", ["", PARTIAL])
def test_a_turn_past_its_deadline_is_a_failure_never_an_output(text: str) -> None:
    d = text_cast()
    d.send(TurnEnded, visit_id=d.pending().visit_id, text=text, stop_reason="error",
           error="chat completion deadline of 1s exceeded", usage=USAGE, agent="openai HTTP agent")
    if text:  # it produced text: not retried (the text might be a real answer cut short)
        assert d.state.failed and "Openai HTTP agent turn failed" in d.state.failed_reason
    else:  # nothing came back: one same-socket retry, then a revivable failure
        assert d.pending().recovery
        d.fail_turn("chat completion deadline of 1s exceeded")
        assert d.state.failed and d.state.recovery_exhaustion is not None
    assert d.state.usage.tokens.total == 18
    assert "sockets/Socket-1/1.md" not in d.artifacts()
    no_partial_text_kept(d)


# ----------------------------------------------------------------------------- rows: session closed, restart


@pytest.mark.parametrize("mode", ["normal", "finalization"])
def test_a_turn_lost_with_the_harness_or_a_restart_is_redone_under_a_new_visit_id(mode: str) -> None:
    d = Driver(resolved(None, "plan")) if mode == "finalization" else text_cast()
    if mode == "finalization":
        d.reply("Draft 1")
        d.send(ContinueRequested)
    lost = d.pending()
    # The harness disconnected (or the cast's actor restarted): nothing is reported; the saved
    # state still waits for the turn. Resuming it:
    tr = d.send(RecastRequested, after_restart=True)
    assert tr.of_type(CancelWork) == [CancelWork(visit_id=lost.visit_id, reason="cast_restarted")]
    again = d.pending()
    assert again.visit_id != lost.visit_id and again.prompt == lost.prompt and again.mode == mode
    assert d.events("cast_recast")[-1].data["reusedActivePrompt"] is True
    late = step(d.state, TurnEnded(visit_id=lost.visit_id, text="LATE", at=70))
    assert [e.type for e in late.events()] == ["outcome_ignored"]


def test_a_restart_of_an_interrupted_cast_keeps_it_interrupted_and_sends_nothing() -> None:
    d = text_cast()
    esc(d)
    tr = d.send(RecastRequested, after_restart=True)
    assert not tr.of_type(RunAgentTurn) and not tr.of_type(CancelWork)
    assert d.state.interrupted and d.events("cast_recast")[-1].data["interrupted"] is True
    notes = tr.of_type(Notify)
    assert notes and "/materia continue" in notes[-1].message
    d.send(ContinueRequested)
    assert d.pending().socket_id == BUILDER


def test_the_interrupted_state_round_trips() -> None:
    d = text_cast()
    esc(d)
    again = CastState.from_json(d.state.to_json())
    assert again == d.state and again.interrupted


# ----------------------------------------------------------------------------- texts name the surface


def test_texts_name_the_commands_of_the_surface_the_user_is_in() -> None:
    d = text_cast()
    esc(d)
    assert "/materia continue" in d.state.last_message
    d.send(RecastRequested, after_restart=True, surface="cli")  # resumed from the CLI
    note = d.transitions[-1].of_type(Notify)[-1].message
    assert "castor continue cast-1" in note and "castor abort cast-1" in note and "/materia" not in note
    d.send(ContinueRequested, surface="harness")
    esc(d)
    assert "/materia continue" in d.state.last_message and "castor" not in d.state.last_message



def test_a_harness_text_names_an_id_only_where_the_extension_takes_one() -> None:
    """The extension's /materia continue, abort and status refuse an argument (its usage text):
    a hint naming "/materia status <id>" would send the user into that refusal. Only recast and
    revive take an id there; the CLI always names it."""
    for verb in ("continue", "abort", "status"):
        assert command("harness", verb, "20261204-x") == f"/materia {verb}"
        assert command("cli", verb, "20261204-x") == f"castor {verb} 20261204-x"
    for verb in ("recast", "revive"):
        assert command("harness", verb, "20261204-x") == f"/materia {verb} 20261204-x"
        assert command("harness", verb, "20261204-x", bare_in_harness=True) == f"/materia {verb}"


def test_a_failure_names_the_agent_that_failed() -> None:
    d = text_cast()
    d.send(TurnEnded, visit_id=d.pending().visit_id, text="partial", stop_reason="error",
           error="invalid api key", agent="scripted agent (answers.json)")
    assert d.state.failed_reason.startswith("Non-recoverable")
    assert "Scripted agent (answers.json) turn failed" in d.state.failed_reason and "Pi" not in d.state.failed_reason


def test_revive_of_a_cast_that_has_not_failed_points_at_no_refusing_command() -> None:
    d = text_cast()
    d.reply("BUILT")
    d.reply("REVIEWED")
    assert d.state.complete
    with pytest.raises(NotRevivable) as err:
        d.send(ReviveRequested, surface="cli")
    assert "recast" not in err.value.message


def test_an_interrupted_turn_that_crosses_a_stopping_budget_ends_the_cast() -> None:
    d = Driver(resolved(config({
        BUILDER: {"type": "agent", "materia": "A", "edges": [{"when": "always", "to": REVIEWER}]},
        REVIEWER: {"type": "agent", "materia": "A"},
    }, budget={"maxTokens": 10, "stopAtLimit": True})))
    esc(d)  # 18 tokens: over the limit
    assert d.state.failed and d.state.failed_reason == "pi-materia budget limit reached"
    assert d.events("turn_interrupted") and d.events("budget_limit")
    no_partial_text_kept(d)

"""Host-context compaction in the engine (spec §6.2 step 3, §6.5): the result summary, the
``skipped`` marker of a host with no context, and the proactive compaction progress events."""

from __future__ import annotations

import math

import pytest

from castor.domain.materia import compaction
from castor.domain.materia.cast_messages import (
    EVENT_ADAPTER,
    ContinueRequested,
    Notify,
    ProactiveCompactionFinished,
    ProactiveCompactionStarted,
    RunAgentTurn,
)
from castor.domain.materia.config import Compaction

from .scripted import Driver, config, resolved

pytestmark = pytest.mark.timeout(30)


def _decision(tokens: float = 30_000, window: float = 32_000) -> compaction.ProactiveDecision:
    decision = compaction.decide_proactive({"tokens": tokens, "contextWindow": window}, model_context_window=None,
                                           config=None)
    assert decision is not None
    return decision


def test_compaction_summary_keeps_only_the_spec_fields_of_the_right_type() -> None:
    raw = {"tokensBefore": 900, "tokensAfter": 120.5, "entriesRemoved": 4, "summaryTokens": 30,
           "firstKeptEntryId": "e7", "summary": "SECRET SUMMARY TEXT", "details": {"x": 1}}
    assert compaction.compaction_summary(raw) == {"tokensBefore": 900, "tokensAfter": 120.5, "entriesRemoved": 4,
                                                  "summaryTokens": 30, "firstKeptEntryId": "e7"}
    bad = {"tokensBefore": True, "tokensAfter": math.nan, "entriesRemoved": -1, "summaryTokens": "30",
           "firstKeptEntryId": ""}
    assert compaction.compaction_summary(bad) == {}
    assert compaction.compaction_summary(None) == {} and compaction.compaction_summary([1]) == {}


def test_recovery_compaction_of_a_host_without_context_records_the_skipped_marker() -> None:
    d = Driver(resolved(None, "hello"))
    d.fail_turn("context window exceeded")
    d.compacted(result={}, skipped=compaction.NO_HOST_CONTEXT)
    complete = d.events("same_socket_recovery_action_complete")[0].data
    assert complete["result"] == {} and complete["skipped"] == "no host context"
    assert isinstance(d.pending(), RunAgentTurn) and d.pending().recovery


def test_recovery_compaction_of_a_real_host_has_no_skipped_marker_and_only_summary_fields() -> None:
    d = Driver(resolved(None, "hello"))
    d.fail_turn("context window exceeded")
    d.compacted(result={"tokensBefore": 50_000, "tokensAfter": 9_000, "entriesRemoved": 12, "summaryTokens": 800,
                        "firstKeptEntryId": "abc", "summary": "the whole summary text"})
    complete = d.events("same_socket_recovery_action_complete")[0].data
    assert "skipped" not in complete
    assert complete["result"] == {"tokensBefore": 50_000, "tokensAfter": 9_000, "entriesRemoved": 12,
                                  "summaryTokens": 800, "firstKeptEntryId": "abc"}



def test_an_esc_during_the_recovery_compaction_interrupts_the_cast_and_continue_runs_the_turn_again() -> None:
    """The user stops the harness's compaction (Esc) before the retry: the cast is interrupted,
    as by an Esc during the turn -- not failed and not revivable, which only a recast recovered --
    and continue re-runs the turn (a fresh context overflow goes to recovery again)."""
    d = Driver(resolved(None, "hello"))
    d.fail_turn("context window exceeded")
    d.compacted(ok=False, cancelled=True, error="Compaction cancelled (cancelled)")
    assert d.state.active and d.state.interrupted and not d.state.failed and d.state.pending is None
    assert d.events("same_socket_recovery_action_cancelled")[0].data["error"] == "Compaction cancelled (cancelled)"
    assert d.events("turn_interrupted")[-1].data["reason"] == "compaction_cancelled"
    assert not d.events("same_socket_recovery_action_failed") and not d.events("cast_end")
    d.send(ContinueRequested)
    assert isinstance(d.pending(), RunAgentTurn) and d.events("turn_resumed")
    # a compaction that failed (not stopped by the user) still fails the cast, as before
    e = Driver(resolved(None, "hello"))
    e.fail_turn("context window exceeded")
    e.compacted(ok=False, error="Nothing to compact (session too small) (compaction_failed)")
    assert e.state.failed and e.events("same_socket_recovery_action_failed")


def test_proactive_compaction_complete_records_decision_socket_and_result_and_keeps_the_turn_pending() -> None:
    d = Driver(resolved(config({"Socket-1": {"type": "agent", "materia": "A"}})))
    turn = d.pending()
    decision = _decision()
    before = d.state.model_dump()
    d.send(ProactiveCompactionStarted, visit_id=turn.visit_id, decision=decision)
    d.send(ProactiveCompactionFinished, visit_id=turn.visit_id, decision=decision, ok=True,
           result={"tokensBefore": 30_000, "tokensAfter": 4_000, "summary": "dropped"})
    start = d.events("proactive_compaction_start")[0].data
    assert start == {"action": "compact", "reason": "context_pressure", "thresholdPercent": 75.0,
                     "thresholdMode": "default_tiered",
                     "thresholdTier": {"id": "lt-128k", "minContextWindow": 0, "maxContextWindow": 128_000},
                     "tokens": 30_000.0,
                     "contextWindow": 32_000.0, "percent": 93.75, "socket": "Socket-1",
                     "visit": 1, "mode": "normal"}  # no item: its fields left out, as pi-materia
    complete = d.events("proactive_compaction_complete")[0].data
    assert complete == {**start, "result": {"tokensBefore": 30_000, "tokensAfter": 4_000}}
    # Progress only: the same turn is still what the cast waits for, nothing else changed.
    assert d.pending() is turn
    after = d.state.model_dump()
    assert {k: v for k, v in after.items() if k != "updated_at"} == {k: v for k, v in before.items()
                                                                       if k != "updated_at"}
    d.reply("done")
    assert d.state.phase == "complete"


def test_proactive_compaction_failure_warns_and_the_cast_stays_active_awaiting_the_turn() -> None:
    """Conformance 61: a failed proactive compaction only warns; the turn goes on."""
    d = Driver(resolved(config({"Socket-1": {"type": "agent", "materia": "A"}})))
    turn = d.pending()
    decision = _decision()
    d.send(ProactiveCompactionStarted, visit_id=turn.visit_id, decision=decision)
    tr = d.send(ProactiveCompactionFinished, visit_id=turn.visit_id, decision=decision, ok=False,
                error="Nothing to compact (session too small)")
    failed = d.events("proactive_compaction_failed")[0].data
    assert failed["warning"] is True and failed["error"] == "Nothing to compact (session too small)"
    assert failed["thresholdTier"]["id"] == "lt-128k" and failed["socket"] == "Socket-1"
    notes = [e for e in tr.effects if isinstance(e, Notify)]
    assert len(notes) == 1 and notes[0].level == "warning" and "Nothing to compact" in notes[0].message
    assert d.state.active and d.state.awaiting_response and d.pending() is turn
    assert not d.events("cast_end")
    # A later context_window error still goes to same-socket recovery.
    d.fail_turn("context window exceeded")
    assert d.events("same_socket_recovery_action_start")


def test_a_proactive_compaction_the_user_cancelled_interrupts_the_cast_and_continue_sends_the_turn() -> None:
    """The user's Esc during the compaction before the turn: not a failure that sends the turn
    anyway, but the user's stop -- the cast is interrupted at the socket, as by an Esc in the turn."""
    d = Driver(resolved(config({"Socket-1": {"type": "agent", "materia": "A"}})))
    turn = d.pending()
    decision = _decision()
    d.send(ProactiveCompactionStarted, visit_id=turn.visit_id, decision=decision)
    tr = d.send(ProactiveCompactionFinished, visit_id=turn.visit_id, decision=decision, ok=False,
                error="Compaction cancelled", cancelled=True)
    assert d.events("proactive_compaction_cancelled")[0].data["error"] == "Compaction cancelled"
    assert d.events("turn_interrupted")[0].data["reason"] == "compaction_cancelled"
    assert not d.events("proactive_compaction_failed") and not d.events("cast_end")
    assert d.state.active and d.state.pending is None and d.state.socket_state == "interrupted"
    notes = [e for e in tr.effects if isinstance(e, Notify)]
    assert len(notes) == 1 and "interrupted" in notes[0].message and "Sending the turn" not in notes[0].message
    tr = d.send(ContinueRequested)
    [again] = [e for e in tr.effects if isinstance(e, RunAgentTurn)]
    assert again.visit_id != turn.visit_id and again.prompt == turn.prompt
    d.reply("done")
    assert d.state.phase == "complete"


def test_proactive_progress_for_a_turn_that_is_not_pending_is_ignored() -> None:
    d = Driver(resolved(config({"Socket-1": {"type": "agent", "materia": "A"}})))
    turn = d.pending()
    d.send(ProactiveCompactionStarted, visit_id="someone-else", decision=_decision())
    assert not d.events("proactive_compaction_start")
    assert d.events("outcome_ignored")[-1].data["reason"] == "not-current-visit"
    d.reply("done")
    d.send(ProactiveCompactionFinished, visit_id=turn.visit_id, decision=_decision(), ok=False, error="late")
    assert not d.events("proactive_compaction_failed")
    assert d.events("outcome_ignored")[-1].data["reason"] == "cast-inactive"


def test_proactive_events_round_trip_as_plain_maps() -> None:
    """They travel through mailboxes and the state's outbox as plain maps, like every event."""
    event = ProactiveCompactionFinished(visit_id="v", decision=_decision(), ok=True, result={"tokensBefore": 1}, at=1.0)
    again = EVENT_ADAPTER.validate_python(event.model_dump(mode="json"))
    assert again == event


# ----------------------------------------------------------------------------- threshold tier record


def test_the_threshold_tier_in_a_proactive_event_is_the_tier_record_with_its_bounds() -> None:
    """pi-materia writes ``thresholdTier`` as the matched tier: its id (when it has one) and its
    context-window bounds, not a bare name; a configured tier without an id gets none invented."""
    d = Driver(resolved(config({"Socket-1": {"type": "agent", "materia": "A"}})))
    turn = d.pending()
    d.send(ProactiveCompactionStarted, visit_id=turn.visit_id, decision=_decision(tokens=120_000, window=200_000))
    assert d.events("proactive_compaction_start")[0].data["thresholdTier"] == {"id": "gte-200k",
                                                                             "minContextWindow": 200_000}
    middle = compaction.threshold_for(None, 150_000)
    assert middle.event_tier() == {"id": "128k-to-199999", "minContextWindow": 128_000, "maxContextWindow": 200_000}
    tiers = Compaction(proactive_threshold_tiers=[{"maxContextWindow": 50_000, "thresholdPercent": 80},
                                                  {"id": "big", "minContextWindow": 50_000, "thresholdPercent": 60}])
    assert compaction.threshold_for(tiers, 49_999).event_tier() == {"minContextWindow": 0, "maxContextWindow": 50_000}
    assert compaction.threshold_for(tiers, 50_000).event_tier() == {"id": "big", "minContextWindow": 50_000}


@pytest.mark.parametrize("window", [None, 0, -1, math.nan, math.inf])
def test_an_unknown_or_invalid_context_window_falls_back_to_55_percent_with_no_tier(window: float | None) -> None:
    """No usable context window: the conservative 55% and no tier at all (the event has no
    ``thresholdTier``), whether or not configured tiers exist (a window of 0 is in a configured
    first tier, which starts at 0, but in no default tier)."""
    tiers = Compaction(proactive_threshold_tiers=[{"maxContextWindow": 50_000, "thresholdPercent": 90},
                                                  {"minContextWindow": 50_000, "thresholdPercent": 80}])
    for config_ in (None, tiers):
        threshold = compaction.threshold_for(config_, window)
        if config_ is tiers and window == 0:
            assert (threshold.percent, threshold.event_tier()) == (90, {"minContextWindow": 0,
                                                                        "maxContextWindow": 50_000})
            continue
        assert (threshold.percent, threshold.mode, threshold.event_tier()) == (55, "default_tiered", None)
    decision = compaction.decide_proactive({"percent": 60}, model_context_window=None, config=None)
    assert decision is not None and "thresholdTier" not in decision.event_data()
    assert decision.event_data()["thresholdPercent"] == 55

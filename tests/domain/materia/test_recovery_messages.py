"""Same-socket recovery failure texts, in pi-materia's wording: every one names the turn as
``<mode> turn for socket "<id>"`` plus `` item "<key>"`` (the key JSON-quoted, left out when empty);
a failed recovery compaction fails the cast "Same-socket recovery retry failed for <turn>:
Same-socket recovery action compact failed for <turn>: <error>. Original failure: <original>"."""

from __future__ import annotations

import pytest

from .scripted import Driver, config, resolved

pytestmark = pytest.mark.timeout(10)

ORIGINAL = 'Agent turn failed before producing an assistant response for socket "Socket-1": context window exceeded'


def _loop_driver(key: str) -> Driver:
    cfg = resolved(config({"Socket-1": {"type": "agent", "materia": "A",
                                        "foreach": {"items": "state.items", "cursor": "c"}}}))
    return Driver(cfg, data={"items": [{"id": key}]})


def test_a_failed_recovery_compaction_fails_as_a_failed_retry_wrapping_the_action_failure() -> None:
    d = _loop_driver('a"b')
    d.fail_turn("context window exceeded")
    d.compacted(ok=False, error="compaction provider unavailable")
    label = 'normal turn for socket "Socket-1" item "a\\"b"'
    action = f"Same-socket recovery action compact failed for {label}: compaction provider unavailable"
    expected = f"Same-socket recovery retry failed for {label}: {action}. Original failure: {ORIGINAL}"
    assert d.state.failed_reason == expected
    retry_failed = d.events("same_socket_recovery_retry_failed")[0].data
    assert retry_failed["error"] == action and retry_failed["originalError"] == ORIGINAL
    assert d.events("same_socket_recovery_action_failed")[0].data["error"] == "compaction provider unavailable"


def test_exhausted_and_non_recoverable_failures_name_the_item_as_json_and_an_empty_key_not_at_all() -> None:
    d = _loop_driver("x\\y")
    d.fail_turn("context window exceeded")
    d.compacted()
    d.fail_turn("context window exceeded")
    assert d.state.failed_reason.startswith(
        'Same-socket recovery exhausted for normal turn for socket "Socket-1" item "x\\\\y" after 1/1 attempt(s): ')
    e = _loop_driver("")
    e.fail_turn("provider auth failed")
    assert e.state.failed_reason.startswith(
        'Non-recoverable turn failure for normal turn for socket "Socket-1" (same-socket recovery not attempted): ')


def test_a_retry_is_announced_in_pi_materias_words() -> None:
    from castor.domain.materia.cast_messages import Notify

    d = _loop_driver("a")
    d.fail_turn("context window exceeded")
    tr = d.compacted()
    label = 'normal turn for socket "Socket-1" item "a"'
    notes = [e.message for e in tr.effects if isinstance(e, Notify) and e.level == "warning"]
    assert notes == [f"pi-materia retrying {label} after recoverable context_window failure (1/1)."]
    assert d.state.last_message == f"Retrying {label} after recoverable context_window failure (1/1)."


def test_a_transient_transport_failure_is_reported_in_pi_materias_words() -> None:
    from castor.domain.materia.cast_messages import Notify

    d = _loop_driver("a")
    tr = d.fail_turn("WebSocket error", text="")
    full = 'Agent turn failed before producing an assistant response for socket "Socket-1": WebSocket error'
    expected = ('Transient transport failure while awaiting normal turn for socket "Socket-1" item "a"; '
                f"preserving active Pi turn: {full}")
    assert d.state.active and d.state.last_message == expected
    notes = [e.message for e in tr.effects if isinstance(e, Notify) and e.level == "warning"]
    assert notes == [f"pi-materia warning: {expected}"]


def test_a_failed_proactive_compaction_is_reported_in_pi_materias_words() -> None:
    from castor.domain.materia import compaction
    from castor.domain.materia.cast_messages import Notify, ProactiveCompactionFinished, ProactiveCompactionStarted

    d = _loop_driver("a")
    turn = d.pending()
    decision = compaction.decide_proactive({"tokens": 30_000, "contextWindow": 32_000}, model_context_window=None,
                                           config=None)
    assert decision is not None
    d.send(ProactiveCompactionStarted, visit_id=turn.visit_id, decision=decision)
    tr = d.send(ProactiveCompactionFinished, visit_id=turn.visit_id, decision=decision, ok=False,
                error="Nothing to compact")
    expected = ('Proactive compaction failed before normal turn for socket "Socket-1" item "a"; continuing turn '
                "so same-socket recovery can handle any later context-window failure: Nothing to compact")
    assert d.state.last_message == expected and d.pending() is turn
    notes = [e.message for e in tr.effects if isinstance(e, Notify) and e.level == "warning"]
    assert notes == [f"pi-materia warning: {expected}"]

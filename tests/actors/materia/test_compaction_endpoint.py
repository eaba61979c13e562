"""Host-context compaction over the endpoint (spec §6.2 step 3, §6.5; conformance 54, 60, 61).

A real :class:`Server` and a real :class:`Client` playing a harness whose session transcript
accumulates (as Pi's does): it answers ``session.context_usage`` and ``session.compact`` the way
integrations/pi/src/index.ts does, or leaves them out (``unknown_method``), fails them, or never
answers. The LLM is the only fake: the test answers each ``agent.run_turn`` itself.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from castor.client import Client
from castor.endpoint.app import build_dispatcher
from castor.endpoint.server import Server
from castor.messages.errors import Cancelled, Conflict, UnknownMethod

from .helpers import events, make_runtime, wait_for, write_project_config

pytestmark = pytest.mark.timeout(30)

SID = "pi-compact"
CONFIG = {
    "activeLoadout": "Two",
    "materia": {"A": {"prompt": "A-INSTRUCTIONS", "tools": "none"}, "B": {"prompt": "B-INSTRUCTIONS", "tools": "none"}},
    "loadouts": {"Two": {"entry": "Socket-1", "sockets": {
        "Socket-1": {"type": "agent", "materia": "A", "edges": [{"when": "always", "to": "Socket-2"}]},
        "Socket-2": {"type": "agent", "materia": "B"},
    }}},
}
PI_RESULT = {"summary": "SUMMARY TEXT THE MODEL WROTE", "firstKeptEntryId": "pi-e9", "tokensBefore": 41_000,
             "tokensAfter": 6_000, "entriesRemoved": 9, "summaryTokens": 700, "details": {"readFiles": []}}
SUMMARY = {k: v for k, v in PI_RESULT.items() if k not in ("summary", "details")}
OVERFLOW = "400 This model's maximum context length is 32000 tokens (context_length_exceeded)"
HIGH_USAGE = {"tokens": 30_000, "contextWindow": 32_000, "percent": 93.75}

Handler = Callable[[dict[str, Any]], Any]


class CompactingHarness:
    """The harness side: records every call castor makes, in arrival order."""

    def __init__(self, client: Client, *, compact: Handler | None, usage: Handler | None) -> None:
        self.client = client
        self.calls: list[tuple[str, dict[str, Any]]] = []
        self.turns: queue.Queue[dict[str, Any]] = queue.Queue()
        self.notes: list[dict[str, Any]] = []
        self._lock = threading.Lock()
        client.on_notification("agent.run_turn", self._run_turn)
        client.on_request("session.append_entry", lambda _p: {"ok": True, "entry_id": "entry"})
        client.on_notification("ui.notify", self.notes.append)
        client.on_notification("ui.status", lambda _p: None)
        client.on_notification("message.send", lambda _p: None)
        if compact is not None:
            client.on_request("session.compact", self._recorded("session.compact", compact))
        if usage is not None:
            client.on_request("session.context_usage", self._recorded("session.context_usage", usage))

    def _record(self, method: str, params: dict[str, Any]) -> None:
        with self._lock:
            self.calls.append((method, params))

    def _recorded(self, method: str, handler: Handler) -> Handler:
        def run(params: dict[str, Any]) -> Any:
            self._record(method, params)
            return handler(params)
        return run

    def _run_turn(self, params: dict[str, Any]) -> None:
        self._record("agent.run_turn", params)
        self.turns.put(params)

    def methods(self) -> list[str]:
        with self._lock:
            return [m for m, _ in self.calls]

    def params_of(self, method: str) -> list[dict[str, Any]]:
        with self._lock:
            return [p for m, p in self.calls if m == method]

    def next_turn(self) -> dict[str, Any]:
        return self.turns.get(timeout=10)

    def answer(self, turn: dict[str, Any], text: str = "", *, error: str | None = None) -> None:
        self.client.call("agent.turn_ended", {
            "session_id": SID, "turn_id": turn["turn_id"], "text": text,
            "stop_reason": "error" if error else "stop", "error": error, "aborted": False,
            "entry_id": f"pi-{turn['turn_id'][-3:]}"})

    def start(self, project: Path) -> str:
        return self.client.call("cast.start", {"session_id": SID, "request": "do the thing"})["cast_id"]

    def status(self, cast_id: str) -> dict[str, Any]:
        return self.client.call("cast.status", {"session_id": SID, "cast_id": cast_id})

    def wait_status(self, cast_id: str, *statuses: str) -> dict[str, Any]:
        return wait_for(lambda: (v := self.status(cast_id))["status"] in statuses and v,
                        what=f"cast in {statuses}")


@pytest.fixture
def harness_factory(tmp_path: Path, project: Path) -> Iterator[Callable[..., CompactingHarness]]:
    made: list[tuple[Any, Server, Client]] = []

    def make(*, compact: Handler | None = None, usage: Handler | None = None, **settings: Any) -> CompactingHarness:
        write_project_config(project, CONFIG)
        runtime = make_runtime(**settings)
        sock = str(tmp_path / f"castor-{len(made)}.sock")
        server = Server(build_dispatcher(runtime), unix_path=sock).start()
        client = Client.connect_unix(sock, default_timeout=15)
        made.append((runtime, server, client))
        harness = CompactingHarness(client, compact=compact, usage=usage)
        client.call("runtime.hello", {"client": "compacting-test"})
        client.call("session.open", {"session_id": SID, "cwd": str(project), "trusted": True,
                                     "flags": {"harness": "pi", "has_agent_settled": True}})
        return harness

    yield make
    for runtime, server, client in made:
        client.close()
        server.stop()
        runtime.shutdown(10)


def _events(view: dict[str, Any], type_: str) -> list[dict[str, Any]]:
    return [e["data"] for e in events(view["run_dir"]) if e["type"] == type_]


def _types(view: dict[str, Any]) -> list[str]:
    return [e["type"] for e in events(view["run_dir"])]


# ----------------------------------------------------------------------------- recovery (§6.2 step 3)


def test_recovery_compacts_the_harness_session_then_retries_the_same_socket(harness_factory, project):
    """Conformance 54 over the wire: one real compaction (``session.compact``), then the same prompt."""
    pi = harness_factory(compact=lambda _p: PI_RESULT, usage=lambda _p: None)
    cast_id = pi.start(project)
    first = pi.next_turn()
    pi.answer(first, error=OVERFLOW)
    retry = pi.next_turn()
    assert retry["prompt"] == first["prompt"] and retry["turn_id"] != first["turn_id"]
    [compact] = pi.params_of("session.compact")
    assert compact["session_id"] == SID and compact["cast_id"] == cast_id
    assert "same-socket retry" in compact["instructions"]
    methods = pi.methods()
    assert methods.index("session.compact") < len(methods) - 1 and methods[-1] == "agent.run_turn"
    pi.answer(retry, "one done")
    pi.answer(pi.next_turn(), "two done")
    view = pi.wait_status(cast_id, "complete")
    [complete] = _events(view, "same_socket_recovery_action_complete")
    assert complete["result"] == SUMMARY and "skipped" not in complete  # the summary text never lands here
    types = _types(view)
    assert types.index("same_socket_recovery_action_start") < types.index("same_socket_recovery_action_complete") \
        < types.index("same_socket_recovery_retry")
    assert types.count("socket_start") == 2 and view["visits"] == {"Socket-1": 1, "Socket-2": 1}


def test_recovery_compaction_error_fails_the_cast_not_revivable(harness_factory, project):
    """Conformance 60: the harness's compaction error fails the cast with the spec's message."""
    def refuse(_p: dict[str, Any]) -> Any:
        raise Conflict("Nothing to compact (session too small)")

    pi = harness_factory(compact=refuse, usage=lambda _p: None)
    cast_id = pi.start(project)
    pi.answer(pi.next_turn(), error=OVERFLOW)
    view = pi.wait_status(cast_id, "failed")
    assert "Same-socket recovery action compact failed" in view["failed_reason"]
    assert "Nothing to compact (session too small)" in view["failed_reason"] and view["revivable"] is False
    [failed] = _events(view, "same_socket_recovery_action_failed")
    assert "Nothing to compact" in failed["error"]
    assert "same_socket_recovery_retry_failed" in _types(view) and pi.turns.empty()


def test_a_harness_without_session_compact_fails_the_recovery(harness_factory, project):
    """Decision: ``unknown_method`` for ``session.compact`` is a failed compaction, never a silent ok."""
    pi = harness_factory(compact=None, usage=None)
    cast_id = pi.start(project)
    pi.answer(pi.next_turn(), error=OVERFLOW)
    view = pi.wait_status(cast_id, "failed")
    assert "Same-socket recovery action compact failed" in view["failed_reason"]
    assert "does not implement session.compact (unknown_method)" in view["failed_reason"]
    assert _events(view, "same_socket_recovery_action_failed")
    assert not _events(view, "proactive_compaction_start")  # no usage method: no proactive check either


def test_a_compaction_that_never_answers_fails_at_its_deadline(harness_factory, project):
    release = threading.Event()

    def hang(_p: dict[str, Any]) -> Any:
        release.wait(20)
        return PI_RESULT

    pi = harness_factory(compact=hang, usage=lambda _p: None, compaction_timeout_s=0.5)
    try:
        cast_id = pi.start(project)
        pi.answer(pi.next_turn(), error=OVERFLOW)
        view = pi.wait_status(cast_id, "failed")
        assert "Same-socket recovery action compact failed" in view["failed_reason"]
        assert "0.5s" in view["failed_reason"] and pi.turns.empty()
    finally:
        release.set()


def _hanging_compaction() -> tuple[Any, threading.Event, threading.Event]:
    """A harness ``session.compact`` that blocks until ``release`` (``entered`` once it is called)."""
    release = threading.Event()
    entered = threading.Event()

    def hang(_p: dict[str, Any]) -> Any:
        entered.set()
        release.wait(20)
        return PI_RESULT

    return hang, entered, release


def test_abort_during_a_compaction_returns_at_once_and_the_late_answer_changes_nothing(harness_factory, project):
    hang, entered, release = _hanging_compaction()
    pi = harness_factory(compact=hang, usage=lambda _p: None)
    try:
        cast_id = pi.start(project)
        pi.answer(pi.next_turn(), error=OVERFLOW)
        assert entered.wait(10)
        # The compaction hangs until ``release`` (20 s): an abort that waited for it would miss
        # its own 10 s deadline.
        aborted = pi.client.call("cast.abort", {"session_id": SID, "cast_id": cast_id}, timeout=10)
        assert aborted["status"] == "aborted" and not release.is_set()
    finally:
        release.set()
    view = pi.wait_status(cast_id, "aborted")
    assert not _events(view, "same_socket_recovery_action_complete") and pi.turns.empty()


# ----------------------------------------------------------------------------- proactive (§6.5)


def test_proactive_compaction_fires_over_the_threshold_before_the_turn_is_sent(harness_factory, project):
    pi = harness_factory(compact=lambda _p: PI_RESULT, usage=lambda _p: HIGH_USAGE)
    cast_id = pi.start(project)
    first = pi.next_turn()
    assert pi.methods()[:3] == ["session.context_usage", "session.compact", "agent.run_turn"]
    compact = pi.params_of("session.compact")[0]
    assert compact["cast_id"] == cast_id and "before the next turn" in compact["instructions"]
    pi.answer(first, "one done")
    pi.answer(pi.next_turn(), "two done")
    view = pi.wait_status(cast_id, "complete")
    starts = _events(view, "proactive_compaction_start")
    assert [s["socket"] for s in starts] == ["Socket-1", "Socket-2"]
    assert starts[0] == {"action": "compact", "reason": "context_pressure", "thresholdPercent": 75.0,
                         "thresholdMode": "default_tiered",
                         "thresholdTier": {"id": "lt-128k", "minContextWindow": 0, "maxContextWindow": 128_000},
                         "tokens": 30_000.0,
                         "contextWindow": 32_000.0, "percent": 93.75, "socket": "Socket-1",
                         "visit": 1, "mode": "normal"}  # no item: its fields left out
    completes = _events(view, "proactive_compaction_complete")
    assert completes[0] == {**starts[0], "result": SUMMARY}
    types = _types(view)
    assert types.index("proactive_compaction_start") < types.index("proactive_compaction_complete") \
        < types.index("socket_complete")


def test_an_operator_sees_a_hanging_proactive_compaction_as_one(harness_factory, project):
    """``castor inspect`` (``ops.actors``) while the harness compacts before castor's turn: the
    visit's actor says it waits for the host's compaction, not "reading the host's context usage"
    (what it said until the turn was sent, however long the compaction took)."""
    hang, entered, release = _hanging_compaction()
    pi = harness_factory(compact=hang, usage=lambda _p: HIGH_USAGE)
    try:
        cast_id = pi.start(project)
        assert entered.wait(10)

        def both_compacting() -> tuple[dict[str, Any], dict[str, Any]] | None:
            """The visit's and the cast's activity once both show the compaction (each follows a
            message its actor handles after the host was asked: read before, they were stale)."""
            actors = pi.client.call("ops.actors", {})["actors"]
            [visit] = [a for a in actors if a["path"].startswith(f"/root/session/{SID}/socket/{cast_id}.")]
            cast = next(a for a in actors if a["path"] == f"/root/session/{SID}/cast/{cast_id}")["activity"]
            shown = visit["activity"]["kind"] == "compacting" and cast["data"].get("compacting") is True
            return (visit["activity"], cast) if shown else None

        activity, cast = wait_for(both_compacting, what="the visit and the cast seen compacting")
        assert activity["kind"] == "compacting", activity
        assert activity["text"].startswith(f"waiting for the host's compaction before Socket-1 (A) of cast {cast_id}")
        assert activity["data"]["percent"] == 93.75 and activity["data"]["socket"] == "Socket-1"
        assert cast["text"].startswith("awaiting the host's compaction before the agent's turn for Socket-1 (A)")
        assert cast["data"]["pending"] == "agent_turn" and cast["data"]["compacting"] is True
    finally:
        release.set()
    turn = pi.next_turn()
    actors = pi.client.call("ops.actors", {})["actors"]
    [visit] = [a for a in actors if a["path"].startswith(f"/root/session/{SID}/socket/{cast_id}.")]
    assert visit["activity"]["kind"] == "awaiting_turn" and turn["turn_id"] == visit["activity"]["data"]["visit_id"]

    def cast_activity() -> dict[str, Any]:
        return next(a for a in pi.client.call("ops.actors", {})["actors"]
                    if a["path"] == f"/root/session/{SID}/cast/{cast_id}")["activity"]

    # the compaction's end reaches the cast as the turn goes out: its view follows at once
    cast = wait_for(lambda: (c := cast_activity())["text"].startswith("awaiting the agent's turn") and c,
                    what="the cast awaiting the turn")
    assert cast["text"].startswith("awaiting the agent's turn for Socket-1 (A)") and "compacting" not in cast["data"]


def test_proactive_compaction_does_not_fire_below_the_threshold(harness_factory, project):
    pi = harness_factory(compact=lambda _p: PI_RESULT, usage=lambda _p: {"tokens": 1_000, "contextWindow": 32_000})
    cast_id = pi.start(project)
    pi.answer(pi.next_turn(), "one done")
    pi.answer(pi.next_turn(), "two done")
    view = pi.wait_status(cast_id, "complete")
    assert pi.methods().count("session.context_usage") == 2 and "session.compact" not in pi.methods()
    assert not [t for t in _types(view) if t.startswith("proactive_compaction")]


def test_a_failed_proactive_compaction_warns_and_the_turn_is_still_sent(harness_factory, project):
    """Conformance 61: ``proactive_compaction_failed{warning:true}``, a warning toast, the turn goes out."""
    def refuse(_p: dict[str, Any]) -> Any:
        raise Conflict("Already compacted")

    pi = harness_factory(compact=refuse, usage=lambda _p: HIGH_USAGE)
    cast_id = pi.start(project)
    first = pi.next_turn()
    assert pi.status(cast_id)["status"] == "active"
    pi.answer(first, "one done")
    pi.answer(pi.next_turn(), "two done")
    view = pi.wait_status(cast_id, "complete")
    failed = _events(view, "proactive_compaction_failed")
    assert len(failed) == 2 and failed[0]["warning"] is True and "Already compacted" in failed[0]["error"]
    assert failed[0]["thresholdTier"]["id"] == "lt-128k" and failed[0]["socket"] == "Socket-1"
    warnings = [n for n in pi.notes if n.get("level") == "warning" and "Proactive compaction" in n["message"]]
    assert warnings and "Already compacted" in warnings[0]["message"]


def test_esc_during_a_proactive_compaction_interrupts_the_cast_and_continue_sends_the_turn(harness_factory,
                                                                                           project):
    """The user's Esc while the harness compacts before castor's turn (Pi answers ``session.compact``
    with ``cancelled``, "Compaction cancelled") stops the cast, as an Esc during the turn does: the
    turn is not sent, the cast is interrupted at its socket, and ``cast.continue`` sends it. It used to
    be taken as a failed compaction: a warning "Sending the turn anyway", and the model ran the turn
    the user had just stopped."""
    cancel = {"on": True}

    def compact(_p: dict[str, Any]) -> Any:
        if cancel["on"]:
            raise Cancelled("Compaction cancelled")
        return PI_RESULT

    pi = harness_factory(compact=compact, usage=lambda _p: HIGH_USAGE)
    cast_id = pi.start(project)
    view = pi.wait_status(cast_id, "interrupted")
    assert pi.turns.empty() and "agent.run_turn" not in pi.methods()
    assert view["active"] and view["current_socket"] == "Socket-1" and view["pending"] is None
    [cancelled] = _events(view, "proactive_compaction_cancelled")
    assert cancelled["socket"] == "Socket-1" and "Compaction cancelled" in cancelled["error"]
    [interrupted] = _events(view, "turn_interrupted")
    assert interrupted["reason"] == "compaction_cancelled" and interrupted["textDiscarded"] is False
    assert not _events(view, "proactive_compaction_failed")
    # the notice is a notification of its own: it may arrive just after the status says interrupted
    wait_for(lambda: any("interrupted" in n["message"] and "/materia continue" in n["message"]
                         for n in pi.notes if n.get("level") == "warning"), what="the interrupted notice")
    warnings = [n["message"] for n in pi.notes if n.get("level") == "warning"]
    assert not any("Proactive compaction failed" in w for w in warnings)
    cancel["on"] = False
    assert pi.client.call("cast.continue", {"session_id": SID})["status"] == "active"
    first = pi.next_turn()
    assert "A-INSTRUCTIONS" in first["prompt"]
    pi.answer(first, "one done")
    pi.answer(pi.next_turn(), "two done")
    view = pi.wait_status(cast_id, "complete")
    assert view["visits"] == {"Socket-1": 1, "Socket-2": 1}


def test_a_harness_without_context_usage_gets_no_proactive_compaction_and_is_asked_once(harness_factory, project):
    """Decision: ``unknown_method`` for ``session.context_usage`` means "no host context" for proactive
    compaction: skipped with no events, and not asked again in that session."""
    def unknown(_p: dict[str, Any]) -> Any:
        raise UnknownMethod("harness has no method session.context_usage")

    pi = harness_factory(compact=lambda _p: PI_RESULT, usage=unknown)
    cast_id = pi.start(project)
    pi.answer(pi.next_turn(), "one done")
    pi.answer(pi.next_turn(), "two done")
    view = pi.wait_status(cast_id, "complete")
    assert pi.methods().count("session.context_usage") == 1 and "session.compact" not in pi.methods()
    assert not [t for t in _types(view) if t.startswith("proactive_compaction")]


def test_a_connection_that_closes_during_a_compaction_leaves_the_cast_resumable(harness_factory, project, tmp_path):
    """As for a turn: a compaction whose harness went away is not failed by that transport; the
    session closes with its connection and the cast stays resumable (``cast.recast``)."""
    hang, entered, release = _hanging_compaction()
    pi = harness_factory(compact=hang, usage=lambda _p: None)
    try:
        cast_id = pi.start(project)
        pi.answer(pi.next_turn(), error=OVERFLOW)
        assert entered.wait(10)
        pi.client.close()
    finally:
        release.set()
    again = Client.connect_unix(str(tmp_path / "castor-0.sock"), default_timeout=15)
    try:
        again.on_request("session.append_entry", lambda _p: {"ok": True, "entry_id": "e"})

        def reopened() -> bool:  # the old session closes with its connection, shortly after
            try:
                again.call("session.open", {"session_id": SID, "cwd": str(project), "trusted": True})
            except Conflict:
                return False
            return True

        wait_for(reopened, what="the old session to close")
        view = wait_for(lambda: (v := again.call("cast.status", {"session_id": SID, "cast_id": cast_id}))
                        ["status"] != "active" and v, what="the cast to stop with its session")
        assert view["status"] == "orphaned" and view["resumable"] is True, view
        assert not [e for e in events(view["run_dir"]) if e["type"] == "same_socket_recovery_action_failed"]
    finally:
        again.close()


def test_c27_a_configured_single_percent_beats_the_tiers_in_the_hosts_decision(harness_factory, project):
    """Conformance 27's "42 is used" through the running cast: with ``proactiveThresholdPercent: 42``
    beside tiers that would say 60 for this window, 43% of the host's context compacts before the
    first turn (``single_percent``, 42) and 41% before the second does not."""
    pi = harness_factory(compact=lambda _p: PI_RESULT,
                         usage=lambda _p: {"tokens": 43_000 if len(pi.params_of("session.context_usage")) <= 1
                                           else 41_000, "contextWindow": 100_000})
    tiers = [{"thresholdPercent": 70, "maxContextWindow": 100_000},
             {"thresholdPercent": 60, "minContextWindow": 100_000}]
    write_project_config(project, {**CONFIG, "compaction": {"proactiveThresholdPercent": 42,
                                                            "proactiveThresholdTiers": tiers}})
    cast_id = pi.start(project)
    pi.answer(pi.next_turn(), "one done")
    pi.answer(pi.next_turn(), "two done")
    view = pi.wait_status(cast_id, "complete")
    [start] = _events(view, "proactive_compaction_start")
    assert (start["socket"], start["thresholdPercent"], start["thresholdMode"]) == ("Socket-1", 42, "single_percent")
    assert start["percent"] == 43 and "thresholdTier" not in start
    assert len(pi.params_of("session.context_usage")) == 2 and len(pi.params_of("session.compact")) == 1

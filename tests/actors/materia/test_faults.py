"""Crashes and kills: casts recover from their persisted state; other casts are untouched."""

from __future__ import annotations

import json
import queue
import threading
import time
from pathlib import Path

import pytest

from castor.actors.materia.api import materia_call
from castor.actors.materia.messages import CastOutcome, WorkLost
from castor.adapters.stderr_ui import StderrUi
from castor.domain.materia.cast_messages import TurnEnded
from castor.ports.agent import TurnError, TurnOutcome
from castor.runtime import HarnessLink, SessionInfo
from castor.supervision import faults

from .helpers import event_types, events, open_session, wait_for, wait_status


def _cast_handle(rt, sid, cast_id):
    return rt.system.lookup(f"/root/session/{sid}/cast/{cast_id}")


def _run_a_cast_that_stops_once(rt, project, answer: str, lines: list[str]) -> dict:
    """Start a ``hello`` cast in session ``s1`` whose agent answers ``answer`` (the harness's notices
    into ``lines``); return its start once its actor stopped after one incarnation and one turn."""
    from castor.adapters.agents.scripted import ScriptedAgent, parse_script

    agent = ScriptedAgent(parse_script([answer] * 8))
    rt.open_session(SessionInfo(session_id="s1", cwd=str(project), trusted=True),
                    HarnessLink(agent=agent, session_log=None, ui=StderrUi(printer=lines.append)))
    started = materia_call(rt, "s1", "start", {"request": "x", "loadout": "hello"})
    handle = _cast_handle(rt, "s1", started["cast_id"])
    assert handle.closed.wait(20)
    assert handle.incarnation == 1 and len(agent.requests()) == 1  # stopped once; the turn was never re-sent
    return started


def _socket_handles(rt, sid):
    prefix = f"/root/session/{sid}/socket/"
    return [h for h in rt.system.registry.handles(f"/root/session/{sid}/socket") if h.path.startswith(prefix)]


@pytest.mark.timeout(60)
def test_fifty_concurrent_casts_one_crashed_all_complete_and_isolated(runtime_factory, project):
    rt = runtime_factory(max_casts_per_session=100)
    agent, _ui = open_session(rt, "s1", project, [{"text": "answer", "delay_ms": 1500}, "answer after restart"])
    ids = []
    for n in range(50):
        ids.append(materia_call(rt, "s1", "start", {"request": f"cast {n}", "loadout": "hello"})["cast_id"])
        if n == 17:  # the turn's answer (1.5 s later) crashes this cast's actor
            handle = _cast_handle(rt, "s1", ids[-1])
            faults.crash_next(handle, "materia.cast.outcome")
    assert len(set(ids)) == 50
    victim = ids[17]
    views = {cid: wait_status(rt, "s1", cid, timeout=30) for cid in ids}
    assert all(v["status"] == "complete" for v in views.values()), {k: v["status"] for k, v in views.items()}
    assert handle.restarts == 1 and handle.incarnation == 2
    victim_types = event_types(views[victim]["run_dir"])
    assert "cast_recast" in victim_types and victim_types[-1] == "cast_end"
    for cid in ids:
        if cid == victim:
            continue
        types = event_types(views[cid]["run_dir"])
        assert "cast_recast" not in types and types.count("socket_complete") == 1
        assert Path(views[cid]["run_dir"], "sockets", "Socket-1", "1.md").read_text() == "answer"
    # The re-sent turn (same visit, new visit id) answered; the lost first outcome was never applied.
    assert Path(views[victim]["run_dir"], "sockets", "Socket-1", "1.md").read_text() == "answer after restart"


def test_killed_socket_actor_is_redispatched_and_its_late_outcome_ignored(runtime_factory, project):
    rt = runtime_factory()
    agent, _ui = open_session(rt, "s1", project, [{"text": "lost", "delay_ms": 5000}, "second try"])
    started = materia_call(rt, "s1", "start", {"request": "x", "loadout": "hello"})
    sockets = wait_for(lambda: _socket_handles(rt, "s1"), what="the socket actor")
    first_visit = materia_call(rt, "s1", "status", {})["pending"]["visit_id"]
    faults.kill(sockets[0])
    view = wait_status(rt, "s1", started["cast_id"])
    assert view["status"] == "complete"
    run_dir = Path(view["run_dir"])
    assert (run_dir / "sockets" / "Socket-1" / "1.md").read_text() == "second try"
    recast = [e for e in events(run_dir) if e["type"] == "cast_recast"]
    assert recast and recast[0]["data"]["reusedActivePrompt"] is True
    assert [r.turn_id for r in agent.requests()][0] == first_visit and len(agent.requests()) == 2
    assert agent.requests()[1].turn_id != first_visit


class _HeldAgent:
    """An AgentPort whose turns wait, unanswered, until the test answers them (no timers)."""

    def __init__(self) -> None:
        self.turns: queue.Queue = queue.Queue()
        self._lock = threading.Lock()
        self._replies: dict = {}

    def run_turn(self, request, reply) -> None:
        with self._lock:
            self._replies[request.turn_id] = reply
        self.turns.put(request)

    def next_turn(self, timeout: float = 10.0):
        try:
            return self.turns.get(timeout=timeout)
        except queue.Empty:
            raise AssertionError(f"no agent turn within {timeout}s") from None

    def answer(self, turn_id: str, text: str) -> None:
        with self._lock:
            reply = self._replies.pop(turn_id)
        reply(TurnOutcome(turn_id=turn_id, text=text, stop_reason="stop"))

    def cancel(self, turn_id: str) -> None:
        with self._lock:
            reply = self._replies.pop(turn_id, None)
        if reply is not None:
            reply(TurnOutcome(turn_id=turn_id, stop_reason="aborted",
                              error=TurnError(message="cancelled", kind="cancelled")))


def test_late_duplicate_outcome_is_ignored_never_applied_twice(runtime_factory, project):
    """The old visit's answer reaches the cast while it waits (unanswered) for the re-dispatched
    visit: it is recorded ``outcome_ignored`` and never applied; the new visit's answer is."""
    rt = runtime_factory()
    agent = _HeldAgent()
    rt.open_session(SessionInfo(session_id="s1", cwd=str(project), trusted=True),
                    HarnessLink(agent=agent, session_log=None, ui=StderrUi(printer=lambda _line: None)))
    started = materia_call(rt, "s1", "start", {"request": "x", "loadout": "hello"})
    cast_id, run_dir = started["cast_id"], Path(started["run_dir"])
    old = agent.next_turn()
    handle = _cast_handle(rt, "s1", cast_id)
    faults.kill(wait_for(lambda: _socket_handles(rt, "s1"), what="the socket actor")[0])
    new = agent.next_turn()  # the re-dispatched turn: a new visit id, held unanswered
    assert new.turn_id != old.turn_id
    assert materia_call(rt, "s1", "status", {"cast_id": cast_id})["pending"]["visit_id"] == new.turn_id
    handle.tell(CastOutcome(event=TurnEnded(visit_id=old.turn_id, text="LATE", at=time.time())))

    def ignored():
        return [e["data"] for e in events(run_dir) if e["type"] == "outcome_ignored"]

    recorded = wait_for(ignored, what="the late outcome recorded as ignored")
    assert recorded == [{"outcome": "turn_ended", "visitId": old.turn_id, "expected": new.turn_id,
                         "reason": "not-current-visit"}]
    # A late loss report of the old visit is stale too: no third dispatch. (The status ask is
    # answered after the report: one mailbox, in order.)
    handle.tell(WorkLost(visit_id=old.turn_id, reason="a late loss report of the old visit"))
    view = materia_call(rt, "s1", "status", {"cast_id": cast_id})
    assert view["status"] == "active" and view["pending"]["visit_id"] == new.turn_id  # still waiting
    assert agent.turns.empty()
    assert "socket_complete" not in event_types(run_dir)
    agent.answer(new.turn_id, "fast")
    view = wait_status(rt, "s1", cast_id)
    assert view["status"] == "complete"
    assert (run_dir / "sockets" / "Socket-1" / "1.md").read_text() == "fast"
    assert event_types(run_dir).count("socket_complete") == 1
    assert ignored() == recorded  # applied never, recorded once


def test_cast_actor_crash_restart_resumes_from_persisted_state(runtime_factory, project):
    rt = runtime_factory()
    agent, _ui = open_session(rt, "s1", project, [{"text": "never", "delay_ms": 5000}, "resumed"])
    started = materia_call(rt, "s1", "start", {"request": "x", "loadout": "hello"})
    wait_for(lambda: agent.in_flight(), what="the first turn")
    handle = _cast_handle(rt, "s1", started["cast_id"])
    faults.kill(handle)
    view = wait_status(rt, "s1", started["cast_id"])
    assert view["status"] == "complete" and handle.incarnation == 2
    run_dir = Path(view["run_dir"])
    assert (run_dir / "sockets" / "Socket-1" / "1.md").read_text() == "resumed"
    types = event_types(run_dir)
    assert types.count("cast_start") == 1 and types.count("cast_recast") == 1
    import json

    assert json.loads((run_dir / "state.json").read_text())["incarnation"] == 2


def test_a_recast_after_a_crash_or_lost_work_says_what_happened_not_that_the_runtime_restarted(runtime_factory,
                                                                                                  project):
    """The ``cast_recast`` event (the console's feed, events.jsonl) of a cast whose actor was
    killed, or whose socket actor was, read ``previousFailure: "runtime restarted while the cast
    was active"`` -- in a runtime that had run all along. It says what was lost now."""
    rt = runtime_factory()
    agent, _ui = open_session(rt, "s1", project, [{"text": "never", "delay_ms": 5000},
                                                   {"text": "lost too", "delay_ms": 5000}, "resumed"])
    started = materia_call(rt, "s1", "start", {"request": "x", "loadout": "hello"})
    wait_for(lambda: agent.in_flight(), what="the first turn")
    run_dir = Path(started["run_dir"])

    def recasts() -> list[str]:
        return [e["data"]["previousFailure"] for e in events(run_dir) if e["type"] == "cast_recast"]

    faults.kill(_cast_handle(rt, "s1", started["cast_id"]))
    first = wait_for(lambda: recasts(), what="the recast after the cast actor's crash")
    assert first == ["the cast's actor crashed (ActorKilled) and was restarted while the cast was active"]
    sockets = wait_for(lambda: [h for h in _socket_handles(rt, "s1") if h.alive], what="the re-sent turn's actor")
    faults.kill(sockets[0])
    both = wait_for(lambda: r if len(r := recasts()) == 2 else None, what="the recast after the lost turn")
    assert both[1].startswith("its work was lost (socket actor ") and both[1].endswith(" while the cast was active")
    assert not any("runtime restarted" in r for r in both), both
    assert wait_status(rt, "s1", started["cast_id"])["status"] == "complete"


def test_restart_replays_the_last_transitions_file_effects_without_duplicates(runtime_factory, project):
    rt = runtime_factory()
    agent, _ui = open_session(rt, "s1", project, [{"text": "never", "delay_ms": 5000}, "resumed"])
    started = materia_call(rt, "s1", "start", {"request": "x", "loadout": "hello"})
    wait_for(lambda: agent.in_flight(), what="the first turn")
    run_dir = Path(started["run_dir"])
    written = (run_dir / "config.resolved.json").read_bytes()
    # As if kill -9 had landed between saving state.json and performing the transition's effects:
    (run_dir / "manifest.json").unlink()
    (run_dir / "config.resolved.json").unlink()
    lines = (run_dir / "events.jsonl").read_text().splitlines(keepends=True)
    (run_dir / "events.jsonl").write_text(lines[0])  # keep cast_start only: replay must not duplicate it
    faults.kill(_cast_handle(rt, "s1", started["cast_id"]))
    view = wait_status(rt, "s1", started["cast_id"])
    assert view["status"] == "complete"
    types = event_types(run_dir)
    assert types.count("cast_start") == 1 and types.count("socket_start") == 1 and "cast_recast" in types
    # The outbox saved it without its text (derived from the saved config): the same bytes again.
    assert (run_dir / "config.resolved.json").read_bytes() == written
    import json

    assert json.loads((run_dir / "manifest.json").read_text())["entries"][-1]["phase"] == "complete"


@pytest.mark.timeout(60)
def test_a_crash_looping_cast_is_given_up_alone_shows_orphaned_and_recast_completes_it(runtime_factory, project):
    from castor.actors.materia.cast_actor import CAST_MAX_RESTARTS

    rt = runtime_factory()
    agent, _ui = open_session(rt, "s1", project, [{"text": "never", "delay_ms": 30000}] * (CAST_MAX_RESTARTS + 1)
                              + ["resumed"])
    started = materia_call(rt, "s1", "start", {"request": "x", "loadout": "hello"})
    cast_id = started["cast_id"]
    handle = _cast_handle(rt, "s1", cast_id)
    for n in range(CAST_MAX_RESTARTS + 1):  # the last kill is one restart too many
        wait_for(lambda: handle.alive or handle.closed.is_set(), what="a live incarnation")
        if handle.closed.is_set():
            break
        faults.kill(handle, f"crash loop {n}")
        wait_for(lambda n=n: handle.incarnation > n + 1 or handle.closed.is_set(), what="the restart")
    assert handle.closed.wait(10)  # given up: removed, not restarted again
    assert rt.system.find("/root/session/s1/cast") is not None  # the cast supervisor did not fail
    view = wait_status(rt, "s1", cast_id, statuses=("orphaned",))
    assert view["resumable"] is True
    # Its log says why it stopped running (castor status can only call it orphaned).
    given_up = [e["data"] for e in events(Path(started["run_dir"])) if e["type"] == "cast_given_up"]
    assert given_up == [{"castId": cast_id, "reason": "gave up: the child's own restart intensity was exceeded",
                         "maxRestarts": CAST_MAX_RESTARTS, "withinSeconds": 30.0, "resumable": True}], given_up
    # castor status says so too: given up, by whom and after what, and how it resumes.
    assert view["given_up"]["reason"] == "gave up: the child's own restart intensity was exceeded"
    assert view["given_up"]["max_restarts"] == CAST_MAX_RESTARTS
    text = materia_call(rt, "s1", "status", {"cast_id": cast_id})["text"]
    assert f"given up: its actor crashed more than {CAST_MAX_RESTARTS} times" in text, text
    assert "RECAST TARGET" in text
    materia_call(rt, "s1", "recast", {"cast_id": cast_id})
    agent_done = wait_status(rt, "s1", cast_id, timeout=40)
    assert agent_done["status"] == "complete" and "given_up" not in agent_done


@pytest.mark.timeout(60)
def test_an_ended_cast_whose_last_artifacts_were_cut_short_says_so_and_recast_writes_them(
        runtime_factory, project, monkeypatch):
    """The final state is saved before its files (write-ahead); if they then fail for good (a full
    disk here, a kill -9 in the field), status must not pass the cast off as finished, and recast
    writes them from the saved outbox instead of refusing an ended cast."""
    import errno

    from castor.actors.materia.cast_actor import CAST_MAX_RESTARTS
    from castor.adapters.materia import artifacts

    real_append = artifacts.append_json_texts
    disk_full = {"on": True}

    def append_json_texts(path, lines):  # the cast_end line never fits, nor does a replay of it
        if disk_full["on"] and any(json.loads(line).get("type") == "cast_end" for line in lines):
            raise OSError(errno.ENOSPC, "No space left on device")
        return real_append(path, lines)

    monkeypatch.setattr(artifacts, "append_json_texts", append_json_texts)
    monkeypatch.setattr(artifacts, "append_json_line",
                        lambda path, record: append_json_texts(path, [json.dumps(record, separators=(",", ":"))]))
    rt = runtime_factory()
    open_session(rt, "s1", project, ["the only answer"] * (CAST_MAX_RESTARTS + 3))
    started = materia_call(rt, "s1", "start", {"request": "x", "loadout": "hello"})
    cast_id, run_dir = started["cast_id"], Path(started["run_dir"])
    wait_for(lambda: rt.system.find(f"/root/session/s1/cast/{cast_id}") is None, timeout=20,
             what="the cast given up (every restart failed the same writes)")
    view = materia_call(rt, "s1", "status", {"cast_id": cast_id})
    assert view["status"] == "complete" and view["artifacts_pending"] is True
    assert "cast_end" not in event_types(run_dir)

    disk_full["on"] = False  # space freed
    answer = materia_call(rt, "s1", "recast", {"cast_id": cast_id})
    assert answer["status"] == "complete" and "written again" in answer["text"]
    assert event_types(run_dir).count("cast_end") == 1
    assert (run_dir / "sockets" / "Socket-1" / "1.md").read_text().strip() == "the only answer"
    assert materia_call(rt, "s1", "status", {"cast_id": cast_id})["artifacts_pending"] is False
    with pytest.raises(Exception) as refused:  # settled now: an ended cast is refused as before
        materia_call(rt, "s1", "recast", {"cast_id": cast_id})
    assert getattr(refused.value, "code", None) == "conflict"


@pytest.mark.timeout(60)
def test_a_state_that_cannot_be_serialised_stops_the_cast_once_never_a_crash_loop(runtime_factory, project,
                                                                                   monkeypatch):
    """A state castor cannot serialise (its own bug: one such was data nested past the serialiser's
    depth) crashed the cast's actor at every save: each restart re-sent the turn, burning an
    answer, until the supervisor gave up. Now the cast stops on the first, typed ``internal``."""
    from castor.actors.materia.cast_actor import CastActor

    real_encode = CastActor._encode

    def encode(self, state, files):
        if state.last_output == "poison":
            raise ValueError("Error serializing to JSON: ValueError: Maximum serialization depth exceeded")
        return real_encode(self, state, files)

    monkeypatch.setattr(CastActor, "_encode", encode)
    rt = runtime_factory()
    lines: list[str] = []
    _run_a_cast_that_stops_once(rt, project, "poison", lines)
    assert any("cannot be saved" in line and "castor bug" in line for line in lines), lines


@pytest.mark.timeout(60)
def test_a_first_state_that_cannot_be_serialised_fails_the_start_once_and_leaves_nothing(runtime_factory, project,
                                                                                          monkeypatch):
    """The same at a new cast's first save (a config nested past the serialiser's depth did it):
    ``_stopped_on`` stopped the incarnation but its ``internal`` escaped ``on_start``, so the actor
    crashed and restarted five times (tracebacks on the CLI's stderr), the start answered
    ``not_found: no saved state yet`` and left a run directory listed as unreadable. Now the start
    answers ``internal`` once and no run directory is left."""
    from castor.actors.materia.cast_actor import CastActor
    from castor.messages.errors import CastorError

    real_encode = CastActor._encode
    encodes: list[int] = []

    def encode(self, state, files):
        encodes.append(self.incarnation)
        raise ValueError("Error serializing to JSON: ValueError: Maximum serialization depth exceeded")

    monkeypatch.setattr(CastActor, "_encode", encode)
    rt = runtime_factory()
    open_session(rt, "s1", project, ["hi"] * 4)
    with pytest.raises(CastorError) as failed:
        materia_call(rt, "s1", "start", {"request": "x", "loadout": "hello"})
    assert failed.value.code == "internal" and "cannot be saved" in failed.value.message
    assert encodes == [1]  # one incarnation, one try: no crash loop
    root = project / ".pi" / "pi-materia"
    assert not [p for p in root.iterdir() if p.is_dir()] if root.exists() else True
    monkeypatch.setattr(CastActor, "_encode", real_encode)
    assert materia_call(rt, "s1", "start", {"request": "y", "loadout": "hello"})["cast_id"]


@pytest.mark.timeout(60)
def test_an_engine_failure_stops_the_cast_once_never_a_crash_loop_that_re_sends_the_turn(runtime_factory, project,
                                                                                         monkeypatch):
    """The engine's step is pure: an exception it raises on an event (castor's own bug -- one such
    was ``int()`` of a config's thousands of digits) is raised again by every restart's replay of
    the same work. The cast's actor crashed at the turn's answer, and each restart re-sent the turn,
    burning an answer, until the supervisor gave up. Now the cast stops on the first, typed
    ``internal``, failed for the record and recastable once the bug is gone."""
    import castor.actors.materia.cast_actor as cast_actor_module

    real_step = cast_actor_module.step

    def step(state, event):
        if type(event).__name__ == "TurnEnded" and state is not None and state.pending is not None:
            raise OverflowError("int too large to convert to float")
        return real_step(state, event)

    monkeypatch.setattr(cast_actor_module, "step", step)
    rt = runtime_factory()
    lines: list[str] = []
    started = _run_a_cast_that_stops_once(rt, project, "answer", lines)
    assert any("castor bug" in line and "OverflowError" in line for line in lines), lines
    status = materia_call(rt, "s1", "status", {"cast_id": started["cast_id"]})
    assert status["phase"] == "failed", status
    monkeypatch.setattr(cast_actor_module, "step", real_step)
    materia_call(rt, "s1", "recast", {"cast_id": started["cast_id"]})
    wait_status(rt, "s1", started["cast_id"], "complete")


@pytest.mark.timeout(60)
def test_the_runtime_log_says_when_a_cast_starts_and_how_it_ends(runtime_factory, project):
    """A cast that failed ("edge traversal limit exceeded"), was aborted or completed left no line at
    all in the runtime's log: an operator reading the JSON log after the fact could not tell which
    casts ran, nor which failed and why. Each start and end is an INFO line of the cast's actor now
    (a failure and an abort alike: the same effect, with its reason)."""
    from loguru import logger

    lines: list[dict] = []
    sink = logger.add(lambda m: lines.append(dict(m.record["extra"], message=m.record["message"],
                                                  level=m.record["level"].name)), level="INFO")
    try:
        rt = runtime_factory()
        open_session(rt, "s1", project, ["the answer"])
        open_session(rt, "s2", project, [{"text": "never", "delay_ms": 30000}])
        done = materia_call(rt, "s1", "start", {"request": "x", "loadout": "hello"})
        assert wait_status(rt, "s1", done["cast_id"])["status"] == "complete"
        aborted = materia_call(rt, "s2", "start", {"request": "y", "loadout": "hello"})
        wait_for(lambda: materia_call(rt, "s2", "status", {"cast_id": aborted["cast_id"]}).get("pending"),
                 what="the second cast's turn")
        materia_call(rt, "s2", "abort", {"cast_id": aborted["cast_id"]})
        wait_for(lambda: any(f"cast {aborted['cast_id']} aborted" in ln["message"] for ln in lines),
                 what="the abort's line")
    finally:
        logger.remove(sink)
    mine = [ln for ln in lines if ln.get("actor") == f"/root/session/s1/cast/{done['cast_id']}"]
    said = [ln["message"] for ln in mine]
    assert any(m.startswith(f"cast {done['cast_id']} started in ") and "(loadout hello)" in m for m in said), said
    assert f"cast {done['cast_id']} complete" in said, said
    ended = next(ln for ln in lines if f"cast {aborted['cast_id']} aborted at Socket-1: " in ln["message"])
    assert ended["actor"] == f"/root/session/s2/cast/{aborted['cast_id']}" and ended["level"] == "INFO"


class _RefusingAgent:
    """An AgentPort whose every ``run_turn`` raises (a transport that is down): each turn is lost."""

    def __init__(self) -> None:
        self.sent: list[str] = []
        self._lock = threading.Lock()

    def run_turn(self, request, reply) -> None:
        with self._lock:
            self.sent.append(request.turn_id)
        raise ConnectionError("the agent's transport is down")

    def cancel(self, turn_id: str) -> None:
        pass


@pytest.mark.timeout(60)
def test_more_than_three_losses_in_a_row_fail_the_cast_recastable_instead_of_looping(runtime_factory, project):
    """docs/materia.md's failure table: "more than 3 losses in a row -> DispatchFailed: the cast fails
    (recastable) instead of looping". An agent port that raises on every turn: the turn is sent 4
    times (the first and 3 re-dispatches, each under a new visit id), then the cast is failed,
    saying how often its work was lost, resumable; it never crashes and never sends a fifth."""
    rt = runtime_factory()
    agent = _RefusingAgent()
    rt.open_session(SessionInfo(session_id="s1", cwd=str(project), trusted=True),
                    HarnessLink(agent=agent, session_log=None, ui=StderrUi(printer=lambda _line: None)))
    started = materia_call(rt, "s1", "start", {"request": "x", "loadout": "hello"})
    handle = _cast_handle(rt, "s1", started["cast_id"])
    assert handle.closed.wait(30)
    view = materia_call(rt, "s1", "status", {"cast_id": started["cast_id"]})
    assert view["status"] == "failed" and view["resumable"] is True, view
    assert "work lost 4 times in a row" in view["failed_reason"], view["failed_reason"]
    assert len(agent.sent) == 4 and len(set(agent.sent)) == 4, agent.sent
    assert handle.incarnation == 1  # the cast itself never crashed on it


@pytest.mark.timeout(60)
def test_a_materia_verbs_own_file_error_is_storage_unavailable_naming_the_verb_and_the_session_lives_on(
        runtime_factory, project, monkeypatch):
    """docs/materia.md's storage-fault table: "any other materia verb's file error ->
    ``storage_unavailable`` with ``data.verb``". ``set_loadout`` meets a full disk as it saves the
    project's config: the caller gets ``storage_unavailable`` (``errno: ENOSPC``, ``verb``), never
    ``internal`` nor a crashed session; the session's next verb answers."""
    import errno

    from castor.adapters.materia.storage import FileCastStorage
    from castor.messages.errors import CastorError, ErrorCode

    def full(self, cwd, name, **_kwargs):
        raise OSError(errno.ENOSPC, "No space left on device", str(Path(cwd) / ".pi" / "pi-materia.json"))

    rt = runtime_factory()
    open_session(rt, "s1", project, ["hi"])
    monkeypatch.setattr(FileCastStorage, "save_active_loadout", full)
    with pytest.raises(CastorError) as refused:
        materia_call(rt, "s1", "set_loadout", {"name": "hello"})
    error = refused.value
    assert error.code == ErrorCode.STORAGE_UNAVAILABLE, error.to_wire()
    assert error.data["verb"] == "set_loadout" and error.data["errno"] == "ENOSPC", error.data
    assert ".pi/pi-materia.json" in error.data["path"] and not error.data["path"].startswith("/"), error.data
    assert materia_call(rt, "s1", "loadouts", {})["text"], "the session answers on"


@pytest.mark.timeout(60)
def test_a_killed_socket_actors_turn_is_sent_again_with_the_same_prompt_and_visit_number_under_a_new_id(
        runtime_factory, project):
    """docs/materia.md's failure table: "SocketActor killed / crashed before answering -> the cast
    re-dispatches (the same prompt, same visit number, new visit id)" -- and the visit is counted
    once, not once per dispatch."""
    rt = runtime_factory()
    agent, _ui = open_session(rt, "s1", project, [{"text": "lost", "delay_ms": 5000}, "second try"])
    started = materia_call(rt, "s1", "start", {"request": "x", "loadout": "hello"})
    sockets = wait_for(lambda: _socket_handles(rt, "s1"), what="the socket actor")
    faults.kill(sockets[0])
    view = wait_status(rt, "s1", started["cast_id"])
    assert view["status"] == "complete", view
    first, again = agent.requests()[:2]
    assert again.turn_id != first.turn_id
    assert (again.socket_id, again.visit, again.prompt, again.mode) == (first.socket_id, first.visit, first.prompt,
                                                                        first.mode)
    assert view["visits"] == {"Socket-1": 1}, view["visits"]

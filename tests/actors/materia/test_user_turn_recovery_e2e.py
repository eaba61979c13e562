"""A user-driven refinement turn whose end the harness never reports, end to end.

Same rig as test_refinement_e2e.py: a real :class:`Server`, a real :class:`Client` playing the Pi
extension (:class:`PiLikeHarness`), the scripted LLM replies the only fake. Each test puts a cast in
a pending *user-driven* turn (Pi sent ``before_agent_start {message_type:"user"}``) and then loses
that turn's ``agent_end`` in one of the ways a harness can: mistyped (``invalid_params``), an
aborted run, a session shutdown, a dropped connection, a crash of the cast's actor, no report at
all. The cast must go back to paused with its drafts, never apply a late end, and make progress.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from castor.messages.errors import Conflict, InvalidParams
from castor.supervision import faults

from .helpers import ServedRuntime, events, plan_json, wait_for, write_project_config
from .test_refinement_e2e import CONFIG, SID, PiLikeHarness

DRAFT_1 = "Draft 1: which database?"


class World(ServedRuntime):
    """One runtime behind a real server; :meth:`connect` is one Pi process attaching to it."""

    def __init__(self, tmp_path: Path, project: Path, **settings: Any) -> None:
        super().__init__(tmp_path, project, PiLikeHarness, SID, **settings)


@pytest.fixture
def world_factory(tmp_path, project):
    made: list[World] = []

    def make(**settings: Any) -> World:
        made.append(World(tmp_path, project, **settings))
        return made[-1]

    yield make
    for world in made:
        world.close()


def _status(pi: PiLikeHarness, cast_id: str) -> dict[str, Any]:
    return pi.client.call("cast.status", {"session_id": SID, "cast_id": cast_id})


def _of(run_dir: Path, type_: str) -> list[dict[str, Any]]:
    return [e["data"] for e in events(run_dir) if e["type"] == type_]


def _drafts(run_dir: Path) -> list[int]:
    return [d["refinementTurn"] for d in _of(run_dir, "socket_refinement")]


def _paused_cast(pi: PiLikeHarness, project: Path) -> tuple[str, Path]:
    """A cast paused after castor's own first turn (draft 1)."""
    write_project_config(project, CONFIG)
    cast_id = pi.client.call("cast.start", {"session_id": SID, "request": "plan the db"})["cast_id"]
    pi.run_castor_turn(pi.next_turn(), DRAFT_1, entry_id="pi-entry-1")
    view = wait_for(lambda: (v := _status(pi, cast_id))["status"] == "awaiting_refinement" and v, what="paused")
    return cast_id, Path(view["run_dir"])


def _pending_user_turn(pi: PiLikeHarness, cast_id: str, prompt: str = "use postgres") -> str:
    """The user types ``prompt``: the cast now waits for that user-driven turn; its visit id."""
    started = pi.begin_user_turn(prompt)
    assert "Materia active materia (Socket-1)" in started["system_prompt_append"]
    pending = _status(pi, cast_id)["pending"]
    assert pending["user_driven"] is True and pending["mode"] == "refinement"
    return pending["visit_id"]


def _assert_withdrawn(pi: PiLikeHarness, cast_id: str, run_dir: Path, visit_id: str, reason: str) -> None:
    """Back to paused, drafts intact, exactly one ``refinement_turn_abandoned`` for ``visit_id``."""
    view = _status(pi, cast_id)
    assert view["status"] == "awaiting_refinement" and view["paused"] is True and view["pending"] is None
    assert view["active"] is True and view["socket_state"] == "awaiting_user_refinement"
    abandoned = _of(run_dir, "refinement_turn_abandoned")
    assert [(a["visitId"], a["reason"], a["refinementTurn"]) for a in abandoned] == [(visit_id, reason, 2)]
    assert _drafts(run_dir) == [1]
    assert (run_dir / _of(run_dir, "socket_refinement")[0]["artifact"]).read_text() == DRAFT_1


def _wait_warning(pi: PiLikeHarness) -> dict[str, Any]:
    return wait_for(lambda: next((n for n in pi.notes if n.get("level") == "warning" and "withdrawn" in n["message"]),
                                 None), what="the withdrawal warning")


def _finish(pi: PiLikeHarness, cast_id: str) -> dict[str, Any]:
    """``cast.continue`` finalizes; the writer socket runs; the cast completes."""
    cont = pi.client.call("cast.continue", {"session_id": SID, "cast_id": cast_id})
    assert cont["pending"]["mode"] == "finalization"
    pi.run_castor_turn(pi.next_turn(), plan_json("a"), entry_id="pi-entry-final")
    pi.run_castor_turn(pi.next_turn(), "written", entry_id="pi-entry-writer")
    return wait_for(lambda: (v := _status(pi, cast_id))["status"] == "complete" and v, what="complete")


@pytest.mark.timeout(30)
def test_a_settle_after_a_rejected_agent_end_withdraws_the_turn_and_the_cast_finishes(world_factory, project):
    pi = world_factory().connect()
    cast_id, run_dir = _paused_cast(pi, project)
    visit_id = _pending_user_turn(pi, cast_id)
    # The harness's agent_end is mistyped: rejected at the endpoint, it never reaches the cast...
    with pytest.raises(InvalidParams):
        pi.client.call("harness.event", {"session_id": SID, "event": "agent_end", "data": ["not", "a", "map"]})
    with pytest.raises(Conflict) as refused:  # ...which waits for it: continue is refused
        pi.client.call("cast.continue", {"session_id": SID, "cast_id": cast_id})
    assert refused.value.data["reason"] == "awaiting"

    # Pi 1.x settles every run after its agent_end: a settle with the turn still pending means it was lost.
    assert pi.settle_user_run() == {}
    _assert_withdrawn(pi, cast_id, run_dir, visit_id, "settled_without_end")
    assert "Reply again, or run /materia continue" in _wait_warning(pi)["message"]
    # The turn is over: a later user run's transcript is left alone.
    assert pi.event("context", {"turn_id": None, "messages": [{"role": "user", "content": "hi"}]}) == {}
    assert pi.run_turns.empty()  # nothing was re-sent

    done = _finish(pi, cast_id)
    assert done["active"] is False
    complete = _of(run_dir, "socket_complete")[0]
    assert complete["finalizedRefinement"] is True and complete["refinementTurn"] == 1


@pytest.mark.timeout(30)
@pytest.mark.parametrize("with_agent_end", [True, False], ids=["aborted-agent-end", "settle-only"])
def test_an_aborted_user_run_is_withdrawn_without_a_retry(world_factory, project, with_agent_end):
    pi = world_factory().connect()
    cast_id, run_dir = _paused_cast(pi, project)
    visit_id = _pending_user_turn(pi, cast_id)
    if with_agent_end:  # Pi's payload when the user presses Esc mid-reply
        pi.end_user_turn("use postgres", "Draft 2: postg", stop_reason="aborted", error="Request was aborted")
    pi.settle_user_run(aborted=True)
    _assert_withdrawn(pi, cast_id, run_dir, visit_id, "aborted")
    types = [e["type"] for e in events(run_dir)]
    assert "same_socket_recovery_start" not in types and "outcome_ignored" not in types
    assert pi.run_turns.empty()  # no same-socket retry of a run the user cancelled
    _wait_warning(pi)

    # The user types again: that reply is draft 2 (the aborted one never counted).
    pi.run_user_turn("use postgres, really", "Draft 2: postgres it is.")
    assert _drafts(run_dir) == [1, 2]
    assert (run_dir / _of(run_dir, "socket_refinement")[1]["artifact"]).read_text() == "Draft 2: postgres it is."


@pytest.mark.timeout(30)
def test_a_late_agent_end_after_the_withdrawal_is_ignored_never_applied(world_factory, project):
    pi = world_factory().connect()
    cast_id, run_dir = _paused_cast(pi, project)
    visit_id = _pending_user_turn(pi, cast_id)
    pi.settle_user_run()
    _assert_withdrawn(pi, cast_id, run_dir, visit_id, "settled_without_end")

    pi.end_user_turn("use postgres", "Draft 2 (late)")
    ignored = _of(run_dir, "outcome_ignored")
    assert [(i["outcome"], i["visitId"], i["reason"]) for i in ignored] == [
        ("turn_ended", visit_id, "not-current-visit")
    ]
    assert _drafts(run_dir) == [1] and _status(pi, cast_id)["paused"] is True
    assert not any("late" in p.name for p in (run_dir / "sockets" / "Socket-1").iterdir())
    before = events(run_dir)
    pi.end_user_turn("use postgres", "Draft 2 (late again)")  # one late end at most is attributed
    assert events(run_dir) == before

    pi.run_user_turn("use postgres", "Draft 2: postgres it is.")
    assert _drafts(run_dir) == [1, 2]
    assert (run_dir / _of(run_dir, "socket_refinement")[1]["artifact"]).read_text() == "Draft 2: postgres it is."


@pytest.mark.timeout(30)
def test_the_normal_path_agent_end_then_settle_records_the_draft_and_nothing_else(world_factory, project):
    pi = world_factory().connect()
    cast_id, run_dir = _paused_cast(pi, project)
    before = len(events(run_dir))
    pi.begin_user_turn("use postgres")
    pi.end_user_turn("use postgres", "Draft 2: postgres it is.")
    assert _status(pi, cast_id)["pending"] is None  # answered once agent_end returned
    assert pi.settle_user_run() == {}
    added = [e["type"] for e in events(run_dir)[before:]]
    assert added == ["materia_model_settings", "context_refinement", "socket_refinement"]
    assert _drafts(run_dir) == [1, 2] and _status(pi, cast_id)["status"] == "awaiting_refinement"
    assert not [n for n in pi.notes if n.get("level") == "warning"] and pi.run_turns.empty()


@pytest.mark.timeout(40)
@pytest.mark.parametrize("how", ["session_shutdown", "connection_dropped"])
def test_the_session_ending_during_a_user_turn_leaves_a_paused_cast_that_a_recast_resumes(world_factory, project,
                                                                                          how):
    world = world_factory()
    pi = world.connect()
    cast_id, run_dir = _paused_cast(pi, project)
    visit_id = _pending_user_turn(pi, cast_id)
    if how == "session_shutdown":  # what the Pi extension sends on quit
        pi.event("session_shutdown", {"reason": "quit"})
        pi.client.call("session.close", {"session_id": SID})
        reason = "session_shutdown"
    else:  # the harness crashed: its connection closes with the turn still running
        pi.client.close()
        reason = "session_closed"
    wait_for(lambda: not world.runtime.has_session(SID), what="the session closed")
    abandoned = _of(run_dir, "refinement_turn_abandoned")
    assert [(a["visitId"], a["reason"]) for a in abandoned] == [(visit_id, reason)]

    # The harness comes back: the cast is saved paused, nobody holds it, so it is resumable.
    pi2 = world.connect()
    view = _status(pi2, cast_id)
    assert view["status"] == "orphaned" and view["resumable"] is True
    assert view["pending"] is None and view["paused"] is True
    recast = pi2.client.call("cast.recast", {"session_id": SID})  # id-less: the newest resumable cast
    assert recast["cast_id"] == cast_id and recast["status"] == "awaiting_refinement" and recast["paused"] is True
    assert "paused for refinement" in recast["text"]
    assert _of(run_dir, "cast_recast")[-1]["paused"] is True
    assert pi2.run_turns.empty()  # nothing re-sent: the cast waits for the user again

    # Progress in the new session: the user refines, continue finalizes, the cast completes.
    pi2.run_user_turn("use postgres", "Draft 2: postgres it is.")
    assert _drafts(run_dir) == [1, 2]
    done = _finish(pi2, cast_id)
    assert done["status"] == "complete"
    assert _of(run_dir, "socket_complete")[0]["refinementTurn"] == 2


@pytest.mark.timeout(30)
def test_a_crash_of_the_cast_actor_withdraws_the_user_turn_and_ignores_its_late_end(world_factory, project):
    world = world_factory()
    pi = world.connect()
    cast_id, run_dir = _paused_cast(pi, project)
    visit_id = _pending_user_turn(pi, cast_id)
    handle = world.runtime.system.lookup(f"/root/session/{SID}/cast/{cast_id}")
    faults.kill(handle)  # crashes at its next message; the restart resumes from state.json
    wait_for(lambda: _of(run_dir, "refinement_turn_abandoned"), what="the restart's withdrawal")
    assert handle.incarnation == 2
    _assert_withdrawn(pi, cast_id, run_dir, visit_id, "restart")
    assert pi.run_turns.empty()  # castor never re-runs the user's own turn

    # The harness was still running that turn; its end arrives now and is not applied.
    pi.end_user_turn("use postgres", "Draft 2 (from before the crash)")
    assert [i["visitId"] for i in _of(run_dir, "outcome_ignored")] == [visit_id] and _drafts(run_dir) == [1]
    pi.settle_user_run()
    assert len(_of(run_dir, "refinement_turn_abandoned")) == 1
    assert _finish(pi, cast_id)["status"] == "complete"


@pytest.mark.timeout(30)
def test_a_new_user_message_supersedes_a_turn_whose_end_and_settle_were_lost(world_factory, project):
    pi = world_factory().connect()
    cast_id, run_dir = _paused_cast(pi, project)
    first = _pending_user_turn(pi, cast_id)
    second = _pending_user_turn(pi, cast_id, "use postgres (again)")  # a new run: the first one is over
    assert second != first
    assert [(a["visitId"], a["reason"]) for a in _of(run_dir, "refinement_turn_abandoned")] == [(first, "superseded")]
    pi.end_user_turn("use postgres (again)", "Draft 2: postgres it is.")
    pi.settle_user_run()
    assert _drafts(run_dir) == [1, 2] and _status(pi, cast_id)["paused"] is True
    assert [c["refinementTurn"] for c in _of(run_dir, "context_refinement")] == [2, 2]


@pytest.mark.timeout(30)
def test_the_opt_in_bound_withdraws_a_user_turn_never_reported(world_factory, project):
    pi = world_factory(user_turn_timeout_s=1.5).connect()
    cast_id, run_dir = _paused_cast(pi, project)
    # A turn answered in time is not touched by its bound...
    pi.run_user_turn("use postgres", "Draft 2: postgres it is.")
    # ...a turn nobody reports is withdrawn once the bound passes (the first turn's timer, which
    # would have fired before this one's, withdrew nothing).
    visit_id = _pending_user_turn(pi, cast_id, "and add an index")
    wait_for(lambda: _of(run_dir, "refinement_turn_abandoned"), timeout=10, what="the bound's withdrawal")
    abandoned = _of(run_dir, "refinement_turn_abandoned")
    assert [(a["visitId"], a["reason"], a["refinementTurn"]) for a in abandoned] == [(visit_id, "timed_out", 3)]
    view = _status(pi, cast_id)
    assert view["paused"] is True and view["pending"] is None and _drafts(run_dir) == [1, 2]
    pi.end_user_turn("and add an index", "Draft 3 (too late)")
    assert [i["visitId"] for i in _of(run_dir, "outcome_ignored")] == [visit_id] and _drafts(run_dir) == [1, 2]


@pytest.mark.timeout(30)
def test_a_user_turn_under_the_opt_in_bound_shows_how_long_until_it_is_withdrawn(world_factory, project):
    """With ``user_turn_timeout_s`` set, the cast waiting for the user's own turn read "awaiting the
    agent's turn ... for 12.0s" and nothing of the bound that withdraws it: its activity now has
    ``deadline_in_s``; a cast waiting for castor's own turn (no bound) has none."""
    world = world_factory(user_turn_timeout_s=20.0)
    pi = world.connect()
    cast_id, _run_dir = _paused_cast(pi, project)
    handle = world.runtime.system.registry.lookup(f"/root/session/{SID}/cast/{cast_id}")
    assert handle.snapshot_data()["activity"]["deadline_in_s"] is None  # paused: nothing bounds the wait
    _pending_user_turn(pi, cast_id)
    activity = handle.snapshot_data()["activity"]
    assert activity["data"]["pending"] == "agent_turn"
    assert activity["deadline_in_s"] is not None and 15.0 < activity["deadline_in_s"] <= 20.0, activity

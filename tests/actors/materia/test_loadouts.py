"""Each bundled loadout runs to completion through the real actors and writes the artifact layout."""

from __future__ import annotations

import json
from pathlib import Path

from castor.actors.materia.api import materia_call
from castor.supervision import faults
from castor.supervision.kinds import ChildExited

from .helpers import event_types, events, open_session, plan_json, verdict, wait_for, wait_status


def _layout_ok(run_dir: Path) -> None:
    for name in ("config.resolved.json", "manifest.json", "usage.json", "events.jsonl", "state.json"):
        assert (run_dir / name).is_file(), name
    manifest = json.loads((run_dir / "manifest.json").read_text())
    assert manifest["castId"] == run_dir.name and manifest["entries"][-1]["phase"] == "complete"
    types = event_types(run_dir)
    assert types[0] == "cast_start" and types[-1] == "cast_end"
    assert events(run_dir)[-1]["data"]["ok"] is True
    assert json.loads((run_dir / "state.json").read_text())["state"]["phase"] == "complete"


def test_hello_loadout_completes_with_its_artifacts(runtime_factory, project):
    rt = runtime_factory()
    agent, ui = open_session(rt, "s1", project, ["Hi! Nothing to change."])
    started = materia_call(rt, "s1", "start", {"request": "say hi", "loadout": "hello"})
    assert started["text"].startswith("pi-materia cast ") and started["level"] == "info"
    view = wait_status(rt, "s1", started["cast_id"])
    assert view["status"] == "complete"
    run_dir = Path(view["run_dir"])
    _layout_ok(run_dir)
    assert (run_dir / "sockets" / "Socket-1" / "1.md").read_text() == "Hi! Nothing to change."
    assert sorted(p.name for p in (run_dir / "contexts").iterdir()) == ["Socket-1-1.md"]
    assert [r.socket_id for r in agent.requests()] == ["Socket-1"]
    assert any("complete" in m for _level, m in ui.notifications)


def test_build_loop_with_rework_runs_every_item_and_reworks_the_rejected_one(runtime_factory, project):
    rt = runtime_factory()
    script = {
        "Socket-3": [plan_json("a", "b")],
        "Socket-4": ["built a", "built a again", "built b"],
        "Socket-5": [verdict(False, "a is missing tests"), verdict(True), verdict(True)],
        "Socket-7": ["all done"],
    }
    agent, _ui = open_session(rt, "s1", project, script)
    started = materia_call(rt, "s1", "start", {"request": "build two things", "loadout": "build"})
    view = wait_status(rt, "s1", started["cast_id"])
    assert view["status"] == "complete", view
    run_dir = Path(view["run_dir"])
    _layout_ok(run_dir)
    completed = [
        (e["data"]["socket"], e["data"].get("itemKey")) for e in events(run_dir) if e["type"] == "socket_complete"
    ]
    assert completed == [("Socket-1", None), ("Socket-2", None), ("Socket-3", None),
                         ("Socket-4", "a"), ("Socket-5", "a"), ("Socket-4", "a"), ("Socket-5", "a"), ("Socket-6", "a"),
                         ("Socket-4", "b"), ("Socket-5", "b"), ("Socket-6", "b"), ("Socket-7", None)]
    # The rework prompt carries the reviewer's feedback; the utility sockets really ran in the project.
    rework_prompt = [r for r in agent.requests() if r.socket_id == "Socket-4"][1].prompt
    assert "a is missing tests" in rework_prompt
    assert ".pi/pi-materia/" in (project / ".gitignore").read_text()
    assert (run_dir / "sockets" / "Socket-4" / "2-a.md").read_text() == "built a again"
    assert (run_dir / "sockets" / "Socket-2" / "1.json").is_file()


def test_plan_loadout_pauses_for_refinement_and_continue_finalizes(runtime_factory, project):
    rt = runtime_factory()
    script = {"Socket-1": ["Which database do you use?", plan_json("x")], "Socket-2": ["Plan: x"]}
    agent, _ui = open_session(rt, "s1", project, script)
    started = materia_call(rt, "s1", "start", {"request": "plan it", "loadout": "plan"})
    paused = wait_status(rt, "s1", started["cast_id"], ("awaiting_refinement",))
    assert paused["paused"] is True and paused["current_socket"] == "Socket-1"
    run_dir = Path(paused["run_dir"])
    assert "socket_refinement" in event_types(run_dir) and "socket_complete" not in event_types(run_dir)
    cont = materia_call(rt, "s1", "continue", {})
    assert cont["cast_id"] == started["cast_id"]
    view = wait_status(rt, "s1", started["cast_id"])
    assert view["status"] == "complete"
    final = [r for r in agent.requests() if r.socket_id == "Socket-1"][-1]
    assert "Command-triggered finalization" in final.prompt and "Return only JSON" in final.prompt
    done = [e for e in events(run_dir) if e["type"] == "socket_complete" and e["data"]["socket"] == "Socket-1"]
    assert done and done[0]["data"]["finalizedRefinement"] is True
    assert json.loads((run_dir / "sockets" / "Socket-1" / "1.json").read_text())["workItems"][0]["id"] == "x"


def test_per_session_limit_refuses_a_second_cast_with_conflict(runtime_factory, project):
    import pytest

    from castor.messages.errors import Conflict

    rt = runtime_factory()
    open_session(rt, "s1", project, [{"text": "slow", "delay_ms": 400}, "second"])
    first = materia_call(rt, "s1", "start", {"request": "one", "loadout": "hello"})
    with pytest.raises(Conflict) as err:
        materia_call(rt, "s1", "start", {"request": "two", "loadout": "hello"})
    assert first["cast_id"] in err.value.message
    wait_status(rt, "s1", first["cast_id"])
    second = materia_call(rt, "s1", "start", {"request": "two", "loadout": "hello"})
    assert wait_status(rt, "s1", second["cast_id"])["status"] == "complete"


def test_abort_then_recast_completes(runtime_factory, project):
    rt = runtime_factory()
    agent, _ui = open_session(rt, "s1", project, [{"text": "never used", "delay_ms": 5000}, "after recast"])
    started = materia_call(rt, "s1", "start", {"request": "slow one", "loadout": "hello"})
    wait_for(lambda: agent.in_flight(), what="the turn in flight")
    aborted = materia_call(rt, "s1", "abort", {})
    assert aborted["status"] == "aborted" and aborted["level"] == "warning"
    assert agent.in_flight() == []  # CancelWork reached the agent
    listing = materia_call(rt, "s1", "list")
    assert listing["casts"][0]["resumable"] is True and "RECAST TARGET" in listing["text"]
    recast = materia_call(rt, "s1", "recast", {})  # id-less: newest resumable
    assert recast["cast_id"] == started["cast_id"]
    view = wait_status(rt, "s1", started["cast_id"])
    assert view["status"] == "complete"
    assert "cast_recast" in event_types(view["run_dir"])


def test_a_recast_right_after_an_abort_waits_for_the_cast_to_leave_its_supervisor(runtime_factory, project):
    # The cast supervisor bookkeeps a cast's exit on its own thread (its ChildExited). Held back
    # here, as a busy supervisor would hold it: the recast must wait for the removal instead of
    # starting a second actor under the same id (CI saw `Conflict: child ... already exists`).
    rt = runtime_factory()
    agent, _ui = open_session(rt, "s1", project, [{"text": "never used", "delay_ms": 5000}, "after recast"])
    started = materia_call(rt, "s1", "start", {"request": "slow one", "loadout": "hello"})
    wait_for(lambda: agent.in_flight(), what="the turn in flight")
    faults.delay_next(rt.system.lookup("/root/session/s1/cast"), 0.3, ChildExited.type_name)
    assert materia_call(rt, "s1", "abort", {})["status"] == "aborted"
    recast = materia_call(rt, "s1", "recast", {"cast_id": started["cast_id"]})
    assert recast["cast_id"] == started["cast_id"] and recast["level"] == "info", recast
    assert wait_status(rt, "s1", started["cast_id"])["status"] == "complete"


def test_exhausted_recovery_is_revived_and_completes(runtime_factory, project):
    rt = runtime_factory()
    overflow = {"error": "context_length_exceeded: too many tokens"}
    agent, _ui = open_session(rt, "s1", project, [overflow, overflow, "fits now"])
    started = materia_call(rt, "s1", "start", {"request": "big", "loadout": "hello"})
    failed = wait_status(rt, "s1", started["cast_id"])
    assert failed["status"] == "failed" and failed["revivable"] is True
    assert "Same-socket recovery exhausted" in failed["failed_reason"]
    types = event_types(failed["run_dir"])
    assert "same_socket_recovery_action_complete" in types and "same_socket_recovery_exhausted" in types
    # A standalone agent has no host context: the compaction says so instead of pretending.
    complete = next(e for e in events(failed["run_dir"]) if e["type"] == "same_socket_recovery_action_complete")
    assert complete["data"]["result"] == {} and complete["data"]["skipped"] == "no host context"
    # /materia casts marks it a recast target with its recast line, as pi-materia does, and offers revive
    listed = materia_call(rt, "s1", "list", {})["text"]
    cast_id = started["cast_id"]
    assert f"↻ RECAST TARGET — recast: /materia recast {cast_id} (or revive: /materia revive {cast_id})" in listed \
        or f"recast: castor recast {cast_id} (or revive: castor revive {cast_id})" in listed, listed
    revived = materia_call(rt, "s1", "revive", {})  # id-less: the newest revivable cast
    assert revived["cast_id"] == started["cast_id"]
    # pi-materia's revive ends in its recast, and tells it so (castor said "revived from socket")
    assert f'pi-materia cast {started["cast_id"]} recast from socket "Socket-1".' in revived["text"]
    view = wait_status(rt, "s1", started["cast_id"])
    assert view["status"] == "complete"
    assert "cast_revive" in event_types(view["run_dir"])
    assert len(agent.requests()) == 3

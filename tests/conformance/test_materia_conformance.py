"""Spec §11 conformance items that had no test of their own elsewhere (see docs/materia.md,
"Conformance map (§11)", for where every other item is proved).

Each test is named ``test_c<N>_<short>`` after the §11 item it proves. Where castor deliberately
differs from pi-materia c01979f, the test asserts castor's documented behaviour and says so.

Engine-level tests drive the pure ``engine.step`` with scripted turn outcomes (an LLM cannot
exist here); actor-level tests run a real ``Runtime`` with the materia component, real files and
the scripted agent. The small helpers below are copied, not imported, from the other test areas.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest

from castor.domain.materia import compaction
from castor.domain.materia.cast_messages import (
    CompactionFinished,
    Notify,
    ProactiveCompactionFinished,
    ProactiveCompactionStarted,
    RecastRequested,
    RefinementTurnStarted,
    RunAgentTurn,
    WriteArtifact,
)
from castor.domain.materia.config import ResolvedConfig
from castor.domain.materia.defaults import DEFAULT_LABEL, default_config
from castor.domain.materia.engine import CastRejected, step
from castor.domain.materia.resolve import load_config, resolve_config
from tests.domain.materia.scripted import Driver  # the engine driver the domain tests use (asserts purity too)
from tests.support.waiting import wait_for

# =========================================================================== engine helpers


def resolved(cfg: dict[str, Any] | None = None, loadout: str | None = None) -> ResolvedConfig:
    layers: list[tuple[str, dict[str, Any]]] = [(DEFAULT_LABEL, default_config())] if cfg is None else []
    if cfg is not None:
        layers.append(("conformance.json", cfg))
    return resolve_config(load_config(layers), loadout)


def agent(prompt: str = "Do {{request}}", tools: str = "coding", **extra: Any) -> dict[str, Any]:
    return {"prompt": prompt, "tools": tools, **extra}


def config(sockets: dict[str, Any], *, loops: dict[str, Any] | None = None, **top: Any) -> dict[str, Any]:
    loadout: dict[str, Any] = {"entry": next(iter(sockets)), "sockets": sockets}
    if loops:
        loadout["loops"] = loops
    return {"materia": {"A": agent(), "J": agent(), "G": agent(generator=True)},
            "loadouts": {"L": loadout}, "activeLoadout": "L", **top}


def _loop_config(exits: list[dict[str, Any]] | None) -> dict[str, Any]:
    """Generator Socket-1 feeding a one-member consuming loop at Socket-2 (advance on ``satisfied``)."""
    sockets = {
        "Socket-1": {"type": "agent", "materia": "G", "parse": "json", "edges": [{"when": "always", "to": "Socket-2"}]},
        "Socket-2": {"type": "agent", "materia": "J", "parse": "json",
                     "advance": {"cursor": "workItemIndex", "items": "state.workItems", "when": "satisfied"},
                     "edges": [{"when": "satisfied", "to": "Socket-2"}, {"when": "not_satisfied", "to": "Socket-2"}]},
        "Socket-3": {"type": "agent", "materia": "A"},
    }
    loop: dict[str, Any] = {"sockets": ["Socket-2"], "consumes": {"from": "Socket-1"}}
    if exits is not None:
        loop["exits"] = exits
    return config(sockets, loops={"lp": loop})


# =========================================================================== config & validation


def test_c4_a_shipped_default_loadout_cannot_be_deleted(tmp_path: Path) -> None:
    """Deliberate difference: castor has no config-patch save API, so there is no "Cannot delete
    shipped default" save error. The rule itself holds at load: a layer's ``null`` for a shipped
    loadout is ignored (recorded in provenance) and the loadout stays, sourced from the default."""
    from castor.adapters.materia import config_loader

    project = tmp_path / "proj"
    (project / ".pi").mkdir(parents=True)
    (project / ".pi" / "pi-materia.json").write_text(json.dumps({"loadouts": {"build": None, "hello": None}}))
    loaded = config_loader.load(project, env={"PI_MATERIA_PROFILE_DIR": str(tmp_path / "profile")})
    assert {"build", "hello", "plan"} <= set(loaded.merged["loadouts"])
    assert loaded.provenance.loadouts["build"] == DEFAULT_LABEL
    assert sorted(loaded.provenance.ignored_deletes) == sorted([f"{project / '.pi' / 'pi-materia.json'}:build",
                                                               f"{project / '.pi' / 'pi-materia.json'}:hello"])
    assert config_loader.load_resolved(project, loadout="build",
                                       env={"PI_MATERIA_PROFILE_DIR": str(tmp_path / "profile")}).pipeline.sockets


def test_c27_single_percent_wins_over_tiers_in_a_loaded_config() -> None:
    tiers = [
        {"thresholdPercent": 70, "maxContextWindow": 100_000},
        {"thresholdPercent": 60, "minContextWindow": 100_000},
    ]
    cfg = config({"Socket-1": {"type": "agent", "materia": "A"}},
                 compaction={"proactiveThresholdPercent": 42, "proactiveThresholdTiers": tiers})
    rc = resolved(cfg)
    for window in (50_000, 272_000, None):
        threshold = compaction.threshold_for(rc.compaction, window)
        assert (threshold.percent, threshold.mode) == (42, "single_percent")
    decision = compaction.decide_proactive({"tokens": 43_000, "contextWindow": 100_000}, model_context_window=None,
                                           config=rc.compaction)
    assert decision is not None and decision.threshold.percent == 42
    assert compaction.decide_proactive({"tokens": 41_000, "contextWindow": 100_000}, model_context_window=None,
                                       config=rc.compaction) is None


# =========================================================================== routing, loops, limits


@pytest.mark.parametrize(
    ("output", "fragment"),
    [(["x"], "expected a JSON object at the top level"), ({"satisfied": "true"}, '"satisfied" must be a boolean'),
     ({"feedback": ["x"]}, '"feedback" must be a string'), ({"missing": "x"}, '"missing" must be an array')],
)
def test_c30_bad_handoff_fails_the_cast_with_the_validation_message(output: Any, fragment: str) -> None:
    cfg = config({"Socket-1": {"type": "agent", "materia": "J", "parse": "json", "edges": [{"to": "Socket-2"}]},
                  "Socket-2": {"type": "agent", "materia": "A"}})
    d = Driver(resolved(cfg))
    tr = d.reply(output)
    s = d.state
    assert s.phase == "failed" and not s.active
    assert (
        s.failed_reason.startswith('Invalid handoff JSON output for socket "Socket-1"') and fragment in s.failed_reason
    )
    end = tr.events("cast_end")
    assert end and end[-1].data["ok"] is False
    assert len(d.turns()) == 1  # Socket-2 never started


def test_c34_advance_on_satisfied_moves_the_cursor_only_on_true() -> None:
    d = Driver(resolved(_loop_config([])))
    d.reply({"workItems": [{"id": "alpha"}, {"id": "beta"}]})
    assert d.state.cursors["workItemIndex"] == 0 and d.pending().item_key == "alpha"
    seen = []
    for satisfied in (False, True, True):
        d.reply({"satisfied": satisfied})
        seen.append(d.state.cursors["workItemIndex"])
    assert seen == [0, 1, 2]  # 0 → 0 → 1 → exhausted (2 of 2)
    s = d.state
    assert s.phase == "complete"  # exhausted with no exit route: end
    assert [t.item_key for t in d.turns() if t.socket_id == "Socket-2"] == ["alpha", "alpha", "beta"]


def test_c38_empty_loop_at_entry_routes_without_a_visit() -> None:
    exits = [{"id": "a", "from": "Socket-2", "condition": "always", "targetSocketId": "Socket-3"}]
    d = Driver(resolved(_loop_config(exits)))
    d.reply({"workItems": []})
    assert d.pending().socket_id == "Socket-3"
    assert "Socket-2" not in d.state.visits
    assert [e.data["socket"] for e in d.events("socket_start")] == ["Socket-1", "Socket-3"]

    no_route = Driver(resolved(_loop_config([])))
    no_route.reply({"workItems": []})
    assert no_route.state.phase == "complete" and "Socket-2" not in no_route.state.visits
    assert [e.data["socket"] for e in no_route.events("socket_start")] == ["Socket-1"]


def test_c41_foreach_items_name_the_turns_and_artifacts() -> None:
    cfg = config({"Socket-1": {"type": "agent", "materia": "A", "foreach": {"items": "state.list", "cursor": "i"},
                               "advance": {"cursor": "i", "items": "state.list"},
                               "edges": [{"when": "always", "to": "Socket-1"}]}})
    d = Driver(resolved(cfg), data={"list": [{"id": "a", "title": "Alpha"}, {"id": "b", "title": "Beta"}]})
    seen = []
    for text in ("did a", "did b"):
        seen.append((d.state.current_item_key, d.state.current_item_label))
        d.reply(text)
    assert seen == [("a", "Alpha"), ("b", "Beta")]
    assert d.state.phase == "complete"
    outputs = sorted(p for p in ("/".join(e.path) for e in d.effects if isinstance(e, WriteArtifact))
                     if p.startswith("sockets/Socket-1/"))
    assert outputs == ["sockets/Socket-1/1-a.md", "sockets/Socket-1/2-b.md"]


# =========================================================================== agent turns, multi-turn, recovery


@pytest.mark.parametrize("phrase", ["ready to continue", "finalize", "looks good, proceed"])
def test_c49_finalizing_words_in_a_refinement_turn_do_not_finalize(phrase: str) -> None:
    """In castor the user's message never reaches the engine (only ``RefinementTurnStarted``), so no
    wording can finalize; even a reply that repeats the words keeps the socket paused."""
    d = Driver(resolved(None, "plan"))
    d.reply("First draft")
    assert d.state.paused
    d.send(RefinementTurnStarted)
    d.reply(phrase)
    s = d.state
    assert s.paused and s.socket_state == "awaiting_user_refinement"
    assert s.multi_turn_finalizing is not True
    assert not d.events("socket_complete")


def test_the_synthetic_context_mode_line_is_pi_materias() -> None:
    """The isolated context's ``Mode:`` line reads as pi-materia's: a multi-turn socket's turn is
    "multi-turn refinement (awaiting_agent_response)", its finalization "multi-turn refinement
    (/materia continue finalization)"; a single-turn socket's, its socket state. castor wrote its
    recovery-key mode ("refinement", "finalization", "normal")."""
    from castor.domain.materia.cast_messages import ContinueRequested

    d = Driver(resolved(None, "plan"))
    d.reply("First draft")
    d.send(RefinementTurnStarted)
    assert "\nMode: multi-turn refinement (awaiting_agent_response)\n" in d.pending().isolated_context
    d.reply("Second draft")
    d.send(ContinueRequested)
    assert "\nMode: multi-turn refinement (/materia continue finalization)\n" in d.pending().prompt
    single = Driver(resolved(config({"Socket-1": {"type": "agent", "materia": "A"}})))
    context = single.artifacts()["contexts/Socket-1-1.md"].content
    assert "\nMode: awaiting_agent_response\n" in context


def test_c52_stale_finalizing_flag_is_ignored_by_the_next_reply() -> None:
    d = Driver(resolved(None, "plan"))
    d.reply("Draft one")
    assert d.state.paused
    d.state = d.state.model_copy(update={"multi_turn_finalizing": True})  # a stale flag in the snapshot
    d.send(RefinementTurnStarted)
    tr = d.reply("Draft two")
    s = d.state
    key = json.dumps(["Socket-1", "__singleton__", 1], separators=(",", ":"))
    assert s.multi_turn_refinements[key] == 2
    assert s.multi_turn_finalizing is False and s.paused
    written = [e for e in tr.effects if isinstance(e, WriteArtifact)]
    assert any(e.manifest and e.manifest.get("kind") == "socket_refinement" and e.manifest.get("refinementTurn") == 2
               for e in written)
    assert not any(e.manifest and e.manifest.get("kind") == "socket_output" for e in written)
    assert not tr.events("socket_complete")


def test_c57_transient_transport_warns_the_user() -> None:
    d = Driver(resolved(None, "hello"))
    tr = d.fail_turn("WebSocket error")
    notes = [e for e in tr.effects if isinstance(e, Notify)]
    assert [n.level for n in notes] == ["warning"]
    assert tr.events("transient_transport_turn_failure")[0].data["warning"] is True
    assert d.state.active and d.state.awaiting_response and not tr.events("cast_end")


def test_c61_failed_proactive_compaction_warns_and_the_cast_stays_active_awaiting_its_turn() -> None:
    """Conformance 61 at the engine: every non-recovery turn is marked for the proactive check with
    the loadout's compaction config; when the actor's decision fires and the host compaction fails,
    ``proactive_compaction_failed{warning:true}`` and a warning notification are emitted, and the cast
    stays active, still awaiting that same turn (the SocketActor sends it either way: the endpoint
    test tests/actors/materia/test_compaction_endpoint.py and real Pi, tests/e2e test h)."""
    cfg = config({"Socket-1": {"type": "agent", "materia": "A"}}, compaction={"proactiveThresholdPercent": 50})
    d = Driver(resolved(cfg))
    first = d.pending()
    assert first.proactive_compaction is True and first.compaction is not None
    decision = compaction.decide_proactive({"tokens": 60_000, "contextWindow": 100_000},
                                           model_context_window=None, config=first.compaction)
    assert decision is not None and decision.event_data()["thresholdPercent"] == 50
    d.send(ProactiveCompactionStarted, visit_id=first.visit_id, decision=decision)
    tr = d.send(ProactiveCompactionFinished, visit_id=first.visit_id, decision=decision, ok=False, error="host said no")
    [failed] = [e.data for e in d.events() if e.type == "proactive_compaction_failed"]
    assert (
        failed["warning"] is True and failed["error"] == "host said no" and failed["thresholdMode"] == "single_percent"
    )
    assert any(isinstance(e, Notify) and e.level == "warning" for e in tr.effects)
    assert d.state.active and d.state.awaiting_response and d.pending() is first
    d.fail_turn("context window exceeded")  # a later context_window error still goes to recovery
    d.send(CompactionFinished, visit_id=d.pending().visit_id, ok=True)
    assert d.pending().recovery and d.pending().proactive_compaction is False  # recovery sends skip the check


def test_user_notices_carry_pi_materias_phrases() -> None:
    """What the user is told, in the phrases pi-materia's notices use (castor had its own for each):
    "pi-materia cast complete." with the usage, "pi-materia cast failed: <reason>", a paused multi-turn
    socket 'pi-materia multi-turn socket "<id>" is waiting for refinement; run /materia continue to
    finalize.' and a failed proactive compaction "Proactive compaction failed ..."."""

    def notices(d: Driver) -> list[str]:
        return [e.message for e in d.effects if isinstance(e, Notify)]

    done = Driver(resolved(config({"Socket-1": {"type": "agent", "materia": "A"}})))
    done.reply("ok", usage={"input_tokens": 3, "output_tokens": 4})
    assert any(n.startswith("pi-materia cast complete. ") and "7 tokens" in n for n in notices(done)), notices(done)
    broken = Driver(resolved(config({"Socket-1": {"type": "agent", "materia": "J", "parse": "json"}})))
    broken.reply("not json")
    assert any(n.startswith('pi-materia cast failed: Invalid JSON output for socket "Socket-1"')
               for n in notices(broken)), notices(broken)
    cfg = config({"Socket-1": {"type": "agent", "materia": "M"}})
    cfg["materia"]["M"] = agent(multiTurn=True)
    paused = Driver(resolved(cfg))
    paused.reply("a draft")
    assert ('pi-materia multi-turn socket "Socket-1" is waiting for refinement; run /materia continue to finalize.'
            in " ".join(notices(paused))), notices(paused)
    cfg = config({"Socket-1": {"type": "agent", "materia": "A"}}, compaction={"proactiveThresholdPercent": 50})
    d = Driver(resolved(cfg))
    first = d.pending()
    decision = compaction.decide_proactive({"tokens": 60_000, "contextWindow": 100_000},
                                           model_context_window=None, config=first.compaction)
    assert decision is not None
    d.send(ProactiveCompactionStarted, visit_id=first.visit_id, decision=decision)
    d.send(ProactiveCompactionFinished, visit_id=first.visit_id, decision=decision, ok=False, error="host said no")
    assert any("Proactive compaction failed" in n and "host said no" in n for n in notices(d)), notices(d)


# =========================================================================== recast / abort / commands


def test_c70_recast_of_a_failed_agent_socket_resends_the_stored_prompt() -> None:
    cfg = config({"Socket-1": {"type": "agent", "materia": "A", "edges": [{"to": "Socket-2"}]},
                  "Socket-2": {"type": "agent", "materia": "A"}})
    d = Driver(resolved(cfg))
    d.reply("first done")
    sent = d.pending()
    assert sent.socket_id == "Socket-2"
    d.fail_turn("provider auth failed")
    assert d.state.phase == "failed" and not d.state.aborted and "Non-recoverable" in d.state.failed_reason
    d.send(RecastRequested)
    again = d.pending()
    assert isinstance(again, RunAgentTurn) and again.prompt == sent.prompt and again.visit == sent.visit
    assert d.state.visits == {"Socket-1": 1, "Socket-2": 1}
    assert d.events("cast_recast")[-1].data["reusedActivePrompt"] is True
    assert d.state.last_message == "Recasting from socket Socket-2."
    d.reply("second done")
    assert d.state.phase == "complete"


def test_c71_recast_of_an_idle_cast_that_is_not_failed_is_rejected() -> None:
    d = Driver(resolved(None, "hello"))
    idle = d.state.model_copy(update={"active": False, "awaiting_response": False, "pending": None,
                                      "socket_state": "idle", "phase": "Socket-1"})
    with pytest.raises(CastRejected) as err:
        step(idle, RecastRequested(at=99.0))
    assert "is not failed or aborted" in err.value.message and err.value.data["reason"] == "not-failed"


# =========================================================================== actor helpers (copied)


def _runtime(**settings: Any) -> Any:
    from castor.composition import materia_component
    from castor.runtime import Runtime, RuntimeSettings

    return Runtime(RuntimeSettings(**settings), components=[materia_component()])


def _open_session(rt: Any, sid: str, cwd: Path, script: Any) -> Any:
    from castor.adapters.agents.scripted import ScriptedAgent, parse_script
    from castor.adapters.stderr_ui import StderrUi
    from castor.runtime import HarnessLink, SessionInfo

    scripted = ScriptedAgent(parse_script(script))
    rt.open_session(SessionInfo(session_id=sid, cwd=str(cwd), trusted=True),
                    HarnessLink(agent=scripted, session_log=None, ui=StderrUi(printer=lambda _line: None)))
    return scripted


def _wait_status(rt: Any, sid: str, cast_id: str, statuses: tuple[str, ...]) -> dict[str, Any]:
    from castor.actors.materia.api import materia_call

    def check() -> dict[str, Any] | None:
        view = materia_call(rt, sid, "status", {"cast_id": cast_id})
        return view if view["status"] in statuses else None

    return wait_for(check, what=f"cast {cast_id} in {statuses}")


@pytest.fixture
def runtime():
    rt = _runtime()
    yield rt
    rt.shutdown(10.0)


@pytest.fixture
def project(tmp_path: Path) -> Path:
    path = tmp_path / "project"
    path.mkdir()
    return path


def test_c69_idless_recast_resumes_the_newest_of_a_failed_and_a_later_aborted_cast(runtime, project) -> None:
    from castor.actors.materia.api import materia_call

    failing = {"entry": "Socket-1", "sockets": {"Socket-1": {"type": "utility",
                                                             "command": [sys.executable, "-c", "raise SystemExit(3)"]}}}
    (project / ".pi").mkdir()
    (project / ".pi" / "pi-materia.json").write_text(json.dumps({"loadouts": {"failing": failing}}))
    scripted = _open_session(runtime, "s1", project, [{"text": "never used", "delay_ms": 5000}, "after recast"])
    first = materia_call(runtime, "s1", "start", {"request": "fail", "loadout": "failing"})
    failed = _wait_status(runtime, "s1", first["cast_id"], ("failed",))
    assert "exited with code 3" in failed["failed_reason"]
    second = materia_call(runtime, "s1", "start", {"request": "slow", "loadout": "hello"})
    assert second["cast_id"] > first["cast_id"]
    wait_for(lambda: scripted.in_flight(), what="the turn in flight")
    assert materia_call(runtime, "s1", "abort", {})["status"] == "aborted"
    recast = materia_call(runtime, "s1", "recast", {})
    assert recast["cast_id"] == second["cast_id"]
    assert recast["last_message"] == "Recasting from socket Socket-1."
    assert _wait_status(runtime, "s1", second["cast_id"], ("complete",))["status"] == "complete"
    assert materia_call(runtime, "s1", "status", {"cast_id": first["cast_id"]})["status"] == "failed"


def test_c71_recast_of_an_unknown_cast_id_names_it(runtime, project) -> None:
    from castor.actors.materia.api import materia_call
    from castor.messages.errors import NotFound

    _open_session(runtime, "s1", project, ["unused"])
    with pytest.raises(NotFound) as err:
        materia_call(runtime, "s1", "recast", {"cast_id": "x"})
    assert 'Unknown pi-materia cast id "x"' in err.value.message


def test_c72_cast_and_loadout_are_rejected_while_a_cast_is_active_and_write_nothing(runtime, project) -> None:
    from castor.actors.materia.api import materia_call
    from castor.messages.errors import Conflict

    scripted = _open_session(runtime, "s1", project, [{"text": "slow", "delay_ms": 5000}])
    started = materia_call(runtime, "s1", "start", {"request": "one", "loadout": "hello"})
    wait_for(lambda: scripted.in_flight(), what="the turn in flight")
    run_root = Path(started["run_dir"]).parent
    casts_before = sorted(p.name for p in run_root.iterdir())
    with pytest.raises(Conflict):
        materia_call(runtime, "s1", "set_loadout", {"name": "plan"})
    with pytest.raises(Conflict):
        materia_call(runtime, "s1", "start", {"request": "two", "loadout": "hello"})
    assert not (project / ".pi" / "pi-materia.json").exists()
    assert sorted(p.name for p in run_root.iterdir()) == casts_before
    materia_call(runtime, "s1", "abort", {})


@pytest.mark.timeout(30)
def test_command_texts_for_abort_and_continue_without_a_cast_are_pi_materias(runtime, project) -> None:
    """pi-materia answers ``/materia abort`` with no active cast "No active pi-materia cast to abort.",
    ``/materia continue`` with no cast state at all "No pi-materia cast state in this session." and,
    when the newest cast has ended, "No active pi-materia cast to continue." castor answered all three
    "No active pi-materia cast in this session."."""
    from castor.actors.materia.api import materia_call
    from castor.messages.errors import CastorError

    _open_session(runtime, "s1", project, ["done"])
    with pytest.raises(CastorError) as err:
        materia_call(runtime, "s1", "abort", {})
    assert err.value.message == "No active pi-materia cast to abort."
    with pytest.raises(CastorError) as err:
        materia_call(runtime, "s1", "continue", {})
    assert err.value.message == "No pi-materia cast state in this session."
    started = materia_call(runtime, "s1", "start", {"request": "hi", "loadout": "hello"})
    _wait_status(runtime, "s1", started["cast_id"], ("complete",))
    with pytest.raises(CastorError) as err:
        materia_call(runtime, "s1", "continue", {})
    assert "No active pi-materia cast to continue." in err.value.message
    with pytest.raises(CastorError) as err:
        materia_call(runtime, "s1", "abort", {})
    assert "No active pi-materia cast to abort." in err.value.message


@pytest.mark.timeout(30)
def test_idless_recast_and_revive_with_nothing_to_resume_say_so_as_pi_materia(runtime, project) -> None:
    """pi-materia: "No failed or aborted pi-materia casts are available to recast." and "No failed
    pi-materia casts exhausted by same-socket recovery are available to revive. Use /materia recast
    [cast-id] for general failed or aborted casts." (castor had its own wording for both)."""
    from castor.actors.materia.api import materia_call
    from castor.messages.errors import NotFound

    _open_session(runtime, "s1", project, ["unused"])
    with pytest.raises(NotFound) as err:
        materia_call(runtime, "s1", "recast", {})
    assert err.value.message == "No failed or aborted pi-materia casts are available to recast."
    with pytest.raises(NotFound) as err:
        materia_call(runtime, "s1", "revive", {})
    assert err.value.message.startswith("No failed pi-materia casts exhausted by same-socket recovery are available "
                                        "to revive. Use ")
    assert err.value.message.endswith(" recast [cast-id] for general failed or aborted casts.")


@pytest.mark.timeout(30)
def test_status_of_a_paused_cast_says_it_waits_for_refinement_and_how_to_finalize(runtime, project) -> None:
    """pi-materia's status widget for a paused multi-turn socket reads "› waiting for refinement;
    /materia continue to finalize" (castor: "paused for refinement: run … to finalize")."""
    from castor.actors.materia.api import materia_call

    _open_session(runtime, "s1", project, ["a draft"])
    started = materia_call(runtime, "s1", "start", {"request": "plan", "loadout": "plan"})
    _wait_status(runtime, "s1", started["cast_id"], ("awaiting_refinement",))
    text = materia_call(runtime, "s1", "status", {})["text"]
    assert "› waiting for refinement; castor continue " in text and " to finalize" in text, text
    materia_call(runtime, "s1", "abort", {})


@pytest.mark.timeout(30)
def test_loadout_set_says_which_loadout_and_file_as_pi_materia(runtime, project) -> None:
    """pi-materia: "pi-materia active loadout set to <name> (<file written>)" (castor: "Active loadout: …")."""
    from castor.actors.materia.api import materia_call

    _open_session(runtime, "s1", project, ["unused"])
    chosen = materia_call(runtime, "s1", "set_loadout", {"name": "plan"})
    written = project / ".pi" / "pi-materia.json"
    assert chosen["text"].startswith(f"pi-materia active loadout set to plan ({written})\n"), chosen["text"]
    assert json.loads(written.read_text()) == {"activeLoadout": "plan"}


@pytest.mark.timeout(30)
def test_cast_start_text_says_where_the_artifacts_are_and_which_config_and_entry(runtime, project) -> None:
    """pi-materia tells the user at the start: "pi-materia cast started. Artifacts: <runDir>", the
    config source ("pi-materia config: <source>") and the entry ("pi-materia grid entry: <id>").
    castor said only "pi-materia cast <id> started (<loadout>).", so none of the three was shown."""
    from castor.actors.materia.api import materia_call

    _open_session(runtime, "s1", project, ["done"])
    started = materia_call(runtime, "s1", "start", {"request": "hi", "loadout": "hello"})
    text = started["text"]
    assert text.startswith(f"pi-materia cast started: {started['cast_id']} (hello). Artifacts: {started['run_dir']}")
    assert "\npi-materia config: " in text and "\npi-materia grid entry: Socket-1" in text
    _wait_status(runtime, "s1", started["cast_id"], ("complete",))


@pytest.mark.timeout(40)
def test_session_start_names_a_cast_still_going_as_restored(project) -> None:
    """pi-materia, on ``session_start`` with an active cast in the session, restores its footer
    label and tells "pi-materia cast <id> restored in <phase>. Use /materia status for details."
    (nothing is resumed). castor said nothing: a Pi restarted mid-cast showed no sign of it."""
    from castor.actors.materia.api import materia_call

    first = _runtime()
    try:
        scripted = _open_session(first, "s1", project, [{"text": "slow", "delay_ms": 20000}])
        assert first.dispatch_event("s1", "session_start", {"reason": "startup"}) == {}, "no cast yet"
        started = materia_call(first, "s1", "start", {"request": "hi", "loadout": "hello"})
        wait_for(lambda: scripted.in_flight(), what="the turn in flight")
    finally:
        first.shutdown(10.0)  # the cast stays active on disk, its runtime gone
    second = _runtime()
    try:
        _open_session(second, "s2", project, ["done"])
        answer = second.dispatch_event("s2", "session_start", {"reason": "resume"})
        cast_id = started["cast_id"]
        # (this in-process session names the CLI's command; a harness over the endpoint, /materia status)
        assert answer["notify"] == {"message": f"pi-materia cast {cast_id} restored in Socket-1. "
                                               "Use castor status for details.", "level": "info"}
        assert answer["status"]["key"] == "materia" and "Socket-1" in answer["status"]["text"]
        assert materia_call(second, "s2", "status", {"cast_id": cast_id})["status"] == "orphaned", "nothing resumed"
        materia_call(second, "s2", "abort", {"cast_id": cast_id})
        assert second.dispatch_event("s2", "session_start", {"reason": "resume"}) == {}, "an ended cast is not named"
    finally:
        second.shutdown(10.0)


@pytest.mark.timeout(40)
def test_the_footer_names_the_work_item_and_a_pause_for_refinement(runtime, project) -> None:
    """pi-materia's footer label is the materia with the current work item, and "<materia>:refine"
    while a multi-turn socket waits for the user. castor's showed neither: the item was missing and
    a paused cast kept the label of the turn that had ended."""
    from castor.actors.materia.api import materia_call
    from castor.adapters.agents.scripted import ScriptedAgent, parse_script
    from castor.adapters.stderr_ui import StderrUi
    from castor.runtime import HarnessLink, SessionInfo

    class Footer(StderrUi):
        def __init__(self) -> None:
            super().__init__(printer=lambda _line: None)
            self.history: list[str | None] = []

        def set_status(self, key: str, text: str | None) -> None:
            super().set_status(key, text)
            self.history.append(text)

    sockets = {
        "Socket-1": {"type": "utility", "utility": "echo", "parse": "json", "assign": {"items": "$.items"},
                     "params": {"output": {"items": [{"id": "a", "title": "Alpha"}]}}, "edges": [{"to": "Socket-2"}]},
        "Socket-2": {"type": "agent", "materia": "greeter", "foreach": {"items": "state.items"},
                     "edges": [{"to": "Socket-3"}]},
        "Socket-3": {"type": "agent", "materia": "interactivePlanner"},
    }
    (project / ".pi").mkdir()
    (project / ".pi" / "pi-materia.json").write_text(json.dumps({"loadouts": {"f": {"entry": "Socket-1",
                                                                                   "sockets": sockets}}}))
    footer = Footer()
    runtime.open_session(SessionInfo(session_id="s1", cwd=str(project), trusted=True),
                         HarnessLink(agent=ScriptedAgent(parse_script(["built", "a draft"])), session_log=None,
                                     ui=footer))
    started = materia_call(runtime, "s1", "start", {"request": "go", "loadout": "f"})
    _wait_status(runtime, "s1", started["cast_id"], ("awaiting_refinement",))
    wait_for(lambda: any(t and "refine" in t for t in footer.history), what="the refinement footer")
    assert "materia: greeter (Socket-2) — Alpha" in footer.history, footer.history
    paused = [t for t in footer.history if t and "refine" in t]
    assert paused[-1].startswith("materia: interactivePlanner (Socket-3) — refine; ") and "continue" in paused[-1]
    materia_call(runtime, "s1", "abort", {})


@pytest.mark.timeout(60)
@pytest.mark.parametrize("ending", ["complete", "failed", "aborted"])
@pytest.mark.parametrize("limit", [1, 2])
def test_the_footer_entry_is_pi_materias_materia_and_an_ended_cast_leaves_done_or_failed(project, ending,
                                                                                         limit) -> None:
    """pi-materia keeps one footer entry, ``materia``, and a cast that ends leaves ``done`` or
    ``failed`` there (an abort clears it). castor set ``materia-<id>`` and cleared it at every end.
    A session that may run several casts at once keeps one entry per cast (they would overwrite
    each other's), ended as the shared one is."""
    import sys

    from castor.actors.materia.api import materia_call
    from castor.adapters.agents.scripted import ScriptedAgent, parse_script
    from castor.adapters.stderr_ui import StderrUi
    from castor.runtime import HarnessLink, SessionInfo

    class Footer(StderrUi):
        def __init__(self) -> None:
            super().__init__(printer=lambda _line: None)
            self.history: list[tuple[str, str | None]] = []

        def set_status(self, key: str, text: str | None) -> None:
            super().set_status(key, text)
            self.history.append((key, text))

    code = "import sys; sys.exit(3)" if ending == "failed" else "print('ok')"
    sockets = {"Socket-1": {"type": "agent", "materia": "greeter", "edges": [{"to": "Socket-2"}]},
               "Socket-2": {"type": "utility", "command": [sys.executable, "-c", code]}}
    (project / ".pi").mkdir()
    (project / ".pi" / "pi-materia.json").write_text(json.dumps({"loadouts": {"f": {"entry": "Socket-1",
                                                                                   "sockets": sockets}}}))
    rt = _runtime(max_casts_per_session=limit)
    try:
        footer = Footer()
        script = [{"text": "slow", "delay_ms": 20000}] if ending == "aborted" else ["hi"]
        rt.open_session(SessionInfo(session_id="s1", cwd=str(project), trusted=True),
                        HarnessLink(agent=ScriptedAgent(parse_script(script)), session_log=None, ui=footer))
        cast_id = materia_call(rt, "s1", "start", {"request": "go", "loadout": "f"})["cast_id"]
        key = "materia" if limit == 1 else f"materia-{cast_id}"
        if ending == "aborted":
            wait_for(lambda: footer.history, what="the running turn's footer")
            materia_call(rt, "s1", "abort", {})
        _wait_status(rt, "s1", cast_id, (ending,))
        last = {"complete": "done", "failed": "failed", "aborted": None}[ending]
        wait_for(lambda: footer.history and footer.history[-1] == (key, last), what=f"the footer {last!r}")
        assert {k for k, _ in footer.history} == {key}, footer.history
        assert footer.history[0] == (key, "materia: greeter (Socket-1)"), footer.history
    finally:
        rt.shutdown(10.0)


# =========================================================================== utilities & artifacts


def test_c80_command_stdout_over_1_mib_is_capped_in_the_cast(runtime, project) -> None:
    """End to end through the utility pool: the cast's ``lastOutput`` is the capped stdout."""
    from castor.actors.materia.api import materia_call

    code = "import sys; sys.stdin.read(); sys.stdout.write('o' * (1048576 + 100)); sys.stderr.write('e')"
    loud = {"entry": "Socket-1", "sockets": {"Socket-1": {"type": "utility", "command": [sys.executable, "-c", code]}}}
    (project / ".pi").mkdir()
    (project / ".pi" / "pi-materia.json").write_text(json.dumps({"loadouts": {"loud": loud}}))
    _open_session(runtime, "s1", project, ["unused"])
    started = materia_call(runtime, "s1", "start", {"request": "be loud", "loadout": "loud"})
    view = _wait_status(runtime, "s1", started["cast_id"], ("complete", "failed"))
    assert view["status"] == "complete", view
    run_dir = Path(view["run_dir"])
    state = json.loads((run_dir / "state.json").read_text())["state"]
    assert len(state["last_output"]) == 1_048_576 and set(state["last_output"]) == {"o"}
    meta = json.loads((run_dir / "sockets" / "Socket-1" / "1.command.json").read_text())
    assert (meta["stdoutTruncated"], meta["stderrTruncated"]) == (True, False)
    assert (run_dir / "sockets" / "Socket-1" / "1.md").stat().st_size == 1_048_576


def test_c85_text_socket_prompt_without_loops() -> None:
    d = Driver(resolved(config({"Socket-1": {"type": "agent", "materia": "A"}})))
    prompt = d.pending().prompt
    for fragment in ("<materia-instructions>", "Socket adapter context", "Current workItem JSON: null",
                     "Global guidance JSON: {}"):
        assert fragment in prompt, fragment
    assert "Return only JSON" not in prompt


# =========================================================================== JavaScript's numbers and String()


def test_item_keys_and_artifact_names_are_javascripts_string_of_the_id() -> None:
    """pi-materia is JavaScript: an item key is ``String(id ?? key ?? index)`` of the value
    ``JSON.parse`` made, so ``1.0`` is ``"1"``, ``true`` ``"true"``, an object ``"[object Object]"``
    and an array its items joined by commas. castor wrote ``1.0``, ``True`` and ``{'x': 1}``, so its
    artifact names and ``byTask`` keys differed from pi-materia's for the same reply."""
    d = Driver(resolved(_loop_config([])))
    d.reply('{"workItems": [{"id": 1.0}, {"id": true}, {"id": {"x": 1}}, {"id": [1, null, 2.50]}, {"key": 1e3}]}')
    keys = []
    for _ in range(5):
        keys.append(d.pending().item_key)
        tr = d.reply({"satisfied": True})
        assert tr.effects  # the socket completed
    assert keys == ["1", "true", "[object Object]", "1,,2.5", "1000"]
    outputs = [e.path[-1] for e in d.effects if isinstance(e, WriteArtifact)
               and e.path[:2] == ("sockets", "Socket-2") and e.path[-1].endswith(".md")]
    assert outputs[:2] == ["1-1.md", "2-true.md"], outputs


def test_numbers_in_a_reply_are_read_and_written_as_javascript_holds_them() -> None:
    """``JSON.parse`` has one number type: ``2.0`` is ``2`` and is rendered ``2`` in the next
    prompt and in ``state.data``; integers past 2**53 are the nearest double; 1e999 is null."""
    cfg = config({"Socket-1": {"type": "agent", "materia": "J", "parse": "json",
                               "assign": {"n": "$.n", "big": "$.big", "x": "$.x", "f": "$.f"},
                               "edges": [{"to": "Socket-2"}]},
                  "Socket-2": {"type": "agent", "materia": "P"}})
    cfg["materia"]["P"] = agent(prompt="n={{n}} big={{big}} x={{x}} f={{f}}")
    d = Driver(resolved(cfg))
    d.reply('{"satisfied": true, "n": 2.0, "big": 123456789012345678901, "x": 1e999, "f": 1.5e-7}')
    assert d.state.data["n"] == 2 and isinstance(d.state.data["n"], int)
    assert d.state.data["big"] == 123456789012345680000
    prompt = d.pending().prompt
    assert "n=2 big=123456789012345680000 x= f=1.5e-7" in prompt, prompt


def test_a_turn_without_usage_makes_the_cost_an_estimate() -> None:
    """A cast whose agent reported no usage: its cost kind stays pi-materia's (``actual``), and
    castor's own ``costEstimated`` says the figures are not all billed ones. Such a turn adds no
    (all-zero) turn record: a deliberate difference, docs/materia.md."""
    cfg = config({"Socket-1": {"type": "agent", "materia": "A"}})
    d = Driver(resolved(cfg))
    d.reply("done")
    report = d.state.usage
    assert report.costKind == "actual" and report.costEstimated and not report.turns


def test_a_config_is_read_as_json_parse_reads_it(tmp_path: Path) -> None:
    """NaN is not JSON (it was accepted, then written into input.json and state.json as NaN); a
    number is what JavaScript holds (``maxSocketVisits: 5.0`` is 5 there; castor refused it)."""
    from castor.adapters.materia.config_loader import read_layer

    bad = tmp_path / "nan.json"
    bad.write_text('{"materia": {"U": {"type": "utility", "utility": "echo", "params": {"n": NaN}}}}')
    data, issues = read_layer(bad)
    assert data is None and issues[0].code == "invalid-json" and "NaN" in issues[0].message
    good = tmp_path / "limits.json"
    good.write_text('{"limits": {"maxSocketVisits": 5.0, "maxEdgeTraversals": 2e1}}')
    data, issues = read_layer(good)
    assert not issues and data == {"limits": {"maxSocketVisits": 5, "maxEdgeTraversals": 20}}
    assert isinstance(data["limits"]["maxSocketVisits"], int)
    loaded = resolved(config({"Socket-1": {"type": "agent", "materia": "A"}}, **data))
    assert loaded.limits.max_socket_visits == 5


def test_the_grid_writes_figures_and_flags_as_the_config_does() -> None:
    """It printed Python's text: maxTokens=4000000.0, stopAtLimit=True, multiTurn=False."""
    from castor.domain.materia.grid import render_grid

    cfg = config({"Socket-1": {"type": "agent", "materia": "A"}},
                 budget={"maxTokens": 4000000, "maxCostUsd": 20, "warnAtPercent": 75})
    text = render_grid(resolved(cfg))
    assert "budget: maxTokens=4000000 maxCostUsd=20 warnAt=75% stopAtLimit=true" in text, text
    assert "multiTurn=false" in text and "True" not in text and "False" not in text


# =========================================================================== through the runtime (real actors, files)
#
# The items below had only an engine-level test (the pure ``step`` with scripted outcomes), which
# cannot see what the actors do with its effects: the utility pool's real process, the cast actor's
# refusals, the saved state. Each runs a real cast in a real ``Runtime``.


def _project_loadouts(project: Path, loadouts: dict[str, Any]) -> None:
    (project / ".pi").mkdir(exist_ok=True)
    (project / ".pi" / "pi-materia.json").write_text(json.dumps({"loadouts": loadouts}))


def _saved_state(view: dict[str, Any]) -> dict[str, Any]:
    state: dict[str, Any] = json.loads((Path(view["run_dir"]) / "state.json").read_text())["state"]
    return state


@pytest.mark.timeout(60)
def test_c77_an_echo_utility_cast_completes_with_no_agent_turn(runtime, project) -> None:
    _project_loadouts(project, {"echo": {"entry": "Socket-1", "sockets": {
        "Socket-1": {"type": "utility", "utility": "echo", "params": {"text": "HELLO WORLD"}}}}})
    scripted = _open_session(runtime, "s1", project, ["never asked"])
    from castor.actors.materia.api import materia_call

    started = materia_call(runtime, "s1", "start", {"request": "say it", "loadout": "echo"})
    view = _wait_status(runtime, "s1", started["cast_id"], ("complete", "failed"))
    assert view["status"] == "complete", view
    state = _saved_state(view)
    assert state["phase"] == "complete" and state["last_output"] == "HELLO WORLD"
    assert (Path(view["run_dir"]) / "sockets" / "Socket-1" / "1.md").read_text() == "HELLO WORLD"
    assert scripted.requests() == []  # no agent turn was ever sent


@pytest.mark.timeout(60)
def test_c78_a_command_exiting_7_fails_the_cast_naming_the_code_stderr_and_stdout_artifact(runtime, project) -> None:
    from castor.actors.materia.api import materia_call

    # the stderr text is built at run time, so the command line quoted in the reason cannot hold it
    code = ("import sys; sys.stdin.read(); sys.stdout.write('partial'); "
            "sys.stderr.write('bad' + ' thing\\n'); sys.exit(7)")
    _project_loadouts(project, {"seven": {"entry": "Socket-1", "sockets": {
        "Socket-1": {"type": "utility", "command": [sys.executable, "-c", code], "edges": [{"to": "Socket-2"}]},
        "Socket-2": {"type": "utility", "utility": "echo", "params": {"text": "never"}}}}})
    _open_session(runtime, "s1", project, ["unused"])
    started = materia_call(runtime, "s1", "start", {"request": "fail", "loadout": "seven"})
    view = _wait_status(runtime, "s1", started["cast_id"], ("complete", "failed"))
    assert view["status"] == "failed", view
    reason = view["failed_reason"]
    assert "exited with code 7. stderr: bad thing. stdout: " in reason
    assert "sockets/Socket-1/1.command.stdout.txt" in reason
    run_dir = Path(view["run_dir"])
    assert (run_dir / "sockets" / "Socket-1" / "1.command.stderr.txt").read_text() == "bad thing\n"
    assert (run_dir / "sockets" / "Socket-1" / "1.command.stdout.txt").read_text() == "partial"
    assert "Socket-2" not in _saved_state(view)["visits"]  # routing stopped


@pytest.mark.timeout(60)
def test_c79_a_command_past_its_50ms_timeout_fails_the_cast_saying_so(runtime, project) -> None:
    from castor.actors.materia.api import materia_call

    _project_loadouts(project, {"slow": {"entry": "Socket-1", "sockets": {
        "Socket-1": {"type": "utility", "command": [sys.executable, "-c", "import time; time.sleep(5)"],
                     "timeoutMs": 50}}}})
    _open_session(runtime, "s1", project, ["unused"])
    started = materia_call(runtime, "s1", "start", {"request": "wait", "loadout": "slow"})
    view = _wait_status(runtime, "s1", started["cast_id"], ("complete", "failed"))
    assert view["status"] == "failed", view
    assert "timed out" in view["failed_reason"] and "50ms" in view["failed_reason"]


@pytest.mark.timeout(60)
def test_c81_a_command_reads_the_utility_input_on_stdin_with_the_process_cwd(runtime, project) -> None:
    from castor.actors.materia.api import materia_call

    code = "import sys; sys.stdout.write(sys.stdin.read())"
    _project_loadouts(project, {"cat": {"entry": "Socket-1", "sockets": {
        "Socket-1": {"type": "utility", "command": [sys.executable, "-c", code], "params": {"p": 1}}}}})
    _open_session(runtime, "s1", project, ["unused"])
    started = materia_call(runtime, "s1", "start", {"request": "the request", "loadout": "cat"})
    view = _wait_status(runtime, "s1", started["cast_id"], ("complete", "failed"))
    assert view["status"] == "complete", view
    stdin = json.loads(_saved_state(view)["last_output"])
    assert stdin["cwd"] == str(project) and stdin["runDir"] == view["run_dir"]
    assert (stdin["request"], stdin["castId"], stdin["socketId"]) == ("the request", started["cast_id"], "Socket-1")
    assert (stdin["params"], stdin["state"]) == ({"p": 1}, {})
    assert (stdin["item"], stdin["itemKey"], stdin["itemLabel"]) == (None, None, None)


@pytest.mark.timeout(60)
def test_c53_continue_while_the_agent_is_answering_is_refused(runtime, project) -> None:
    from castor.actors.materia.api import materia_call
    from castor.messages.errors import CastorError

    scripted = _open_session(runtime, "s1", project, [{"text": "slow draft", "delay_ms": 5000}])
    materia_call(runtime, "s1", "start", {"request": "plan it", "loadout": "plan"})
    wait_for(lambda: scripted.in_flight(), what="the refinement turn in flight")
    with pytest.raises(CastorError) as err:
        materia_call(runtime, "s1", "continue", {})
    assert "already awaiting a Pi agent response" in err.value.message
    materia_call(runtime, "s1", "abort", {})


@pytest.mark.timeout(60)
def test_c71_recast_of_a_complete_cast_and_of_a_running_cast_is_refused(runtime, project) -> None:
    from castor.actors.materia.api import materia_call
    from castor.messages.errors import CastorError

    _open_session(runtime, "s1", project, ["done"])
    done = materia_call(runtime, "s1", "start", {"request": "one", "loadout": "hello"})
    _wait_status(runtime, "s1", done["cast_id"], ("complete",))
    with pytest.raises(CastorError) as err:
        materia_call(runtime, "s1", "recast", {"cast_id": done["cast_id"]})
    assert "is complete and cannot be recast" in err.value.message
    scripted = _open_session(runtime, "s2", project, [{"text": "slow", "delay_ms": 5000}])  # the answer per cast
    running = materia_call(runtime, "s2", "start", {"request": "two", "loadout": "hello"})
    wait_for(lambda: scripted.in_flight(), what="the turn in flight")
    with pytest.raises(CastorError) as err:
        materia_call(runtime, "s2", "recast", {"cast_id": running["cast_id"]})
    assert "already running" in err.value.message
    materia_call(runtime, "s2", "abort", {})


@pytest.mark.timeout(60)
def test_c67_revive_of_an_ordinary_failed_cast_says_it_is_not_revivable(runtime, project) -> None:
    from castor.actors.materia.api import materia_call
    from castor.messages.errors import CastorError

    _project_loadouts(project, {"failing": {"entry": "Socket-1", "sockets": {
        "Socket-1": {"type": "utility", "command": [sys.executable, "-c", "raise SystemExit(3)"]}}}})
    _open_session(runtime, "s1", project, ["unused"])
    failed = materia_call(runtime, "s1", "start", {"request": "fail", "loadout": "failing"})
    _wait_status(runtime, "s1", failed["cast_id"], ("failed",))
    with pytest.raises(CastorError) as err:
        materia_call(runtime, "s1", "revive", {"cast_id": failed["cast_id"]})
    # pi-materia's "Use /materia recast"; castor names the command of the surface the user is on
    # ("/materia recast ID" in a harness session, this standalone runtime's "castor recast ID").
    assert "not revivable" in err.value.message
    assert f"Use castor recast {failed['cast_id']} instead." in err.value.message
    assert err.value.data["reason"] == "missing-metadata"
    assert materia_call(runtime, "s1", "status", {"cast_id": failed["cast_id"]})["status"] == "failed"


@pytest.mark.timeout(60)
def test_c29_c47_a_reply_without_satisfied_or_json_fails_the_cast_with_pi_materias_message(runtime, project) -> None:
    from castor.actors.materia.api import materia_call

    _project_loadouts(project, {"judge": {"entry": "Socket-1", "sockets": {
        "Socket-1": {"type": "agent", "materia": "Auto-Eval", "parse": "json",
                     "edges": [{"when": "satisfied", "to": "Socket-2"}, {"when": "not_satisfied", "to": "Socket-2"}]},
        "Socket-2": {"type": "utility", "utility": "echo", "params": {"text": "never"}}}}})
    _open_session(runtime, "s1", project, ['{"passed": true}'])
    first = materia_call(runtime, "s1", "start", {"request": "judge", "loadout": "judge"})
    view = _wait_status(runtime, "s1", first["cast_id"], ("complete", "failed"))
    assert view["status"] == "failed", view
    assert 'must include reserved boolean field "satisfied"' in view["failed_reason"]
    assert 'Legacy field "passed" is not canonical' in view["failed_reason"]
    _open_session(runtime, "s2", project, ["Here it is: not json"])  # a script's answers are per cast
    second = materia_call(runtime, "s2", "start", {"request": "judge", "loadout": "judge"})
    view = _wait_status(runtime, "s2", second["cast_id"], ("complete", "failed"))
    assert view["status"] == "failed" and 'Invalid JSON output for socket "Socket-1"' in view["failed_reason"], view


# =========================================================================== pi-materia's own loadouts, by the CLI
#
# castor ships pi-materia's bundled loadouts under their own names (Full-Auto, Planning-Consult,
# Hojo-Consult), so the items that name them run on them: through ``python -m castor`` in a fresh
# project, with pi-materia's ``default.json`` as the project config where the item's GIVEN has one.


def _fixture_cli() -> Any:
    from tests.conformance import test_pi_materia_fixtures as cli

    return cli


def test_c3_a_layers_null_deletes_its_loadout_but_full_auto_survives_from_the_default(tmp_path: Path) -> None:
    from castor.adapters.materia import config_loader

    profile = tmp_path / "profile"
    profile.mkdir()
    (profile / "materia.json").write_text(json.dumps({"loadouts": {"Full-Auto": None, "Mine": {
        "entry": "Socket-1", "sockets": {"Socket-1": {"type": "agent", "materia": "Build"}}}}}))
    project = tmp_path / "project"
    (project / ".pi").mkdir(parents=True)
    (project / ".pi" / "pi-materia.json").write_text(json.dumps({"loadouts": {"Mine": None}}))
    env = {"PI_MATERIA_PROFILE_DIR": str(profile)}
    loaded = config_loader.load(project, env=env)
    assert "Mine" not in loaded.merged["loadouts"]
    assert loaded.provenance.loadouts["Full-Auto"] == DEFAULT_LABEL
    assert config_loader.load_resolved(project, loadout="Full-Auto", env=env).pipeline.loadout_name == "Full-Auto"


@pytest.mark.timeout(120)
def test_c73_castor_loadout_planning_consult_writes_exactly_the_active_loadout(tmp_path: Path) -> None:
    cli = _fixture_cli()
    project = tmp_path / "project"
    project.mkdir()
    result = cli.castor(tmp_path, "loadout", "Planning-Consult", cwd=project)
    assert result.returncode == 0, result.stderr
    assert json.loads((project / ".pi" / "pi-materia.json").read_text()) == {"activeLoadout": "Planning-Consult"}
    assert sorted(p.name for p in (project / ".pi").iterdir()) == ["pi-materia.json"]


@pytest.mark.timeout(120)
def test_c74_an_unknown_loadout_is_refused_listing_the_names_and_writes_nothing(tmp_path: Path) -> None:
    cli = _fixture_cli()
    project = tmp_path / "project"
    project.mkdir()
    result = cli.castor(tmp_path, "loadout", "Nope", cwd=project)
    assert result.returncode == 1 and "Unknown Materia loadout" in result.stderr
    for name in ("Full-Auto", "Planning-Consult", "Hojo-Consult"):
        assert name in result.stderr, result.stderr
    assert not (project / ".pi").exists()


def _full_auto_loop_run(tmp_path: Path, maintain: list[bool], items: list[str]) -> tuple[dict[str, Any], Path]:
    cli = _fixture_cli()
    project = cli.project_with(tmp_path, "default.json")
    work = [{**cli.WORK_ITEM, "id": i, "title": i.title()} for i in items]
    script = cli.script_for("default.json", "Full-Auto", work_items=work)
    script["Socket-6"] = [json.dumps({"summary": "maintained", "satisfied": ok, "feedback": "" if ok else "again",
                                      "missing": []}) for ok in maintain]
    result, run_dir = cli.run_cast(tmp_path, project, "Full-Auto", script)
    assert result.returncode == 0, result.stderr
    state: dict[str, Any] = json.loads((run_dir / "state.json").read_text())["state"]
    return state, run_dir


@pytest.mark.timeout(240)
def test_c39_full_auto_with_one_satisfied_item_builds_and_maintains_once(tmp_path: Path) -> None:
    state, run_dir = _full_auto_loop_run(tmp_path, [True], ["alpha"])
    assert state["phase"] == "complete"
    assert (state["visits"]["Socket-4"], state["visits"]["Socket-6"]) == (1, 1)  # Build, Maintain
    assert "Socket-6->Socket-4" not in state["edge_traversals"]  # Maintain->Build never taken
    assert state["visits"]["Socket-7"] == 1  # exhausted: the loop's always exit to Narrate


@pytest.mark.timeout(240)
def test_c40_full_auto_reworks_alpha_once_then_finishes_both_items(tmp_path: Path) -> None:
    state, run_dir = _full_auto_loop_run(tmp_path, [False, True, True], ["alpha", "beta"])
    assert state["phase"] == "complete"
    assert (state["visits"]["Socket-4"], state["visits"]["Socket-6"]) == (3, 3)
    assert state["edge_traversals"]["Socket-6->Socket-4"] == 2 and state["cursors"]["workItemIndex"] == 2
    builds = sorted(p.name for p in (run_dir / "sockets" / "Socket-4").iterdir() if p.suffix == ".md")
    assert builds == ["1-alpha.md", "2-alpha.md", "3-beta.md"]  # the retry is visit 2 of item alpha


# =========================================================================== agent turns, through the runtime


def _events_of(view: dict[str, Any]) -> list[dict[str, Any]]:
    lines = (Path(view["run_dir"]) / "events.jsonl").read_text().splitlines()
    return [json.loads(line) for line in lines if line.strip()]


@pytest.mark.timeout(60)
def test_c46_a_json_reply_moves_the_cast_to_the_text_socket_which_is_sent_its_own_prompt(runtime, project) -> None:
    from castor.actors.materia.api import materia_call

    _project_loadouts(project, {"two": {"entry": "Socket-1", "sockets": {
        "Socket-1": {"type": "agent", "materia": "Auto-Plan", "parse": "json", "edges": [{"to": "Socket-2"}]},
        "Socket-2": {"type": "agent", "materia": "Build"}}}})
    scripted = _open_session(runtime, "s1", project, {"Socket-1": ['{"summary": "planned"}'],
                                                      "Socket-2": [{"text": "built", "delay_ms": 5000}]})
    started = materia_call(runtime, "s1", "start", {"request": "go", "loadout": "two"})
    wait_for(lambda: len(scripted.requests()) == 2 and scripted.in_flight(), what="the second prompt in flight")
    view = materia_call(runtime, "s1", "status", {"cast_id": started["cast_id"]})
    assert view["status"] == "active" and view["current_socket"] == "Socket-2", view
    state = _saved_state(view)
    assert state["awaiting_response"] is True and state["phase"] == "Socket-2"
    assert [r.socket_id for r in scripted.requests()] == ["Socket-1", "Socket-2"]  # 2 prompts in all
    text_prompt = scripted.requests()[1].prompt  # 85: a text socket in no loop
    for fragment in ("<materia-instructions>", "Socket adapter context", "Current workItem JSON: null",
                     "Global guidance JSON: {}"):
        assert fragment in text_prompt, fragment
    assert "Return only JSON" not in text_prompt
    materia_call(runtime, "s1", "abort", {})


@pytest.mark.timeout(60)
def test_c57_a_websocket_error_keeps_the_cast_awaiting_with_a_warning_and_nothing_resent(runtime, project) -> None:
    """No agent of castor's retries a dropped stream (Pi does, and its next end completes the turn):
    the cast stays active and awaiting the same turn, warned, nothing resent, no ``cast_end``."""
    from castor.actors.materia.api import materia_call

    scripted = _open_session(runtime, "s1", project, [{"error": "WebSocket error"}])
    started = materia_call(runtime, "s1", "start", {"request": "hi", "loadout": "hello"})

    def warned() -> dict[str, Any] | None:
        view = materia_call(runtime, "s1", "status", {"cast_id": started["cast_id"]})
        kinds = [e["type"] for e in _events_of(view)]
        return view if "transient_transport_turn_failure" in kinds else None

    view = wait_for(warned, what="the transient transport warning")
    events = _events_of(view)
    [warning] = [e["data"] for e in events if e["type"] == "transient_transport_turn_failure"]
    assert warning["warning"] is True and "WebSocket error" in warning["error"]
    assert not any(e["type"] in ("cast_end", "same_socket_recovery_start") for e in events)
    state = _saved_state(view)
    assert state["active"] is True and state["awaiting_response"] is True
    assert state["visits"] == {"Socket-1": 1} and len(scripted.requests()) == 1
    assert state["last_message"].startswith("Transient transport failure while awaiting")
    materia_call(runtime, "s1", "abort", {})


@pytest.mark.timeout(60)
@pytest.mark.parametrize("error", ["provider auth failed", "invalid_request_error: bad field"])
def test_c59_a_non_recoverable_turn_error_fails_the_cast_without_compaction(runtime, project, error: str) -> None:
    from castor.actors.materia.api import materia_call

    scripted = _open_session(runtime, "s1", project, [{"error": error}, "never"])
    started = materia_call(runtime, "s1", "start", {"request": "hi", "loadout": "hello"})
    view = _wait_status(runtime, "s1", started["cast_id"], ("failed", "complete"))
    assert view["status"] == "failed"
    assert "Non-recoverable turn failure" in view["failed_reason"] and error in view["failed_reason"]
    kinds = [e["type"] for e in _events_of(view)]
    assert "same_socket_recovery_start" not in kinds and not any("compaction" in k for k in kinds)
    assert len(scripted.requests()) == 1


@pytest.mark.timeout(60)
def test_c42_usage_json_counts_each_attempt_of_each_item(runtime, project) -> None:
    from castor.actors.materia.api import materia_call

    _project_loadouts(project, {"attempts": {"entry": "Socket-1", "sockets": {
        "Socket-1": {"type": "agent", "materia": "Auto-Plan", "parse": "json",
                     "assign": {"list": "$.list"}, "edges": [{"to": "Socket-2"}]},
        "Socket-2": {"type": "agent", "materia": "Auto-Eval", "parse": "json",
                     "foreach": {"items": "state.list", "cursor": "i"},
                     "advance": {"cursor": "i", "items": "state.list", "when": "$.done == true", "done": "Socket-3"},
                     "edges": [{"when": "always", "to": "Socket-2"}]},
        "Socket-3": {"type": "agent", "materia": "Narrate"}}}})
    usage = {"input_tokens": 1, "output_tokens": 1}
    plan = json.dumps({"list": [{"id": "a", "title": "Alpha"}, {"id": "b", "title": "Beta"}]})
    _open_session(runtime, "s1", project, {
        "Socket-1": [{"text": plan, "usage": usage}],
        "Socket-2": [{"text": json.dumps({"done": d}), "usage": usage} for d in (False, True, True)],
        "Socket-3": [{"text": "told", "usage": usage}]})
    started = materia_call(runtime, "s1", "start", {"request": "go", "loadout": "attempts"})
    view = _wait_status(runtime, "s1", started["cast_id"], ("complete", "failed"))
    assert view["status"] == "complete", view
    report = json.loads((Path(view["run_dir"]) / "usage.json").read_text())
    turns = [(t["socket"], t.get("taskId"), t["attempt"]) for t in report["turns"]]
    assert turns == [("Socket-1", None, 1), ("Socket-2", "a", 1), ("Socket-2", "a", 2), ("Socket-2", "b", 1),
                     ("Socket-3", None, 1)]
    assert sorted(report["byAttempt"]) == ["a:1", "a:2", "b:1"]


@pytest.mark.timeout(60)
def test_c82_a_cast_writes_its_files_and_one_isolated_context_per_prompt(runtime, project) -> None:
    from castor.actors.materia.api import materia_call

    _project_loadouts(project, {"two": {"entry": "Socket-1", "sockets": {
        "Socket-1": {"type": "agent", "materia": "Build", "edges": [{"to": "Socket-2"}]},
        "Socket-2": {"type": "agent", "materia": "Narrate"}}}})
    _open_session(runtime, "s1", project, {"Socket-1": ["built"], "Socket-2": ["told"]})
    started = materia_call(runtime, "s1", "start", {"request": "go", "loadout": "two"})
    view = _wait_status(runtime, "s1", started["cast_id"], ("complete", "failed"))
    assert view["status"] == "complete", view
    run_dir = Path(view["run_dir"])
    for name in ("config.resolved.json", "manifest.json", "usage.json", "events.jsonl"):
        assert (run_dir / name).is_file(), name
    contexts = sorted((run_dir / "contexts").iterdir())
    assert [p.name for p in contexts] == ["Socket-1-1.md", "Socket-2-1.md"]
    for path in contexts:
        text = path.read_text()
        assert "# Materia Isolated Context" in text and "## Hidden materia prompt" in text, path.name


# =========================================================================== resolve-time checks at cast start


def _resolve_cases() -> list[tuple[str, dict[str, Any], str]]:
    def loop_loadout() -> dict[str, Any]:
        loop = {"sockets": ["Socket-2", "Socket-3"], "consumes": {"from": "Socket-1"}}
        return {"entry": "Socket-1", "loops": {"lp": loop},
                "sockets": {
                    "Socket-1": {"type": "agent", "materia": "Auto-Plan", "edges": [{"to": "Socket-2"}]},
                    "Socket-2": {"type": "agent", "materia": "Build", "edges": [{"to": "Socket-3"}]},
                    "Socket-3": {"type": "agent", "materia": "Build", "edges": [{"to": "Socket-2"}]},
                    "Socket-4": {"type": "agent", "materia": "Build", "edges": [{"to": "Socket-2"}]}}}

    multi = loop_loadout()
    multi["sockets"]["Socket-4"]["multiTurn"] = True
    acyclic = loop_loadout()
    acyclic["sockets"]["Socket-3"]["edges"] = [{"to": "Socket-4"}]
    none = loop_loadout()
    none["sockets"]["Socket-1"]["edges"] = [{"to": "Socket-4"}]
    two = loop_loadout()
    two["sockets"]["Socket-1"]["edges"] = [{"when": "satisfied", "to": "Socket-2"},
                                           {"when": "always", "to": "Socket-3"}]
    return [("c7", multi, "obsolete multiTurn"), ("c19", acyclic, "must contain a directed cycle"),
            ("c20-none", none, "found none"), ("c20-two", two, "found 2")]


@pytest.mark.timeout(60)
@pytest.mark.parametrize(("item", "loadout", "message"), _resolve_cases(), ids=[c[0] for c in _resolve_cases()])
def test_c7_c19_c20_a_loadout_failing_resolution_is_refused_at_cast_start_with_no_run_dir(
        runtime, project, item: str, loadout: dict[str, Any], message: str) -> None:
    """pi-materia's generator materia (Auto-Plan) and Build; the check runs when the cast starts
    (the file loads), and a refused start leaves no cast behind."""
    from castor.actors.materia.api import materia_call
    from castor.messages.errors import CastorError

    _project_loadouts(project, {"bad": loadout})
    scripted = _open_session(runtime, "s1", project, ["never"])
    with pytest.raises(CastorError) as err:
        materia_call(runtime, "s1", "start", {"request": "go", "loadout": "bad"})
    assert message in err.value.message, (item, err.value.message)
    assert not (project / ".pi" / "pi-materia").exists() or not any((project / ".pi" / "pi-materia").iterdir())
    assert scripted.requests() == []


@pytest.mark.timeout(60)
def test_c43_c44_c45_what_an_evaluator_reply_leaves_in_the_state_a_later_command_reads(runtime, project) -> None:
    """Through the engine and the actors: the planner (pi-materia's Auto-Plan, a generator) sets the
    work items and guidance; the evaluator (Auto-Eval) replies one item, new guidance, feedback,
    missing and a private field; a command then reads ``state`` on its stdin."""
    from castor.actors.materia.api import materia_call

    _project_loadouts(project, {"eval": {"entry": "Socket-1", "sockets": {
        "Socket-1": {"type": "agent", "materia": "Auto-Plan", "parse": "json", "edges": [{"to": "Socket-2"}]},
        "Socket-2": {"type": "agent", "materia": "Auto-Eval", "parse": "json", "edges": [{"to": "Socket-3"}]},
        "Socket-3": {"type": "utility", "command": [sys.executable, "-c", "import sys; print(sys.stdin.read())"]}}}})
    items = [{"id": "a", "title": "A"}, {"id": "b", "title": "B"}]
    plan = {"summary": "planned", "workItems": items, "guidance": {"framework": "keep", "style": "concise"}}
    verdict = {"satisfied": True, "workItems": items[:1], "guidance": {"style": "detailed", "new": 1},
               "feedback": "f", "missing": ["m"], "localDiagnostic": 1}
    _open_session(runtime, "s1", project, {"Socket-1": [json.dumps(plan)], "Socket-2": [json.dumps(verdict)]})
    started = materia_call(runtime, "s1", "start", {"request": "go", "loadout": "eval"})
    view = _wait_status(runtime, "s1", started["cast_id"], ("complete", "failed"))
    assert view["status"] == "complete", view
    data = json.loads(_saved_state(view)["last_output"])["state"]
    assert data["workItems"] == items  # 43: the evaluator's one item does not shrink the list
    assert data["envelope"]["workItems"] == items[:1]
    assert data["guidance"] == {"framework": "keep", "style": "detailed", "new": 1}  # 44: shallow merge
    assert "feedback" not in data and "missing" not in data  # 45
    assert data["envelope"]["feedback"] == "f" and data["envelope"]["missing"] == ["m"]
    assert "localDiagnostic" not in data["envelope"]


def _echo(text: str) -> dict[str, Any]:
    return {"type": "utility", "utility": "echo", "params": {"text": text}}


@pytest.mark.timeout(60)
@pytest.mark.parametrize(("reply", "reached"), [({"satisfied": True}, "Done"), ({"satisfied": False}, "Build"),
                                                ({}, "Fallback")])
def test_c28_the_first_matching_edge_routes_a_running_cast(runtime, project, reply: dict[str, Any],
                                                           reached: str) -> None:
    """In a cast, a JSON socket that routes on ``satisfied`` must be told it (29), so the reply that
    carries no ``satisfied`` is a text socket's: only its ``always`` edge can match."""
    from castor.actors.materia.api import materia_call

    _project_loadouts(project, {"route": {"entry": "Socket-1", "sockets": {
        "Socket-1": {"type": "agent", "materia": "Auto-Eval", "parse": "json" if reply else "text",
                     "edges": [{"when": "satisfied", "to": "Socket-2"}, {"when": "not_satisfied", "to": "Socket-3"},
                               {"when": "always", "to": "Socket-4"}]},
        "Socket-2": _echo("Done"), "Socket-3": _echo("Build"), "Socket-4": _echo("Fallback")}}})
    _open_session(runtime, "s1", project, [json.dumps(reply)])
    started = materia_call(runtime, "s1", "start", {"request": "go", "loadout": "route"})
    view = _wait_status(runtime, "s1", started["cast_id"], ("complete", "failed"))
    state = _saved_state(view)
    assert view["status"] == "complete" and state["last_output"] == reached, view
    assert sum(state["visits"].values()) == 2  # the judge and one target


@pytest.mark.timeout(60)
@pytest.mark.parametrize(("reply", "reached"), [({"satisfied": True}, "S3"), ({"satisfied": False}, "S4"),
                                                ({}, "S5"), ("only-satisfied", "end")])
def test_c35_c36_an_exhausted_loop_member_takes_its_exit_route_by_its_last_reply(runtime, project, reply: Any,
                                                                                 reached: str) -> None:
    from castor.actors.materia.api import materia_call

    exits = [{"id": "x5", "from": "Socket-2", "condition": "always", "targetSocketId": "Socket-5"},
             {"id": "x3", "from": "Socket-2", "condition": "satisfied", "targetSocketId": "Socket-3"},
             {"id": "x4", "from": "Socket-2", "condition": "not_satisfied", "targetSocketId": "Socket-4"}]
    if reply == "only-satisfied":  # 36: only a satisfied route, and the reply is not satisfied
        exits, reply = exits[1:2], {"satisfied": False}
    _project_loadouts(project, {"loop": {"entry": "Socket-1", "loops": {"lp": {
        "sockets": ["Socket-2"], "consumes": {"from": "Socket-1"}, "exits": exits}}, "sockets": {
        "Socket-1": {"type": "agent", "materia": "Auto-Plan", "parse": "json", "edges": [{"to": "Socket-2"}]},
        "Socket-2": {"type": "agent", "materia": "Auto-Eval", "parse": "json",
                     "advance": {"cursor": "workItemIndex", "items": "state.workItems"},
                     "edges": [{"when": "always", "to": "Socket-2"}]},
        "Socket-3": _echo("S3"), "Socket-4": _echo("S4"), "Socket-5": _echo("S5")}}})
    _open_session(runtime, "s1", project, {"Socket-1": [json.dumps({"workItems": [{"id": "only"}]})],
                                           "Socket-2": [json.dumps(reply)]})
    started = materia_call(runtime, "s1", "start", {"request": "go", "loadout": "loop"})
    view = _wait_status(runtime, "s1", started["cast_id"], ("complete", "failed"))
    assert view["status"] == "complete", view
    state = _saved_state(view)
    ran = [s for s in ("Socket-3", "Socket-4", "Socket-5") if s in state["visits"]]
    assert ran == ([] if reached == "end" else [f"Socket-{reached[1]}"]), state["visits"]


@pytest.mark.timeout(60)
def test_c75_ensure_ignored_run_by_two_casts_adds_each_line_once(runtime, project) -> None:
    from castor.actors.materia.api import materia_call

    patterns = [".pi/pi-materia/", "dist/"]
    _project_loadouts(project, {"ignore": {"entry": "Socket-1", "sockets": {
        "Socket-1": {"type": "utility", "utility": "project.ensureIgnored", "parse": "json",
                     "params": {"patterns": patterns}}}}})
    _open_session(runtime, "s1", project, ["unused"])
    results = []
    for _ in range(2):
        started = materia_call(runtime, "s1", "start", {"request": "ignore", "loadout": "ignore"})
        view = _wait_status(runtime, "s1", started["cast_id"], ("complete", "failed"))
        assert view["status"] == "complete", view
        results.append(json.loads(_saved_state(view)["last_output"]))
    assert results[0]["added"] == patterns and results[1]["added"] == [] and results[1]["unchanged"] == patterns
    lines = (project / ".gitignore").read_text().splitlines()
    assert [line for line in lines if line in patterns] == patterns


@pytest.mark.timeout(60)
def test_c76_vcs_detect_in_a_cast_finds_the_jj_marker(runtime, project) -> None:
    from castor.actors.materia.api import materia_call

    (project / ".jj").mkdir()
    _project_loadouts(project, {"vcs": {"entry": "Socket-1", "sockets": {
        "Socket-1": {"type": "utility", "utility": "vcs.detect", "parse": "json"}}}})
    _open_session(runtime, "s1", project, ["unused"])
    started = materia_call(runtime, "s1", "start", {"request": "detect", "loadout": "vcs"})
    view = _wait_status(runtime, "s1", started["cast_id"], ("complete", "failed"))
    assert view["status"] == "complete", view
    found = json.loads(_saved_state(view)["last_output"])
    assert found["kind"] == "jj" and found["root"] == str(project)
    assert isinstance(found["available"]["jj"], bool) and isinstance(found["available"]["git"], bool)


@pytest.mark.timeout(60)
def test_c48_c50_c51_a_multi_turn_socket_pauses_on_any_reply_and_continue_finalizes_it(runtime, project) -> None:
    """pi-materia's Interactive-Plan (multi-turn) through the actors: even valid JSON pauses the
    socket with nothing taken from it; ``continue`` sends the finalization prompt; its JSON reply
    completes the socket as a finalized output and the cast moves on."""
    from castor.actors.materia.api import materia_call

    _project_loadouts(project, {"consult": {"entry": "Socket-1", "sockets": {
        "Socket-1": {"type": "agent", "materia": "Interactive-Plan", "parse": "json",
                     "assign": {"plan": "$.summary"}, "edges": [{"to": "Socket-2"}]},
        "Socket-2": _echo("after the plan")}}})
    draft = json.dumps({"summary": "draft", "workItems": [{"id": "a"}]})
    final = json.dumps({"summary": "final plan", "workItems": [{"id": "a"}]})
    scripted = _open_session(runtime, "s1", project, {"Socket-1": [draft, {"text": final, "delay_ms": 1500}]})
    started = materia_call(runtime, "s1", "start", {"request": "plan", "loadout": "consult"})
    paused = _wait_status(runtime, "s1", started["cast_id"], ("awaiting_refinement", "complete", "failed"))
    assert paused["status"] == "awaiting_refinement", paused
    state = _saved_state(paused)
    assert state["socket_state"] == "awaiting_user_refinement" and state["awaiting_response"] is False
    assert state.get("last_json") is None and "plan" not in state["data"]  # 48: nothing taken from the draft
    assert list(state["multi_turn_refinements"].values()) == [1]
    assert not (Path(paused["run_dir"]) / "sockets" / "Socket-1" / "1.md").exists()

    materia_call(runtime, "s1", "continue", {})
    wait_for(lambda: len(scripted.requests()) == 2 and scripted.in_flight(), what="the finalization turn")
    finalizing = _saved_state(materia_call(runtime, "s1", "status", {"cast_id": started["cast_id"]}))
    assert finalizing["awaiting_response"] is True and finalizing["multi_turn_finalizing"] is True  # 50
    prompt = scripted.requests()[-1].prompt
    assert "Command-triggered finalization" in prompt and "Return only JSON" in prompt

    view = _wait_status(runtime, "s1", started["cast_id"], ("complete", "failed"))
    assert view["status"] == "complete", view
    done = _saved_state(view)
    assert done["data"]["plan"] == "final plan" and done["visits"].get("Socket-2") == 1
    run_dir = Path(view["run_dir"])
    assert json.loads((run_dir / "sockets" / "Socket-1" / "1.md").read_text())["summary"] == "final plan"
    manifest = json.loads((run_dir / "manifest.json").read_text())["entries"]
    [output] = [e for e in manifest if e.get("kind") == "socket_output" and e.get("socket") == "Socket-1"]
    assert output["artifact"] == "sockets/Socket-1/1.md" and output["finalized"] is True
    assert output["refinementTurn"] == 1
    [complete] = [e["data"] for e in _events_of(view)
                  if e["type"] == "socket_complete" and e["data"]["socket"] == "Socket-1"]
    assert complete["finalizedRefinement"] is True


@pytest.mark.timeout(60)
def test_c54_c55_c56_c65_c66_context_window_recovery_exhaustion_and_revive_in_a_cast(runtime, project) -> None:
    """A turn that fails "context window exceeded" with no assistant reply (56) is compacted and
    retried once on the same visit (54); the second such failure exhausts the recovery (55);
    revive adds the original allowance (65), logs ``cast_revive`` before ``cast_recast`` and clears
    the exhaustion (66); the third failure is then retried and the fourth answer completes."""
    from castor.actors.materia.api import materia_call

    overflow = {"error": "context window exceeded"}
    scripted = _open_session(runtime, "s1", project, [overflow, overflow, overflow, "fits now"])
    started = materia_call(runtime, "s1", "start", {"request": "big", "loadout": "hello"})
    failed = _wait_status(runtime, "s1", started["cast_id"], ("failed", "complete"))
    assert failed["status"] == "failed" and failed["failed_reason"].startswith("Same-socket recovery exhausted")
    state = _saved_state(failed)
    exhaustion = state["recovery_exhaustion"]
    assert {k: exhaustion[k] for k in ("attempts", "original_max_attempts", "effective_max_attempts",
                                       "revive_count")} == {"attempts": 1, "original_max_attempts": 1,
                                                            "effective_max_attempts": 1, "revive_count": 0}
    assert exhaustion["failed_reason"] == failed["failed_reason"] and state["visits"] == {"Socket-1": 1}
    events = _events_of(failed)
    types = [e["type"] for e in events]
    assert types.count("socket_start") == 1 and types.count("same_socket_recovery_action_complete") == 1
    [start] = [e["data"] for e in events if e["type"] == "same_socket_recovery_start"]
    assert (start["mode"], start["reason"]) == ("normal", "context_window")
    assert "same_socket_recovery_retry" in types and len(scripted.requests()) == 2

    materia_call(runtime, "s1", "revive", {"cast_id": started["cast_id"]})
    view = _wait_status(runtime, "s1", started["cast_id"], ("complete", "failed"))
    assert view["status"] == "complete", view
    types = [e["type"] for e in _events_of(view)]
    assert types.index("cast_revive") == types.index("cast_recast") - 1
    done = _saved_state(view)
    [allowance] = done["recovery_allowances"].values()
    assert (allowance["effective_max_attempts"], allowance["revive_count"]) == (2, 1)
    assert done["recovery_exhaustion"] is None and done["visits"] == {"Socket-1": 1}
    assert len(scripted.requests()) == 4


@pytest.mark.timeout(60)
@pytest.mark.parametrize("in_loop", [False, True])
def test_c37_a_legacy_advance_done_is_followed_only_outside_a_loop(runtime, project, in_loop: bool) -> None:
    """Outside a loop the exhausted socket goes to its ``advance.done`` (Socket-3). In a loop, the
    loop's own exit route from it wins (Socket-4): the legacy ``done`` is not read there. (A loaded
    config cannot hold the item's "loop with no exits": loading mirrors a member's socket-valued
    ``advance.done`` into an exit route, pi-materia's legacy shim; that half is the resolver's, TR.)"""
    from castor.actors.materia.api import materia_call

    loadout: dict[str, Any] = {"entry": "Socket-1", "sockets": {
        "Socket-1": {"type": "agent", "materia": "Auto-Plan", "parse": "json", "assign": {"workItems": "$.workItems"},
                     "edges": [{"to": "Socket-2"}]},
        "Socket-2": {"type": "agent", "materia": "Build",
                     "foreach": {"items": "state.workItems", "cursor": "workItemIndex"},
                     "advance": {"cursor": "workItemIndex", "items": "state.workItems", "done": "Socket-3"},
                     "edges": [{"to": "Socket-2"}]},
        "Socket-3": _echo("legacy done"), "Socket-4": _echo("loop exit")}}
    if in_loop:
        loadout["loops"] = {"lp": {"sockets": ["Socket-2"], "consumes": {"from": "Socket-1"}, "exits": [
            {"id": "out", "from": "Socket-2", "condition": "always", "targetSocketId": "Socket-4"}]}}
        del loadout["sockets"]["Socket-2"]["foreach"]
    _project_loadouts(project, {"legacy": loadout})
    _open_session(runtime, "s1", project, {"Socket-1": [json.dumps({"workItems": [{"id": "a"}]})],
                                           "Socket-2": ["built a"]})
    started = materia_call(runtime, "s1", "start", {"request": "go", "loadout": "legacy"})
    view = _wait_status(runtime, "s1", started["cast_id"], ("complete", "failed"))
    assert view["status"] == "complete", view
    visits = _saved_state(view)["visits"]
    assert visits["Socket-2"] == 1, visits
    assert [s for s in ("Socket-3", "Socket-4") if s in visits] == (["Socket-4"] if in_loop else ["Socket-3"])


@pytest.mark.timeout(60)
def test_c64_a_context_window_retry_inside_a_loop_keeps_the_item_and_its_counts(runtime, project) -> None:
    from castor.actors.materia.api import materia_call

    _project_loadouts(project, {"loop": {"entry": "Socket-1", "loops": {"lp": {
        "sockets": ["Socket-2"], "consumes": {"from": "Socket-1"}}}, "sockets": {
        "Socket-1": {"type": "agent", "materia": "Auto-Plan", "parse": "json", "edges": [{"to": "Socket-2"}]},
        "Socket-2": {"type": "agent", "materia": "Build",
                     "advance": {"cursor": "workItemIndex", "items": "state.workItems"},
                     "edges": [{"to": "Socket-2"}]}}}})
    scripted = _open_session(runtime, "s1", project, {
        "Socket-1": [json.dumps({"workItems": [{"id": "a"}, {"id": "b"}]})],
        "Socket-2": [{"item": "a", "error": "context window exceeded"}, "built a", "built b"]})
    started = materia_call(runtime, "s1", "start", {"request": "go", "loadout": "loop"})
    view = _wait_status(runtime, "s1", started["cast_id"], ("complete", "failed"))
    assert view["status"] == "complete", view
    state = _saved_state(view)
    builds = [r for r in scripted.requests() if r.socket_id == "Socket-2"]
    assert [(r.item_key, r.visit) for r in builds] == [("a", 1), ("a", 1), ("b", 2)]  # the retry: same visit
    assert builds[1].prompt == builds[0].prompt
    assert state["visits"]["Socket-2"] == 2 and state["cursors"]["workItemIndex"] == 2
    attempts = {json.loads(k)[1]: v for k, v in state["task_attempts"].items() if json.loads(k)[0] == "Socket-2"}
    assert attempts == {"a": 1, "b": 1}  # the retry is no new attempt of a
    outputs = sorted(p.name for p in (Path(view["run_dir"]) / "sockets" / "Socket-2").iterdir() if p.suffix == ".md")
    assert outputs == ["1-a.md", "2-b.md"]


@pytest.mark.timeout(240)
def test_c32_full_auto_fails_when_eval_sends_build_back_a_fourth_time(tmp_path: Path) -> None:
    """pi-materia's own Full-Auto caps Eval->Build (Socket-5 -> Socket-4) at ``maxTraversals: 3``:
    a fourth "not satisfied" fails the cast naming the edge and the count."""
    cli = _fixture_cli()
    project = cli.project_with(tmp_path, "default.json")
    script = cli.script_for("default.json", "Full-Auto")
    script["Socket-5"] = [json.dumps({"summary": "no", "satisfied": False, "feedback": "again", "missing": []})] * 5
    result, run_dir = cli.run_cast(tmp_path, project, "Full-Auto", script)
    assert result.returncode != 0
    state = json.loads((run_dir / "state.json").read_text())["state"]
    assert state["phase"] == "failed"
    assert "edge traversal limit exceeded for Socket-5->Socket-4 (4/3)" in state["failed_reason"]
    assert state["visits"]["Socket-4"] == 4 and "Socket-6" not in state["visits"]


@pytest.mark.timeout(240)
def test_c57_the_cli_ends_at_a_websocket_error_and_castor_continue_sends_the_turn_again(tmp_path: Path) -> None:
    """Deliberate difference (transient transport, standalone): nothing retries the dropped turn, so
    ``castor cast`` exits 1 with the cast still active and says how to go on; ``castor continue ID``
    from a new process sends the same turn again and completes the cast."""
    cli = _fixture_cli()
    project = tmp_path / "project"
    project.mkdir()
    (project / "drop.json").write_text(json.dumps([{"error": "WebSocket error"}]))
    (project / "answer.json").write_text(json.dumps(["hello back"]))
    first = cli.castor(tmp_path, "cast", "hi", "--quiet", "--loadout", "hello", "--agent", "script:drop.json",
                       cwd=project)
    [run_dir] = [p for p in (project / ".pi" / "pi-materia").iterdir() if p.is_dir()]
    assert first.returncode == 1 and f"castor continue {run_dir.name}" in first.stderr, first.stderr
    state = json.loads((run_dir / "state.json").read_text())["state"]
    assert state["active"] is True and state["phase"] == "Socket-1"
    again = cli.castor(tmp_path, "continue", run_dir.name, "--agent", "script:answer.json", cwd=project)
    assert again.returncode == 0, again.stderr
    done = json.loads((run_dir / "state.json").read_text())["state"]
    assert done["phase"] == "complete" and done["visits"] == {"Socket-1": 1}
    assert (run_dir / "sockets" / "Socket-1" / "1.md").read_text() == "hello back"


@pytest.mark.timeout(60)
def test_c31_a_text_socket_with_only_guarded_edges_ends_the_cast_there(runtime, project) -> None:
    from castor.actors.materia.api import materia_call

    _project_loadouts(project, {"guarded": {"entry": "Socket-1", "sockets": {
        "Socket-1": {"type": "agent", "materia": "Build", "parse": "text",
                     "edges": [{"when": "satisfied", "to": "Socket-2"}, {"when": "not_satisfied", "to": "Socket-3"}]},
        "Socket-2": _echo("yes"), "Socket-3": _echo("no")}}})
    _open_session(runtime, "s1", project, ['{"satisfied": true}'])  # text: never read for routing
    started = materia_call(runtime, "s1", "start", {"request": "go", "loadout": "guarded"})
    view = _wait_status(runtime, "s1", started["cast_id"], ("complete", "failed"))
    assert view["status"] == "complete", view
    state = _saved_state(view)
    assert state["phase"] == "complete" and state["visits"] == {"Socket-1": 1}

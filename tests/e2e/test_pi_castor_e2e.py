"""Real Pi + extension + the real castor runtime (``castor serve --stdio``).

These are the issue's end-to-end scenarios (issue 5, 6a-e), plus (f) a user-driven refinement
turn (issue 3) and (g) one the user aborts (Esc), which castor withdraws. Each one fails fast (an error
toast from the extension ends the wait) so a broken runtime costs little time.
"""

from __future__ import annotations

import json
import sqlite3
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import psutil
import pytest

from tests.support.waiting import poll_until

from .conftest import read_jsonl, session_entries
from .pi_rpc import REPO, PiRpc

pytestmark = [pytest.mark.pi, pytest.mark.timeout(60)]

ICARUS_DIR = REPO / "examples" / "icarus_reference" / "icarus"

TWO_SOCKETS = {
    "artifactDir": ".pi/pi-materia",
    "activeLoadout": "Two-Step",
    "limits": {"maxSocketVisits": 5, "maxEdgeTraversals": 5},
    "materia": {
        "Planner": {"prompt": "PLANNER-MATERIA: produce a plan for the request as a JSON handoff.", "tools": "none"},
        "Writer": {"prompt": "WRITER-MATERIA: write the result from the plan.", "tools": "none"},
    },
    "loadouts": {"Two-Step": {"entry": "Socket-1", "sockets": {
        "Socket-1": {"type": "agent", "materia": "Planner", "parse": "json", "assign": {"plan": "$.summary"},
                     "edges": [{"when": "always", "to": "Socket-2"}]},
        "Socket-2": {"type": "agent", "materia": "Writer", "parse": "text",
                     "edges": [{"when": "always", "to": "end"}]},
    }}},
}
PLAN = json.dumps({"summary": "PLAN-SUMMARY-42", "workItems": [], "satisfied": True})


def project_with_loadout(tmp_path: Path, config: dict[str, Any] = TWO_SOCKETS) -> Path:
    project = tmp_path / "project"
    (project / ".pi").mkdir(parents=True)
    (project / ".pi" / "pi-materia.json").write_text(json.dumps(config))
    return project


def fail_fast_on_error(pi: PiRpc, start: int) -> None:
    errors = [e for e in pi.ui("notify", start=start) if e.get("notifyType") == "error"]
    if errors:
        raise AssertionError(f"castor reported an error: {errors[-1].get('message')}\n"
                             f"Pi/castor stderr (tail): {pi.stderr()[-4000:]}")


def wait_event(pi: PiRpc, project: Path, pred: Any, *, start: int, what: str, timeout: float = 20.0,
               tolerate_errors: bool = False) -> tuple[Path, list[dict[str, Any]], dict[str, Any]]:
    """Wait until a cast in ``project`` wrote an event matching ``pred``; returns (run dir, its
    events, the newest match). Castor's error toasts end the wait unless ``tolerate_errors``."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not tolerate_errors:
            fail_fast_on_error(pi, start)
        for events_file in (project / ".pi" / "pi-materia").glob("*/events.jsonl"):
            events = read_jsonl(events_file)
            found = [e for e in events if pred(e)]
            if found:
                return events_file.parent, events, found[-1]
        time.sleep(0.05)
    raise AssertionError(f"no {what} within {timeout}s; Pi: {pi.tail()}")


def wait_cast_end(pi: PiRpc, project: Path, *, start: int, timeout: float = 20.0,
                  tolerate_errors: bool = False) -> tuple[Path, list[dict[str, Any]]]:
    """Wait until a cast in ``project`` wrote ``cast_end``; returns (run dir, events)."""
    run_dir, events, _ = wait_event(pi, project, lambda e: e.get("type") == "cast_end", start=start,
                                    what="cast_end", timeout=timeout, tolerate_errors=tolerate_errors)
    return run_dir, events


def castor_process(pi: PiRpc) -> psutil.Process:
    found = [p for p in psutil.Process(pi.proc.pid).children(recursive=True)
             if any("castor" in part for part in p.cmdline()) and "icarus" not in " ".join(p.cmdline())]
    assert found, "no castor runtime under Pi"
    return found[0]


def icarus_settings(tmp_path: Path, **extra: Any) -> dict[str, Any]:
    return {"defaultProjectTrust": "always", "piIcarusHook": {
        "icarusDir": str(ICARUS_DIR), "python": sys.executable, "fabricDir": str(tmp_path / "fabric"),
        "classifier": "fake/fake-model", "classifierTimeoutMs": 3000, "contextDisplay": False, **extra}}


def seed_fabric(tmp_path: Path, *entries: tuple[str, str]) -> None:
    """Write Fabric entries through the reference backend's own storage code."""
    code = ("import sys; sys.path.insert(0, sys.argv[1]); from icarus import state\n"
            "for s, c in zip(sys.argv[2::2], sys.argv[3::2]): state.write_entry(summary=s, content=c)")
    args = [a for pair in entries for a in pair]
    subprocess.run([sys.executable, "-c", code, str(ICARUS_DIR.parent), *args], check=True, timeout=30,
                   env={"FABRIC_DIR": str(tmp_path / "fabric"), "PATH": "/usr/bin:/bin"})


def up(pi: PiRpc) -> None:
    pi.wait_ui("setStatus", lambda e: str(e.get("statusText", "")).startswith("castor: up"))


def cast_two_sockets(start_pi: Any, castor_command: list[str], fake_llm: Any,
                     project: Path) -> tuple[PiRpc, int, Path, list[dict[str, Any]]]:
    """The two-socket loadout's cast in ``project``, run to its end in a fresh Pi: (Pi, the
    command's start index, the run directory, its events)."""
    fake_llm.reply_text(PLAN, when="PLANNER-MATERIA")
    fake_llm.reply_text("WRITTEN-RESULT", when="WRITER-MATERIA")
    pi = start_pi(castor_command, cwd=project, settings={"defaultProjectTrust": "always"})
    up(pi)
    start = pi.command("/materia cast build the thing")
    run_dir, events = wait_cast_end(pi, project, start=start)
    return pi, start, run_dir, events


def test_a_two_socket_cast_with_json_handoff_completes(start_pi, castor_command, fake_llm, tmp_path):
    _pi, _start, run_dir, events = cast_two_sockets(start_pi, castor_command, fake_llm, project_with_loadout(tmp_path))
    types = [e["type"] for e in events]
    assert types[0] == "cast_start" and events[-1]["type"] == "cast_end" and events[-1]["data"]["ok"] is True
    assert [e["data"]["socket"] for e in events if e["type"] == "socket_complete"] == ["Socket-1", "Socket-2"]
    assert (run_dir / "manifest.json").exists() and (run_dir / "config.resolved.json").exists()
    requests = [json.dumps(r["messages"]) for r in fake_llm.log()]
    assert any("PLANNER-MATERIA" in r for r in requests) and any("WRITER-MATERIA" in r for r in requests)
    # The session mirror appends from its own queue (a cast never waits for the harness), so the
    # final record may land just after events.jsonl's cast_end.
    def final_state_recorded() -> bool:
        states = [e for e in session_entries(tmp_path / "sessions") if e.get("customType") == "pi-materia-cast-state"]
        return bool(states) and states[-1]["data"]["phase"] == "complete"

    assert poll_until(final_state_recorded, timeout=10.0)
    # Each turn's visible "Casting" line and hidden prompt carry pi-materia's details in the session.
    messages = [e for e in session_entries(tmp_path / "sessions") if e.get("type") == "custom_message"]
    shown = [e["details"] for e in messages if e.get("customType") == "pi-materia" and e.get("display")]
    assert [(d["socketId"], d["materiaName"], d["socketOrdinal"], d["eventType"]) for d in shown] == [
        ("Socket-1", "Planner", 1, "materia_prompt"), ("Socket-2", "Writer", 2, "materia_prompt")]
    prompts = [e["details"] for e in messages if e.get("customType") == "pi-materia-prompt"]
    assert [(d["phase"], d["socketId"], d["materiaName"]) for d in prompts] == [
        ("Socket-1", "Socket-1", "Planner"), ("Socket-2", "Socket-2", "Writer")]
    assert all(d["castor_turn_id"] and d["materiaModel"]["source"] == "active" for d in prompts)


def test_b_memory_context_reaches_the_model_and_the_audit_lands_in_the_session(
    start_pi, castor_command, fake_llm, tmp_path
):
    seed_fabric(tmp_path, ("ZEBRA-FACT zebra migration notes", "zebras migrate in the dry season"))
    pi = start_pi(castor_command, settings=icarus_settings(tmp_path))
    up(pi)
    start = pi.prompt("tell me about the zebra herd")
    fail_fast_on_error(pi, start)
    main_request = next(
        r
        for r in reversed(fake_llm.log())
        if "tell me about the zebra herd" in json.dumps(r["messages"]) and r["messages"][-1]["role"] != "system"
    )
    assert "ZEBRA-FACT" in json.dumps(main_request["messages"])
    audits = [e for e in session_entries(tmp_path / "sessions") if e.get("customType") == "icarus-context-filter"]
    assert len(audits) == 1
    audit = json.dumps(audits[0]["data"])
    assert audits[0]["data"]["version"] == 1 and "ZEBRA-FACT" not in audit and "zebra herd" not in audit


def test_c_fabric_tool_called_by_the_model_round_trips(start_pi, castor_command, fake_llm, tmp_path):
    pi = start_pi(castor_command, settings=icarus_settings(tmp_path))
    up(pi)
    fake_llm.reply_tool_call(
        "fabric_write", {"type": "note", "summary": "TOOL-ROUND-TRIP", "content": "written by the model"}
    )
    start = pi.prompt("save a note")
    fail_fast_on_error(pi, start)
    end = pi.wait_for(
        lambda e: e.get("type") == "tool_execution_end" and e.get("toolName") == "fabric_write", start=start
    )
    assert end["isError"] is False
    db = tmp_path / "fabric" / "icarus_reference.sqlite3"
    rows = sqlite3.connect(db).execute("SELECT summary, content FROM entries").fetchall()
    assert rows == [("TOOL-ROUND-TRIP", "written by the model")]
    assert "TOOL_RESULT_SEEN" in json.dumps(
        pi.wait_for(lambda e: e.get("type") == "agent_end", start=start)["messages"]
    )


def test_d_icarus_off_stops_retrieval_on_the_next_prompt(start_pi, castor_command, fake_llm, tmp_path):
    seed_fabric(tmp_path, ("ZEBRA-FACT zebra notes", "stripes"), ("GIRAFFE-FACT giraffe notes", "long necks"))
    call_log = tmp_path / "icarus-calls.jsonl"
    pi = start_pi(castor_command, settings=icarus_settings(tmp_path), env={"ICARUS_REF_CALL_LOG": str(call_log)})
    up(pi)
    start = pi.prompt("what about the zebra")
    fail_fast_on_error(pi, start)
    assert "ZEBRA-FACT" in json.dumps(fake_llm.log()[-1]["messages"])
    retrievals_on = [
        c for c in read_jsonl(call_log) if c.get("call") == "hooks.pre_llm_call" and c.get("phase") == "start"
    ]
    assert len(retrievals_on) == 1
    start = pi.command("/icarus off")
    pi.wait_ui("notify", lambda e: "hooks are off" in e.get("message", ""), start=start)
    retrievals_before = [
        c for c in read_jsonl(call_log) if c.get("call") == "hooks.pre_llm_call" and c.get("phase") == "start"
    ]
    start = pi.prompt("what about the giraffe")
    fail_fast_on_error(pi, start)
    assert "GIRAFFE-FACT" not in json.dumps(fake_llm.log()[-1]["messages"])
    retrievals_after = [
        c for c in read_jsonl(call_log) if c.get("call") == "hooks.pre_llm_call" and c.get("phase") == "start"
    ]
    assert retrievals_after == retrievals_before


def test_d2_the_icarus_footer_reaches_pi_when_it_changes_not_at_every_prompt(start_pi, castor_command, fake_llm,
                                                                           tmp_path):
    """The real Pi's footer (``setStatus`` key ``icarus``): set when the session starts; the prompts
    that follow repeat nothing it already shows; ``/icarus off`` clears it, ``/icarus on`` sets it
    again (and, like any other status, lets the next prompt send it once more), and the prompt after
    that sends nothing."""
    pi = start_pi(castor_command, settings=icarus_settings(tmp_path))
    up(pi)

    def footers(start: int = 0) -> list[Any]:
        return [e.get("statusText") for e in pi.ui("setStatus", start=start) if e.get("statusKey") == "icarus"]

    for question in ("what about the zebra", "and the giraffe", "and the lion"):
        fail_fast_on_error(pi, pi.prompt(question))
    shown = footers()
    assert shown and shown[-1], shown  # the footer is up
    assert len(shown) <= 2, shown  # the start's, maybe the first prompt's: not one per prompt
    start = pi.command("/icarus off")
    pi.wait_ui("notify", lambda e: "hooks are off" in e.get("message", ""), start=start)
    start = pi.command("/icarus on")
    pi.wait_ui("setStatus", lambda e: e.get("statusKey") == "icarus" and e.get("statusText"), start=start)
    fail_fast_on_error(pi, pi.prompt("and the zebra again"))
    settled = pi.mark()
    fail_fast_on_error(pi, pi.prompt("and the giraffe again"))
    assert footers(settled) == [], footers(settled)


def test_e_runtime_killed_mid_cast_pi_survives_and_recast_completes(start_pi, castor_command, fake_llm, tmp_path):
    project = project_with_loadout(tmp_path)
    fake_llm.reply_text(PLAN, when="PLANNER-MATERIA", delay=1.5)  # slow model: the kill lands mid-turn
    pi = start_pi(castor_command, cwd=project, settings={"defaultProjectTrust": "always"})
    up(pi)
    start = pi.command("/materia cast build the thing")
    deadline = time.monotonic() + 10
    while not any("PLANNER-MATERIA" in json.dumps(r["messages"]) for r in fake_llm.log()):
        fail_fast_on_error(pi, start)
        assert time.monotonic() < deadline, "the planner turn never reached the model"
        time.sleep(0.02)
    killed_at = pi.mark()
    castor_process(pi).kill()
    # Other error toasts may come first (e.g. a lifecycle call that was in flight when the
    # runtime died); the one that must appear says the runtime stopped.
    note = pi.wait_ui("notify", lambda e: e.get("notifyType") == "error"
                      and "castor runtime stopped" in str(e.get("message", "")), start=killed_at)
    assert note["message"].startswith("castor runtime stopped")
    pi.wait_ui("setStatus", lambda e: e.get("statusText") == "castor: down", start=killed_at)
    assert pi.proc.poll() is None, "Pi must keep running"
    pi.wait_for(lambda e: e.get("type") == "agent_settled", start=killed_at)  # the orphaned turn ends normally

    fake_llm.reply_text(PLAN, when="PLANNER-MATERIA")
    fake_llm.reply_text("WRITTEN-RESULT", when="WRITER-MATERIA")
    start = pi.command("/materia recast")
    up_again = pi.wait_ui("setStatus", lambda e: str(e.get("statusText", "")).startswith("castor: up"), start=start)
    assert up_again
    # The orphaned turn's end may be reported to the dead runtime just around now; that
    # toast ("castor did not take the end of turn …") is expected. Any other error is not.
    _run_dir, events = wait_cast_end(pi, project, start=start, tolerate_errors=True)
    unexpected = [e.get("message") for e in pi.ui("notify", start=start)
                  if e.get("notifyType") == "error" and "did not take the end of turn" not in str(e.get("message"))]
    assert unexpected == []
    assert any(e["type"] == "cast_recast" for e in events)
    assert events[-1]["data"]["ok"] is True


REFINE = {
    "artifactDir": ".pi/pi-materia",
    "activeLoadout": "Refine",
    "materia": {
        "Planner": {"prompt": "PLANNER-MATERIA: draft a plan and refine it with the user.", "tools": "none",
                    "multiTurn": True, "model": "fake/fake-refiner"},
        "Writer": {"prompt": "WRITER-MATERIA: write the result from the plan.", "tools": "none"},
    },
    "loadouts": {"Refine": {"entry": "Socket-1", "sockets": {
        "Socket-1": {"type": "agent", "materia": "Planner", "parse": "json", "assign": {"plan": "$.summary"},
                     "edges": [{"when": "always", "to": "Socket-2"}]},
        "Socket-2": {"type": "agent", "materia": "Writer", "parse": "text"},
    }}},
}


def continue_to_completion(pi, project, fake_llm, *, refinement_turn: int) -> None:
    """``/materia continue`` on a paused REFINE cast: the finalization turn is parsed and routed,
    the writer completes the cast, and the planner's completion says it finalized ``refinement_turn``."""
    fake_llm.reply_text(PLAN, when="Command-triggered finalization")
    fake_llm.reply_text("WRITTEN-RESULT", when="WRITER-MATERIA")
    start = pi.command("/materia continue")
    _run_dir, events = wait_cast_end(pi, project, start=start)
    assert events[-1]["data"]["ok"] is True
    completes = [e["data"] for e in events if e["type"] == "socket_complete"]
    assert completes[0]["finalizedRefinement"] is True and completes[0]["refinementTurn"] == refinement_turn


def test_f_user_refinement_turn_runs_with_the_materias_model_and_tool_scope(start_pi, castor_command, fake_llm,
                                                                           tmp_path):
    """Spec §5.7 step 3: the user's own message drives a refinement turn, and the materia's model and
    tool scope are re-applied for it (castor answers before_agent_start with turn_settings)."""
    project = tmp_path / "project"
    (project / ".pi").mkdir(parents=True)
    (project / ".pi" / "pi-materia.json").write_text(json.dumps(REFINE))
    pi = start_pi(castor_command, cwd=project, settings={"defaultProjectTrust": "always"})
    up(pi)
    fail_fast_on_error(pi, pi.prompt("EARLIER-CHAT about the weather"))
    fake_llm.reply_text("DRAFT-1: which database?", when="PLANNER-MATERIA")
    start = pi.command("/materia cast build the thing")
    wait_event(pi, project, lambda e: e.get("type") == "socket_refinement", start=start, what="the first draft")
    pi.wait_for(lambda e: e.get("type") == "agent_settled", start=start)
    # castor's own turn switched Pi to the materia's model and then restored the tool set; the user
    # goes back to their own model, so only castor's answer can put the refiner back for their turn.
    pi.request({"type": "set_model", "provider": "fake", "modelId": "fake-model"})

    fake_llm.reply_text("DRAFT-2: postgres it is.", when="REFINE-POSTGRES")
    start = pi.prompt("REFINE-POSTGRES use postgres please")
    fail_fast_on_error(pi, start)
    user_turn = next(r for r in reversed(fake_llm.log()) if "REFINE-POSTGRES" in json.dumps(r["messages"]))
    assert user_turn["model"] == "fake-refiner"
    assert not user_turn.get("tools"), "the materia's tool scope is 'none'"
    assert "Materia active materia (Socket-1)" in json.dumps(user_turn["messages"])
    # ...and sees the isolated context (spec §5.4): a synthetic cast context, the socket's prompt, the
    # draft and the user's message — not the chat from before the cast.
    sent = json.dumps(user_turn["messages"])
    assert "Materia isolated context." in sent and "DRAFT-1" in sent and "PLANNER-MATERIA" in sent
    assert "EARLIER-CHAT" not in sent
    run_dir, _events, second = wait_event(pi, project, lambda e: e.get("type") == "socket_refinement"
                                          and e["data"].get("refinementTurn") == 2, start=start,
                                          what="the second draft")
    assert (run_dir / second["data"]["artifact"]).read_text() == "DRAFT-2: postgres it is."

    continue_to_completion(pi, project, fake_llm, refinement_turn=2)
    # The refinement turn's tool scope was put back when that run settled: a plain prompt now has
    # Pi's tools again (castor's later turns restore whatever they found, so a leak would persist).
    start = pi.prompt("PLAIN-QUESTION after the cast")
    fail_fast_on_error(pi, start)
    plain = next(r for r in reversed(fake_llm.log()) if "PLAIN-QUESTION" in json.dumps(r["messages"]))
    assert plain.get("tools"), "Pi's tool set must be restored after the refinement turn"


def test_g_an_aborted_user_refinement_turn_is_withdrawn_and_the_cast_still_finalizes(start_pi, castor_command,
                                                                                     fake_llm, tmp_path):
    """The user presses Esc during their refinement turn: whatever real Pi reports for that run
    (agent_end with stop reason "aborted", then agent_settled{aborted:true}), the turn is withdrawn —
    no draft, no retry, the cast paused again — and /materia continue finalizes it."""
    project = tmp_path / "project"
    (project / ".pi").mkdir(parents=True)
    (project / ".pi" / "pi-materia.json").write_text(json.dumps(REFINE))
    pi = start_pi(castor_command, cwd=project, settings={"defaultProjectTrust": "always"})
    up(pi)
    fake_llm.reply_text("DRAFT-1: which database?", when="PLANNER-MATERIA")
    start = pi.command("/materia cast build the thing")
    wait_event(pi, project, lambda e: e.get("type") == "socket_refinement", start=start, what="the first draft")
    pi.wait_for(lambda e: e.get("type") == "agent_settled", start=start)

    fake_llm.reply_text("DRAFT-2 that never arrives", when="REFINE-SLOW", delay=8)  # a slow model
    start = pi.mark()
    pi.request({"type": "prompt", "message": "REFINE-SLOW use postgres please"})
    assert poll_until(lambda: any("REFINE-SLOW" in json.dumps(r["messages"]) for r in fake_llm.log()), timeout=15)
    pi.request({"type": "abort"})  # Esc
    pi.wait_for(lambda e: e.get("type") == "agent_settled", start=start)
    run_dir, events, abandoned = wait_event(pi, project, lambda e: e.get("type") == "refinement_turn_abandoned",
                                            start=start, what="the withdrawal")
    assert abandoned["data"]["reason"] == "aborted" and abandoned["data"]["refinementTurn"] == 2
    types = [e["type"] for e in events]
    assert types.count("socket_refinement") == 1 and "same_socket_recovery_start" not in types
    warning = pi.wait_ui("notify", lambda e: "withdrawn" in str(e.get("message")), start=start)
    assert warning.get("notifyType") == "warning"

    continue_to_completion(pi, project, fake_llm, refinement_turn=1)



def _a_first_turn_that_overflows(start_pi, castor_command, fake_llm, tmp_path: Path) -> tuple[Path, PiRpc]:
    """Pi with an earlier chat to summarise, its own overflow recovery off (else Pi would compact and
    retry by itself and castor would never see the failure), and a planner turn that overflows."""
    project = project_with_loadout(tmp_path)
    settings = {"defaultProjectTrust": "always", "compaction": {"enabled": False, "keepRecentTokens": 50}}
    pi = start_pi(castor_command, cwd=project, settings=settings)
    up(pi)
    fail_fast_on_error(pi, pi.prompt("EARLIER-CHAT about the weather, long enough to be worth a summary"))
    fake_llm.reply_context_overflow(when="PLANNER-MATERIA")
    return project, pi

def test_h_context_window_failure_is_recovered_by_a_real_pi_compaction(start_pi, castor_command, fake_llm, tmp_path):
    """Spec §6.2 step 3 (conformance 54) in the real harness: the first materia turn overflows the
    context window, castor asks Pi to compact its session (``session.compact`` → ``ctx.compact``; Pi
    asks the model for the summary), and the same socket's retry completes the cast.

    Pi's own overflow auto-recovery is off (``compaction.enabled: false``), else Pi would compact and
    retry by itself and castor would never see the failure; ``keepRecentTokens`` is small so the
    short test session has something before its cut point to summarise."""
    project, pi = _a_first_turn_that_overflows(start_pi, castor_command, fake_llm, tmp_path)
    fake_llm.reply_text("CHECKPOINT-SUMMARY: the user chatted about the weather; a cast plans the thing.",
                        when="context checkpoint summary")
    fake_llm.reply_text(PLAN, when="PLANNER-MATERIA")
    fake_llm.reply_text("WRITTEN-RESULT", when="WRITER-MATERIA")
    start = pi.command("/materia cast build the thing")
    _run_dir, events = wait_cast_end(pi, project, start=start, timeout=30)
    assert events[-1]["data"]["ok"] is True, events[-1]
    by_type = {e["type"]: e["data"] for e in events}
    types = [e["type"] for e in events]
    assert types.index("same_socket_recovery_start") < types.index("same_socket_recovery_action_start") \
        < types.index("same_socket_recovery_action_complete") < types.index("same_socket_recovery_retry")
    assert by_type["same_socket_recovery_start"]["reason"] == "context_window"
    result = by_type["same_socket_recovery_action_complete"]["result"]
    assert set(result) <= {"tokensBefore", "tokensAfter", "entriesRemoved", "summaryTokens", "firstKeptEntryId"}
    assert result["tokensBefore"] > 0 and result["summaryTokens"] > 0 and result["entriesRemoved"] >= 1
    assert "skipped" not in by_type["same_socket_recovery_action_complete"]
    # Pi really compacted: its session has the compaction entry castor's result names...
    compactions = [e for e in session_entries(tmp_path / "sessions") if e.get("type") == "compaction"]
    assert len(compactions) == 1 and compactions[0]["firstKeptEntryId"] == result["firstKeptEntryId"]
    assert "CHECKPOINT-SUMMARY" in compactions[0]["summary"]
    # ...with castor's instructions in the summary request, and the retry re-sent the same socket.
    requests = [json.dumps(r["messages"]) for r in fake_llm.log()]
    summary_requests = [r for r in requests if "context checkpoint summary" in r]
    assert len(summary_requests) == 1 and "same-socket retry of an active materia cast" in summary_requests[0]
    assert sum("PLANNER-MATERIA" in r and "context checkpoint summary" not in r for r in requests) == 2
    assert [e["data"]["socket"] for e in events if e["type"] == "socket_start"] == ["Socket-1", "Socket-2"]



def test_h2_esc_during_the_recovery_compaction_interrupts_the_cast_and_continue_completes_it(
        start_pi, castor_command, fake_llm, tmp_path):
    """The same recovery, but the user presses Esc while Pi's summary call runs: Pi cancels the
    compaction, the extension says `cancelled`, and castor interrupts the cast (as for an Esc during
    a turn) instead of failing it -- which only a recast recovered. /materia continue completes it."""
    project, pi = _a_first_turn_that_overflows(start_pi, castor_command, fake_llm, tmp_path)
    fake_llm.reply_text("CHECKPOINT-SUMMARY never sent", when="context checkpoint summary", delay=8.0)
    start = pi.command("/materia cast build the thing")
    assert poll_until(lambda: any("context checkpoint summary" in json.dumps(r["messages"]) for r in fake_llm.log()),
                      timeout=20), "the compaction's summary call never reached the model"
    pi.request({"type": "abort"})
    _run_dir, events, interrupted = wait_event(pi, project, lambda e: e.get("type") == "turn_interrupted",
                                               start=start, what="turn_interrupted")
    assert interrupted["data"]["reason"] == "compaction_cancelled"
    types = [e["type"] for e in events]
    assert "same_socket_recovery_action_cancelled" in types and "cast_end" not in types
    assert "same_socket_recovery_action_failed" not in types
    fake_llm.reply_text(PLAN, when="PLANNER-MATERIA")
    fake_llm.reply_text("WRITTEN-RESULT", when="WRITER-MATERIA")
    resumed = pi.command("/materia continue")
    _run_dir, events = wait_cast_end(pi, project, start=resumed, timeout=30)
    assert events[-1]["data"]["ok"] is True, events[-1]
    assert [e["data"]["by"] for e in events if e["type"] == "turn_resumed"] == ["continue"]


def test_i_proactive_compaction_reads_pis_usage_and_compacts_before_the_turn(start_pi, castor_command, fake_llm,
                                                                            tmp_path):
    """Spec §6.5 in the real harness: castor reads Pi's context usage (``session.context_usage`` →
    ``ctx.getContextUsage``) before each materia turn; with a 0 % threshold it always fires, so Pi
    compacts its session before Socket-1's prompt is sent, and the turn goes out afterwards.
    (``keepRecentTokens: 1``: the two short chat turns before the cast are all there is to summarise.)"""
    project = tmp_path / "project"
    (project / ".pi").mkdir(parents=True)
    (project / ".pi" / "pi-materia.json").write_text(json.dumps({**TWO_SOCKETS,
                                                                 "compaction": {"proactiveThresholdPercent": 0}}))
    settings = {"defaultProjectTrust": "always", "compaction": {"enabled": False, "keepRecentTokens": 1}}
    pi = start_pi(castor_command, cwd=project, settings=settings)
    up(pi)
    fail_fast_on_error(pi, pi.prompt("EARLIER-CHAT about the weather, long enough to be worth a summary"))
    fail_fast_on_error(pi, pi.prompt("MORE-CHAT about the forecast for the weekend"))
    fake_llm.reply_text("CHECKPOINT-SUMMARY: weather chat.", when="context checkpoint summary")
    fake_llm.reply_text(PLAN, when="PLANNER-MATERIA")
    fake_llm.reply_text("WRITTEN-RESULT", when="WRITER-MATERIA")
    start = pi.command("/materia cast build the thing")
    _run_dir, events = wait_cast_end(pi, project, start=start, timeout=30)
    assert events[-1]["data"]["ok"] is True, events[-1]
    first = [e for e in events if e["type"].startswith("proactive_compaction") and e["data"]["socket"] == "Socket-1"]
    assert [e["type"] for e in first] == ["proactive_compaction_start", "proactive_compaction_complete"], (
        [e["data"] for e in first][-1].get("error"))
    start_data = first[0]["data"]
    assert start_data["thresholdPercent"] == 0 and start_data["thresholdMode"] == "single_percent"
    assert start_data["contextWindow"] == 32000 and start_data["tokens"] > 0  # Pi's own usage figures
    result = first[1]["data"]["result"]
    assert result["tokensBefore"] > 0 and isinstance(result["firstKeptEntryId"], str)
    types = [e["type"] for e in events]
    first_turn_done = next(i for i, e in enumerate(events) if e["type"] == "socket_complete")
    assert types.index("proactive_compaction_complete") < first_turn_done
    compactions = [e for e in session_entries(tmp_path / "sessions") if e.get("type") == "compaction"]
    assert compactions and compactions[0]["firstKeptEntryId"] == result["firstKeptEntryId"]
    # Socket-2's check also fired; whatever Pi answered (compacted again, or "nothing to compact"),
    # its turn was sent and the cast completed.
    assert [e["data"]["socket"] for e in events if e["type"] == "proactive_compaction_start"] == [
        "Socket-1",
        "Socket-2",
    ]


def test_j_a_materia_model_pi_cannot_use_falls_back_and_usage_json_names_who_answered(
        start_pi, castor_command, fake_llm, tmp_path):
    """pi-materia's model fallback in the real harness: a materia whose model is not in Pi's
    registry warns and runs on the active model (the cast completes); usage.json then names the
    model, provider and api that answered, from Pi's own messages, and the selection requested."""
    config = json.loads(json.dumps(TWO_SOCKETS))
    config["materia"]["Planner"]["model"] = "fake/no-such-model"
    pi, start, run_dir, events = cast_two_sockets(start_pi, castor_command, fake_llm,
                                                  project_with_loadout(tmp_path, config))
    assert events[-1]["data"]["ok"] is True, events[-1]
    warning = pi.wait_ui("notify", lambda e: "fake/no-such-model" in str(e.get("message")), start=start)
    assert "(unknown_model)" in warning["message"] and warning["notifyType"] == "warning"
    report = json.loads((run_dir / "usage.json").read_text())
    assert len(report["turns"]) == 2 and report["tokens"]["input"] == 20
    assert report["provider"] == "fake" and report["model"] and report["api"], report
    assert all(t["provider"] == "fake" and t["api"] for t in report["turns"])
    assert [s.get("requestedModel") for s in report["modelSelections"]] == ["fake/no-such-model", None]


def test_k_a_retrieval_slower_than_the_extensions_deadline_but_within_timeout_ms_still_lands(
        start_pi, castor_command, fake_llm, tmp_path):
    """The extension cut every Icarus call at its own per-call deadline (--castor-timeout-ms, 15 s by
    default) whatever timeoutMs allowed (30 s by default): a slow retrieval's memories were lost
    (and the backend marked them injected). It now waits as long as castor does
    (``icarus.config`` ``deadlines_ms``). Here the extension's deadline is 5 s and the retrieval 10 s:
    the deadline also bounds castor's handshake as Pi spawns it, which a loaded CI machine took
    past 2 s ("castor did not answer runtime.hello within 2000 ms")."""
    seed_fabric(tmp_path, ("ZEBRA-FACT zebra migration notes", "zebras migrate in the dry season"))
    controls = json.dumps({"hooks.pre_llm_call": {"sleep_ms": 10_000}})
    pi = start_pi(castor_command, settings=icarus_settings(tmp_path, classifier="none"), timeout_ms=5000,
                  env={"ICARUS_REF_CONTROLS": controls})
    up(pi)
    start = pi.prompt("tell me about the zebra herd", timeout=30)
    pi.wait_for(lambda e: e.get("type") == "agent_end", start=start, timeout=30)
    main_request = next(r for r in reversed(fake_llm.log())
                        if "tell me about the zebra herd" in json.dumps(r["messages"]))
    assert "ZEBRA-FACT" in json.dumps(main_request["messages"])
    assert not [e for e in pi.ui("notify", start=start) if "not answering" in str(e.get("message"))]


def test_l_an_answer_larger_than_castor_reads_is_cut_and_the_cast_goes_on(start_pi, castor_command, fake_llm, tmp_path):
    """A model's answer of 9 MiB (over the 8 MiB a string may be on castor's wire) used to be sent
    whole: castor closed the connection, the runtime was down for Pi and the cast was orphaned.
    The extension cuts it (at 6 MiB, on a character boundary) and says so; the cast completes with
    the cut output, which ends with a line naming the cut, and castor stays up."""
    project = project_with_loadout(tmp_path)
    huge = "é" + "W" * (9 * 1024 * 1024)
    fake_llm.reply_text(PLAN, when="PLANNER-MATERIA")
    fake_llm.reply_text(huge, when="WRITER-MATERIA")
    pi = start_pi(castor_command, cwd=project, settings={"defaultProjectTrust": "always"})
    up(pi)
    start = pi.command("/materia cast build the thing")
    run_dir, events = wait_cast_end(pi, project, start=start, timeout=45, tolerate_errors=True)
    assert events[-1]["data"]["ok"] is True, events[-1]
    outputs = list((run_dir / "sockets" / "Socket-2").glob("*.md"))
    assert outputs, "the cut answer was not kept as the socket's output"
    text = outputs[0].read_text(encoding="utf-8", errors="strict")
    kept = text[:text.rindex("\n\n[castor:")]
    assert 6 * 1024 * 1024 - 4 <= len(kept.encode()) <= 6 * 1024 * 1024
    assert text.startswith("éWWW") and "cut" in text[-300:] and str(len(huge.encode())) in text[-300:]
    warnings = [e.get("message", "") for e in pi.ui("notify", start=start) if e.get("notifyType") == "warning"]
    assert any("MiB" in w and "cut" in w for w in warnings), warnings
    assert not any("castor runtime stopped" in e.get("message", "") for e in pi.ui("notify", start=start))

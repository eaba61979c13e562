"""castor's runtime dies (or is restarted) while Pi streams a turn castor asked for.

Nothing can take that turn's answer any more: the runtime that would read it is gone, and the one
the next command starts knows nothing of the turn (the cast is resumable from its saved state). The
turn used to run to its end in Pi all the same -- the model streamed and was paid for, and its end
was then refused ("castor did not take the end of turn …"), or dropped. Now the extension stops the
run at once, says why and how to go on, and reports nothing for it.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from .pi_rpc import PiRpc
from .test_pi_castor_e2e import PLAN, castor_process, fail_fast_on_error, project_with_loadout, up, wait_cast_end

pytestmark = [pytest.mark.pi, pytest.mark.timeout(90)]

STREAM_PAUSE_S = 6.0  # the planner's answer stops half-way this long: the kill lands mid-stream


def planner_streaming(pi: PiRpc, fake_llm, start: int) -> None:
    """Wait until the planner turn's answer has begun to stream into Pi."""
    deadline = time.monotonic() + 15
    while True:
        fail_fast_on_error(pi, start)
        asked = any("PLANNER-MATERIA" in json.dumps(r["messages"]) for r in fake_llm.log())
        streaming = asked and any(e.get("type") == "message_update" for e in pi.events[start:])
        if streaming:
            return
        assert time.monotonic() < deadline, f"the planner turn never streamed; Pi: {pi.tail()}"
        time.sleep(0.02)


def assistant_ends(pi: PiRpc, start: int) -> list[dict]:
    return [e["message"] for e in pi.events[start:]
            if e.get("type") == "message_end" and (e.get("message") or {}).get("role") == "assistant"]


def at(pi: PiRpc, event: dict) -> int:
    """Where ``event`` (that very one, not an equal one) is in Pi's events."""
    return next(i for i, e in enumerate(pi.events) if e is event)


def stop_reason_after(pi: PiRpc, start: int) -> str | None:
    ends = assistant_ends(pi, start)
    return ends[-1].get("stopReason") if ends else None


def resumes_with_recast(pi: PiRpc, fake_llm, project) -> None:
    fake_llm.reply_text(PLAN, when="PLANNER-MATERIA")
    fake_llm.reply_text("WRITTEN-RESULT", when="WRITER-MATERIA")
    start = pi.command("/materia recast")
    _run_dir, events = wait_cast_end(pi, project, start=start)
    assert any(e["type"] == "cast_recast" for e in events)
    assert events[-1]["data"]["ok"] is True
    assert [e.get("message") for e in pi.ui("notify", start=start) if e.get("notifyType") == "error"] == []


def a_cast_whose_planner_streams(start_pi, castor_command, fake_llm, tmp_path) -> tuple[PiRpc, Path]:
    """A trusted project with the loadout, Pi started on it, and ``/materia cast`` whose planner turn
    has begun to stream (slowly: its answer pauses for ``STREAM_PAUSE_S``)."""
    project = project_with_loadout(tmp_path)
    fake_llm.reply_text(PLAN, when="PLANNER-MATERIA", pause=STREAM_PAUSE_S)
    pi = start_pi(castor_command, cwd=project, settings={"defaultProjectTrust": "always"})
    up(pi)
    start = pi.command("/materia cast build the thing")
    planner_streaming(pi, fake_llm, start)
    return pi, project


def test_castor_killed_while_its_turn_streams_stops_the_turn_and_says_so(start_pi, castor_command, fake_llm,
                                                                          tmp_path):
    pi, project = a_cast_whose_planner_streams(start_pi, castor_command, fake_llm, tmp_path)
    killed_at, killed_t = pi.mark(), time.monotonic()
    castor_process(pi).kill()

    note = pi.wait_ui("notify", lambda e: "while its turn" in str(e.get("message", "")), start=killed_at)
    text = str(note["message"])
    assert note["notifyType"] == "warning", note
    assert "stopped" in text and "/materia recast" in text, text
    # The run ends now, not when the model would have finished streaming.
    pi.wait_for(lambda e: e.get("type") == "agent_settled", start=killed_at, timeout=STREAM_PAUSE_S)
    settled_after = time.monotonic() - killed_t
    assert settled_after < STREAM_PAUSE_S - 2, f"the orphaned turn streamed on for {settled_after:.1f} s"
    assert stop_reason_after(pi, killed_at) == "aborted"
    assert pi.proc.poll() is None, "Pi must keep running"
    # Nothing is reported for the stopped turn: no refused end, no other error than the stop itself.
    time.sleep(0.5)  # the settle's report would follow its QUIT_GRACE_MS (50 ms) wait
    errors = [str(e.get("message")) for e in pi.ui("notify", start=killed_at) if e.get("notifyType") == "error"]
    assert all(m.startswith("castor runtime stopped") for m in errors), errors
    assert not any("did not take the end of turn" in m for m in errors), errors

    resumes_with_recast(pi, fake_llm, project)


def test_castor_restart_while_its_turn_streams_stops_the_turn(start_pi, castor_command, fake_llm, tmp_path):
    pi, project = a_cast_whose_planner_streams(start_pi, castor_command, fake_llm, tmp_path)
    restarted_at, restarted_t = pi.mark(), time.monotonic()
    # Not waited for here: Pi answers the command once the new castor is up (seconds on a loaded machine).
    restart = pi.send({"type": "prompt", "message": "/castor restart"})

    note = pi.wait_ui("notify", lambda e: "while its turn" in str(e.get("message", "")), start=restarted_at)
    assert note["notifyType"] == "warning" and "/materia recast" in str(note["message"]), note
    settled = pi.wait_for(lambda e: e.get("type") == "agent_settled", start=restarted_at, timeout=STREAM_PAUSE_S)
    settled_after = time.monotonic() - restarted_t
    assert settled_after < STREAM_PAUSE_S - 2, f"the orphaned turn streamed on for {settled_after:.1f} s"
    assert stop_reason_after(pi, restarted_at) == "aborted"
    # The stopped run ended while the new castor started, not once it was up: its end used to wait for
    # that start (Pi's settle, and a quit, wait for the extension's agent_end).
    restarted = pi.wait_ui("notify", lambda e: str(e.get("message", "")).startswith("castor runtime restarted"),
                           start=restarted_at)
    assert at(pi, settled) < at(pi, restarted), "the stopped run ended only once castor was up"
    answer = pi.wait_for(lambda e: e.get("type") == "response" and e.get("id") == restart, start=restarted_at,
                         timeout=30)
    assert answer.get("success"), answer
    pi.wait_ui("notify", lambda e: str(e.get("message", "")).startswith("castor ") and " up (" in str(e.get("message")),
               start=restarted_at)
    time.sleep(0.5)
    # The new runtime was never asked to take the old runtime's turn (it would refuse it: not_found).
    errors = [str(e.get("message")) for e in pi.ui("notify", start=restarted_at) if e.get("notifyType") == "error"]
    assert errors == [], errors

    resumes_with_recast(pi, fake_llm, project)

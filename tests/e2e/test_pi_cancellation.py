"""Stopping a cast under real Pi: Esc, /materia abort, Pi quitting, and commands mid-turn.

Real Pi in RPC mode with the extension, the real castor runtime (``castor serve --stdio``), and the
FAKE OpenAI-compatible model on 127.0.0.1, whose request log (with arrival times) the tests read.
A stalled model call is a scripted reply that starts after ``STALL_S`` seconds, so a turn that was
not stopped would still be streaming when the asserts run.

(a)-(c) need castor's side of cancellation (an interrupted turn is never a socket's output; an
abort sends ``agent.abort_turn`` to the harness); until that is merged they are expected to fail.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from castor.adapters.materia.state_store import cast_status
from tests.support.waiting import poll_until

from .conftest import python_env, read_jsonl
from .pi_rpc import PiRpc

pytestmark = [pytest.mark.pi, pytest.mark.timeout(90)]


STALL_S = 8.0
#: The issue's latency bound ("within 1 s"), measured from the command being sent to Pi.
LATENCY_S = 1.0
#: The extension's deadline per castor call: roomy, so a loaded CI box does not fail the handshake.
CALL_TIMEOUT_MS = 15000


def loadout(builder_parse: str) -> dict[str, Any]:
    builder: dict[str, Any] = {"type": "agent", "materia": "Builder", "parse": builder_parse,
                               "edges": [{"when": "always", "to": "Socket-2"}]}
    if builder_parse == "json":
        builder["assign"] = {"plan": "$.summary"}
    return {
        "artifactDir": ".pi/pi-materia",
        "activeLoadout": "Build-Review",
        "limits": {"maxSocketVisits": 5, "maxEdgeTraversals": 5},
        "materia": {
            "Builder": {"prompt": "BUILDER-MATERIA: build what the request asks for.", "tools": "none"},
            "Reviewer": {"prompt": "REVIEWER-MATERIA: review the build.", "tools": "none"},
        },
        "loadouts": {"Build-Review": {"entry": "Socket-1", "sockets": {
            "Socket-1": builder,
            "Socket-2": {"type": "agent", "materia": "Reviewer", "parse": "text",
                         "edges": [{"when": "always", "to": "end"}]},
        }}},
    }


BUILT_JSON = json.dumps({"summary": "BUILT-REAL-JSON", "workItems": [], "satisfied": True})


def project(tmp_path: Path, builder_parse: str = "text") -> Path:
    root = tmp_path / "project"
    (root / ".pi").mkdir(parents=True)
    (root / ".pi" / "pi-materia.json").write_text(json.dumps(loadout(builder_parse)))
    return root


def up(pi: PiRpc) -> None:
    pi.wait_ui("setStatus", lambda e: str(e.get("statusText", "")).startswith("castor: up"), timeout=40)


def run_dir(root: Path) -> Path:
    assert poll_until(lambda: list((root / ".pi" / "pi-materia").glob("*/events.jsonl")), timeout=15), \
        "no cast started"
    (events,) = (root / ".pi" / "pi-materia").glob("*/events.jsonl")
    return events.parent


def events(run: Path) -> list[dict[str, Any]]:
    return read_jsonl(run / "events.jsonl")


def status(run: Path) -> str | None:
    """The cast's status as castor derives it from its saved state (active, aborted, failed, ...)."""
    try:
        doc = json.loads((run / "state.json").read_text())
    except (OSError, ValueError):
        return None  # not written yet, or mid-replace: the next poll reads it
    return cast_status(doc.get("state", {}))[0]


def completes(run: Path) -> list[str]:
    return [e["data"]["socket"] for e in events(run) if e["type"] == "socket_complete"]


def builder_output(run: Path) -> str:
    """The saved output of the builder's (last) completion: what the cast took as its answer."""
    done = [e["data"] for e in events(run) if e["type"] == "socket_complete" and e["data"]["socket"] == "Socket-1"]
    assert done, "the builder never completed"
    return (run / done[-1]["artifact"]).read_text()


def requests_with(fake_llm, marker: str) -> list[dict[str, Any]]:
    return [r for r in fake_llm.log() if marker in json.dumps(r["messages"])]


def wait_request(fake_llm, marker: str, n: int = 1, timeout: float = 15.0) -> None:
    assert poll_until(lambda: len(requests_with(fake_llm, marker)) >= n, timeout=timeout), \
        f"no {marker} request reached the model"


def error_toasts(pi: PiRpc, start: int) -> list[str]:
    return [str(e.get("message")) for e in pi.ui("notify", start=start) if e.get("notifyType") == "error"]


def wait_cast_end(pi: PiRpc, run: Path, timeout: float = 20.0) -> list[dict[str, Any]]:
    assert poll_until(lambda: any(e["type"] == "cast_end" for e in events(run)), timeout=timeout), \
        f"the cast never ended; Pi: {pi.tail()}\nstderr: {pi.stderr()[-3000:]}"
    return events(run)


def continue_completes_the_review(pi: PiRpc, run: Path, fake_llm) -> None:
    """The cast interrupted at the Reviewer's socket: ``/materia continue`` runs that turn once
    (the model asked for it once more) and the cast completes, with no error toast."""
    fake_llm.reply_text("REVIEWED-OK", when="REVIEWER-MATERIA")
    cont = pi.command("/materia continue")
    done = wait_cast_end(pi, run)
    assert done[-1]["data"]["ok"] is True, done[-1]
    assert completes(run) == ["Socket-1", "Socket-2"]
    assert len(requests_with(fake_llm, "REVIEWER-MATERIA")) == 1
    assert error_toasts(pi, cont) == []


def settled_after(pi: PiRpc, start: int) -> dict[str, Any]:
    return pi.wait_for(lambda e: e.get("type") == "agent_settled", start=start, timeout=10)


def esc_mid_stream(pi: PiRpc, run: Path, start: int, *, timeout: float = 10) -> dict[str, Any]:
    """Press Esc (an RPC abort) once the builder's answer streams (its first text delta since
    ``start``); returns the stopped turn's usage record (Socket-1) once castor recorded the turn
    as interrupted."""
    pi.wait_for(lambda e: e.get("type") == "message_update"
                and (e.get("assistantMessageEvent") or {}).get("type") == "text_delta", start=start, timeout=timeout)
    esc = pi.mark()
    pi.request({"type": "abort"})
    assert settled_after(pi, esc)["aborted"] is True
    assert poll_until(lambda: any(e["type"] == "turn_interrupted" for e in events(run)), timeout=10)
    usage = json.loads((run / "usage.json").read_text())
    (stopped,) = [t for t in usage.get("turns", []) if t["socket"] == "Socket-1"]
    return {**stopped, "costEstimated": usage.get("costEstimated")}


def esc_during_builder(pi: PiRpc, fake_llm, root: Path) -> Path:
    """Start the cast, stall the builder's model call, press Esc (RPC abort); returns the run dir
    once Pi settled and castor had the turn's end long enough to act on it."""
    fake_llm.reply_text("BUILT-PARTIAL never sent", when="BUILDER-MATERIA", delay=STALL_S)
    start = pi.command("/materia cast build the thing")
    run = run_dir(root)
    wait_request(fake_llm, "BUILDER-MATERIA")
    esc = pi.mark()
    pi.request({"type": "abort"})
    assert settled_after(pi, esc)["aborted"] is True
    # castor takes the aborted end (or, wrongly, the reviewer starts): either shows within a few s.
    poll_until(lambda: requests_with(fake_llm, "REVIEWER-MATERIA") or status(run) not in (None, "active"), timeout=5)
    assert error_toasts(pi, start) == []
    # The footer no longer names the stopped turn as running: it says what the cast waits for.
    pi.wait_ui("setStatus", lambda e: str(e.get("statusText", "")).startswith(
        "materia: interrupted at Socket-1 — /materia continue"), start=esc, timeout=5)
    return run


def resume_completes(pi: PiRpc, fake_llm, run: Path, built: str) -> list[dict[str, Any]]:
    """``/materia continue`` re-runs the builder (a second builder request) and the cast completes
    with the builder's real output handed to the reviewer."""
    fake_llm.reply_text(built, when="BUILDER-MATERIA")
    fake_llm.reply_text("REVIEWED-OK", when="REVIEWER-MATERIA")
    start = pi.command("/materia continue")
    done = wait_cast_end(pi, run)
    assert done[-1]["data"]["ok"] is True, done[-1]
    assert len(requests_with(fake_llm, "BUILDER-MATERIA")) == 2, "the builder runs again"
    assert completes(run) == ["Socket-1", "Socket-2"]
    assert error_toasts(pi, start) == []
    return done


def test_a_esc_during_a_builder_text_turn_does_not_advance_and_continue_completes(start_pi, castor_command,
                                                                                 fake_llm, tmp_path):
    root = project(tmp_path, "text")
    pi = start_pi(castor_command, cwd=root, settings={"defaultProjectTrust": "always"}, timeout_ms=CALL_TIMEOUT_MS)
    up(pi)
    run = esc_during_builder(pi, fake_llm, root)
    assert completes(run) == [], "an aborted turn is not the builder's output"
    assert requests_with(fake_llm, "REVIEWER-MATERIA") == [], "the cast did not move on to the reviewer"
    resume_completes(pi, fake_llm, run, "BUILT-REAL-TEXT")
    assert builder_output(run) == "BUILT-REAL-TEXT"
    assert len(requests_with(fake_llm, "REVIEWER-MATERIA")) == 1


def test_b_esc_during_a_builder_json_turn_is_no_invalid_json_failure(start_pi, castor_command, fake_llm, tmp_path):
    root = project(tmp_path, "json")
    pi = start_pi(castor_command, cwd=root, settings={"defaultProjectTrust": "always"}, timeout_ms=CALL_TIMEOUT_MS)
    up(pi)
    run = esc_during_builder(pi, fake_llm, root)
    text = json.dumps(events(run))
    assert "Invalid JSON" not in text and "No JSON found" not in text
    assert status(run) != "failed" and completes(run) == []
    assert all("JSON" not in str(e.get("message")) for e in pi.ui("notify"))
    resume_completes(pi, fake_llm, run, BUILT_JSON)
    assert json.loads(builder_output(run))["summary"] == "BUILT-REAL-JSON"
    assert len(requests_with(fake_llm, "REVIEWER-MATERIA")) == 1


def test_c_materia_abort_while_the_model_stalls_aborts_within_a_second_and_nothing_more_is_asked(
        start_pi, castor_command, fake_llm, tmp_path):
    root = project(tmp_path, "text")
    pi = start_pi(castor_command, cwd=root, settings={"defaultProjectTrust": "always"}, timeout_ms=CALL_TIMEOUT_MS)
    up(pi)
    fake_llm.reply_text("BUILT never sent", when="BUILDER-MATERIA", delay=STALL_S)
    start = pi.command("/materia cast build the thing")
    run = run_dir(root)
    wait_request(fake_llm, "BUILDER-MATERIA")
    t0 = time.monotonic()
    cmd = pi.command("/materia abort")
    assert poll_until(lambda: status(run) == "aborted", timeout=5), status(run)
    aborted_after = time.monotonic() - t0
    pi.wait_ui("notify", lambda e: "aborted" in str(e.get("message")), start=cmd, timeout=5)
    answered_after = time.monotonic() - t0
    settled = settled_after(pi, cmd)  # Pi's run was stopped, not left streaming
    stopped_after = time.monotonic() - t0
    assert settled["aborted"] is True
    assert aborted_after < LATENCY_S and answered_after < LATENCY_S and stopped_after < LATENCY_S, \
        (aborted_after, answered_after, stopped_after)
    # Nothing of this cast reaches the model after the abort (a queued turn would show here).
    state = pi.request({"type": "get_state"})
    assert state["data"]["isStreaming"] is False
    assert poll_until(lambda: any(e["type"] == "cast_end" for e in events(run)), timeout=5)
    late = [body for at, body in fake_llm.timed_log() if at >= t0]
    assert late == [], [json.dumps(b["messages"])[:200] for b in late]
    assert completes(run) == []
    assert error_toasts(pi, start) == []


def test_d_pi_quits_mid_turn_and_castor_recast_from_the_cli_completes(start_pi, castor_command, fake_llm, tmp_path):
    root = project(tmp_path, "text")
    pi = start_pi(castor_command, cwd=root, settings={"defaultProjectTrust": "always"}, timeout_ms=CALL_TIMEOUT_MS)
    up(pi)
    fake_llm.reply_text("BUILT never sent", when="BUILDER-MATERIA", delay=STALL_S)
    pi.command("/materia cast build the thing")
    run = run_dir(root)
    wait_request(fake_llm, "BUILDER-MATERIA")
    pi.close(timeout=10)  # stdin EOF: Pi quits, the extension closes its session and stops castor
    assert completes(run) == []
    cast_id = run.name
    listed = subprocess.run([sys.executable, "-m", "castor", "casts", "--cwd", str(root), "--json"],
                            capture_output=True, text=True, timeout=30, env={**os.environ, **python_env()})
    assert listed.returncode == 0, listed.stderr
    assert cast_id in listed.stdout
    rows = [r for r in json.loads(listed.stdout) if r["cast_id"] == cast_id]
    assert len(rows) == 1 and rows[0]["resumable"] is True and rows[0]["live"] is False, rows
    fake_llm.reply_text("BUILT-BY-CLI", when="BUILDER-MATERIA")
    fake_llm.reply_text("REVIEWED-BY-CLI", when="REVIEWER-MATERIA")
    before = len(fake_llm.log())
    recast = subprocess.run(
        [sys.executable, "-m", "castor", "recast", cast_id, "--cwd", str(root), "--quiet",
         "--agent", f"openai:{fake_llm.base_url}#fake-model"],
        capture_output=True, text=True, timeout=60, env={**os.environ, **python_env()})
    assert recast.returncode == 0, (recast.stdout, recast.stderr)
    assert status(run) == "complete"
    done = events(run)
    assert done[-1]["type"] == "cast_end" and done[-1]["data"]["ok"] is True
    assert any(e["type"] == "cast_recast" for e in done)
    assert completes(run) == ["Socket-1", "Socket-2"]
    assert builder_output(run) == "BUILT-BY-CLI"  # the recast re-ran the interrupted builder
    after = [json.dumps(r["messages"]) for r in fake_llm.log()[before:]]
    assert sum("BUILDER-MATERIA" in r for r in after) == 1 and sum("REVIEWER-MATERIA" in r for r in after) == 1


def test_e_materia_status_answers_within_a_second_while_a_turn_runs(start_pi, castor_command, fake_llm, tmp_path):
    root = project(tmp_path, "text")
    pi = start_pi(castor_command, cwd=root, settings={"defaultProjectTrust": "always"}, timeout_ms=CALL_TIMEOUT_MS)
    up(pi)
    fake_llm.reply_text("BUILT later", when="BUILDER-MATERIA", delay=STALL_S)
    start = pi.command("/materia cast build the thing")
    run_dir(root)
    wait_request(fake_llm, "BUILDER-MATERIA")
    for command, expect in [("/materia status", "Socket-1"), ("/materia casts", ""), ("/materia grid", "")]:
        t0 = time.monotonic()
        cmd = pi.command(command)
        note = pi.wait_ui("notify", start=cmd, timeout=5)
        took = time.monotonic() - t0
        assert took < LATENCY_S, (command, took)
        assert note.get("notifyType") != "error" and expect in str(note.get("message")), (command, note)
    assert pi.request({"type": "get_state"})["data"]["isStreaming"] is True, "the turn was still running"
    assert error_toasts(pi, start) == []


def test_materia_config_flag_is_the_sessions_config_and_a_missing_file_is_a_clear_error(start_pi, castor_command,
                                                                                        fake_llm, tmp_path):
    """``--materia-config`` (pi-materia's flag) reaches castor as the session's explicit config layer:
    a relative path resolves in the project; a missing file fails the command that needs it, typed."""
    root = tmp_path / "project"
    (root / "configs").mkdir(parents=True)
    (root / "configs" / "build.json").write_text(json.dumps(loadout("text")))
    pi = start_pi(castor_command, cwd=root, settings={"defaultProjectTrust": "always"}, timeout_ms=CALL_TIMEOUT_MS,
                  extra_args=["--materia-config", "configs/build.json"])
    up(pi)
    cmd = pi.command("/materia grid")
    grid = pi.wait_ui("notify", start=cmd, timeout=20)
    assert grid.get("notifyType") != "error" and "Socket-1" in str(grid.get("message")), grid
    pi.close()

    pi = start_pi(castor_command, cwd=root, settings={"defaultProjectTrust": "always"}, timeout_ms=CALL_TIMEOUT_MS,
                  extra_args=["--materia-config", "configs/missing.json"])
    up(pi)
    cmd = pi.command("/materia cast build it")
    note = pi.wait_ui("notify", lambda e: e.get("notifyType") == "error", start=cmd, timeout=20)
    assert "config file not found" in note["message"] and "missing.json" in note["message"], note
    assert not (root / ".pi" / "pi-materia").exists(), "nothing was started"


# ----------------------------------------------------------------------------- the user types mid-turn
USER_STALL_S = 3.0  # the builder's model call: long enough to type into, short enough for the test


def start_stalled_builder(pi: PiRpc, fake_llm, root: Path) -> tuple[int, Path]:
    start = pi.command("/materia cast build the thing")
    run = run_dir(root)
    wait_request(fake_llm, "BUILDER-MATERIA")
    return start, run


@pytest.mark.parametrize("behaviour", ["followUp", "steer"])
def test_f_a_message_typed_after_the_turn_answers_is_not_the_sockets_output(start_pi, castor_command, fake_llm,
                                                                            tmp_path, behaviour):
    """The user presses Enter while a JSON builder turn streams: Pi answers them in the same run,
    after the builder's answer. The builder's answer is the socket's output, not Pi's reply to the
    user (which would fail the JSON parse or reach the reviewer as the build)."""
    root = project(tmp_path, "json")
    pi = start_pi(castor_command, cwd=root, settings={"defaultProjectTrust": "always"}, timeout_ms=CALL_TIMEOUT_MS)
    up(pi)
    fake_llm.reply_text(BUILT_JSON, when="BUILDER-MATERIA", delay=USER_STALL_S)
    fake_llm.reply_text("REVIEWED-OK", when="REVIEWER-MATERIA")
    start, run = start_stalled_builder(pi, fake_llm, root)
    pi.request({"type": "prompt", "message": "USER-INTERJECTION what time is it", "streamingBehavior": behaviour})
    done = wait_cast_end(pi, run)
    assert done[-1]["data"]["ok"] is True, done[-1]
    assert json.loads(builder_output(run))["summary"] == "BUILT-REAL-JSON"
    assert requests_with(fake_llm, "USER-INTERJECTION"), "Pi answered the user's message"
    assert len(requests_with(fake_llm, "REVIEWER-MATERIA")) == 1
    assert error_toasts(pi, start) == []


def test_g_a_steer_before_the_turn_answered_interrupts_it_and_continue_runs_it_again(start_pi, castor_command,
                                                                                   fake_llm, tmp_path):
    """The user steers between the builder's tool call and its answer: the run's answer is the
    user's, so the turn is interrupted (nothing of it kept) and /materia continue re-runs it."""
    root = project(tmp_path, "json")
    pi = start_pi(castor_command, cwd=root, settings={"defaultProjectTrust": "always"}, timeout_ms=CALL_TIMEOUT_MS)
    up(pi)
    fake_llm.reply_tool_call("read", {"path": "nothing-here.txt"}, when="BUILDER-MATERIA", delay=USER_STALL_S)
    start, run = start_stalled_builder(pi, fake_llm, root)
    pi.request({"type": "prompt", "message": "USER-STEER do something else", "streamingBehavior": "steer"})
    assert poll_until(lambda: any(e["type"] == "turn_interrupted" for e in events(run)), timeout=20), \
        f"the taken-over turn was not interrupted: {[e['type'] for e in events(run)]}"
    assert completes(run) == [] and status(run) == "active"
    assert requests_with(fake_llm, "REVIEWER-MATERIA") == []
    assert error_toasts(pi, start) == []
    pi.wait_for(lambda e: e.get("type") == "agent_settled", start=start, timeout=10)
    fake_llm.reply_text(BUILT_JSON, when="BUILDER-MATERIA")
    fake_llm.reply_text("REVIEWED-OK", when="REVIEWER-MATERIA")
    resumed = pi.command("/materia continue")
    done = wait_cast_end(pi, run)
    assert done[-1]["data"]["ok"] is True, done[-1]
    assert [e["data"]["by"] for e in done if e["type"] == "turn_resumed"] == ["continue"]
    assert json.loads(builder_output(run))["summary"] == "BUILT-REAL-JSON"
    assert error_toasts(pi, resumed) == []


def test_h_continue_typed_during_a_turn_then_esc_runs_the_turn_again(start_pi, castor_command, fake_llm, tmp_path):
    """/materia continue waits for Pi to be idle; Esc then ends the turn. The continue must reach
    castor after the aborted turn's end (which the extension holds a moment to tell an Esc from a
    quit), or castor refuses it: "already awaiting a Pi agent response"."""
    root = project(tmp_path, "text")
    pi = start_pi(castor_command, cwd=root, settings={"defaultProjectTrust": "always"}, timeout_ms=CALL_TIMEOUT_MS)
    up(pi)
    fake_llm.reply_text("BUILT never sent", when="BUILDER-MATERIA", delay=STALL_S)
    start, run = start_stalled_builder(pi, fake_llm, root)
    fake_llm.reply_text("BUILT-AFTER-ESC", when="BUILDER-MATERIA")
    fake_llm.reply_text("REVIEWED-OK", when="REVIEWER-MATERIA")
    # Sent without waiting for its response: Pi answers a command once its handler returns, and
    # this one waits for Pi to be idle. Pi reads its input in order, so the abort comes after it.
    pi.send({"type": "prompt", "message": "/materia continue"})
    pi.request({"type": "abort"})
    done = wait_cast_end(pi, run)
    types = [e["type"] for e in done]
    assert "turn_interrupted" in types and "turn_resumed" in types, types
    assert done[-1]["data"]["ok"] is True and builder_output(run) == "BUILT-AFTER-ESC"
    assert error_toasts(pi, start) == []


def test_i_a_steer_queued_at_an_rpc_abort_does_not_take_over_the_continued_turn(start_pi, castor_command, fake_llm,
                                                                                tmp_path):
    """The user steers while the builder's model call streams, then presses Esc (RPC ``abort``)
    before Pi delivered the steer: Pi's RPC abort keeps the steer queued (its terminal UI puts it
    back in the editor). The ``/materia continue`` that follows must still run the builder's turn
    to its answer -- the stale steer, delivered at that run's start, used to take the turn over
    and interrupt the cast again. (The extension cannot clear Pi's queue: an RPC client drops it
    with ``clear_queue`` before ``abort``, as Pi's terminal Esc does.)"""
    root = project(tmp_path, "text")
    pi = start_pi(castor_command, cwd=root, settings={"defaultProjectTrust": "always"}, timeout_ms=CALL_TIMEOUT_MS)
    up(pi)
    fake_llm.reply_text("BUILT never sent", when="BUILDER-MATERIA", delay=STALL_S)
    start, run = start_stalled_builder(pi, fake_llm, root)
    pi.request({"type": "prompt", "message": "USER-STALE-STEER do something else", "streamingBehavior": "steer"})
    esc = pi.mark()
    pi.request({"type": "abort"})
    assert settled_after(pi, esc)["aborted"] is True
    pi.wait_ui("setStatus", lambda e: str(e.get("statusText", "")).startswith(
        "materia: interrupted at Socket-1 — /materia continue"), start=esc, timeout=5)
    fake_llm.reply_text("BUILT-AFTER-ESC", when="BUILDER-MATERIA")
    fake_llm.reply_text("REVIEWED-OK", when="REVIEWER-MATERIA")
    resumed = pi.command("/materia continue")
    done = wait_cast_end(pi, run)
    assert done[-1]["data"]["ok"] is True, done[-1]
    assert builder_output(run) == "BUILT-AFTER-ESC"
    assert [e["data"]["by"] for e in done if e["type"] == "turn_resumed"] == ["continue"]
    assert error_toasts(pi, resumed) == []
    # The model was asked the turn's prompt last: the stale steer, which Pi delivered with the run,
    # stands in front of it, where the materia's isolated context leaves it out.
    rerun = requests_with(fake_llm, "BUILDER-MATERIA")[-1]["messages"]
    assert "BUILDER-MATERIA" in json.dumps(rerun[-1]) and "USER-STALE-STEER" not in json.dumps(rerun)


def test_j_a_turn_stopped_mid_stream_records_its_usage_as_unknown_not_zero(start_pi, castor_command, fake_llm,
                                                                          tmp_path):
    """Esc while the builder's answer streams: an OpenAI-style provider reports usage only at the
    stream's end, so Pi's stopped message counts zero tokens. The cast's usage records that turn
    as reporting no usage (``unreported: ["tokens"]``, said in the totals' caveats), never as a turn
    that cost nothing; the resumed turn's real usage counts as usual."""
    root = project(tmp_path, "text")
    pi = start_pi(castor_command, cwd=root, settings={"defaultProjectTrust": "always"}, timeout_ms=CALL_TIMEOUT_MS)
    up(pi)
    fake_llm.reply_text("BUILT-HALF and the rest never sent", when="BUILDER-MATERIA", pause=STALL_S)
    start, run = start_stalled_builder(pi, fake_llm, root)
    stopped = esc_mid_stream(pi, run, start)
    assert stopped.get("unreported") == ["tokens"], stopped
    fake_llm.reply_text("BUILT-AFTER-ESC", when="BUILDER-MATERIA")
    fake_llm.reply_text("REVIEWED-OK", when="REVIEWER-MATERIA")
    pi.command("/materia continue")
    done = wait_cast_end(pi, run)
    assert done[-1]["data"]["ok"] is True, done[-1]
    turns = json.loads((run / "usage.json").read_text())["turns"]
    # (the fake model has no price: the answered turns' cost is "unreported", their tokens are not)
    assert [(t["socket"], "tokens" in (t.get("unreported") or [])) for t in turns] == [
        ("Socket-1", True), ("Socket-1", False), ("Socket-2", False)], turns
    end = pi.wait_ui("notify", lambda e: "pi-materia cast complete" in str(e.get("message")), start=start, timeout=5)
    assert "1 turn reported no usage" in str(end.get("message")), end

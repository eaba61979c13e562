"""A crashed cast's turn that castor sends again while Pi is busy in ways other than the user's
streaming answer (test_pi_odd_moments.py has that one): mid-tool-call, compacting, and with a
second crash sending the turn again before the first copy ran.

Real Pi in RPC mode on crashy_serve.py (the real runtime, which kills its cast actors when a file
appears), the FAKE model. The cast runs a utility socket held by a gate, then the Reviewer's turn:
the gate opens while Pi is busy, so castor's Reviewer turn waits for Pi; then the cast's actor
crashes, castor restarts it, stops that turn (``cast_restarted``) and sends it again. What the
user must see: what Pi was doing ends as it would have (the tool's result, the compaction), then
the Reviewer runs once, and the cast completes -- nobody pressed anything, so nothing is
interrupted.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from tests.support.waiting import poll_until, wait_for

from .conftest import session_entries
from .test_pi_cancel_moments import write_loadout
from .test_pi_cancellation import (
    CALL_TIMEOUT_MS,
    completes,
    error_toasts,
    requests_with,
    run_dir,
    up,
    wait_cast_end,
    wait_request,
)

pytestmark = [pytest.mark.pi, pytest.mark.timeout(150)]

CRASHY = Path(__file__).with_name("crashy_serve.py")


def casting_behind_a_gate(start_pi, fake_llm, tmp_path: Path, settings: dict | None = None):
    """Pi on crashy_serve.py casting a gated utility socket, then the Reviewer's turn. Returns Pi,
    the gate, the crash marker, the project root and the mark before the cast."""
    marker = tmp_path / "crash-cast"
    root = tmp_path / "project"
    gate = root / "go"
    write_loadout(root, {"type": "utility", "command": ["sh", "-c", f"while [ ! -e {gate} ]; do sleep 0.05; done"],
                         "timeoutMs": 60000, "edges": [{"when": "always", "to": "Socket-2"}]})
    pi = start_pi([sys.executable, str(CRASHY)], cwd=root,
                  settings={"defaultProjectTrust": "always", **(settings or {})},
                  timeout_ms=CALL_TIMEOUT_MS, env={"CASTOR_CRASH_CAST_FILE": str(marker)})
    up(pi)
    return pi, gate, marker, root


QUEUED = "queued as a follow-up"
HELD = "held until Pi's compaction ends"


def crash(pi, marker: Path, n: int, waits: str = QUEUED) -> None:
    """Crash the cast's actor; return once castor has stopped its turn for the ``n``-th time and
    sent it again (Pi busy: the turn ``waits``, queued as a follow-up or held by the extension)."""
    marker.touch()
    wait_for(lambda: pi.stderr().count("(cast_restarted)") >= n, timeout=10,
             what="castor stopping the turn to send it again")
    assert poll_until(lambda: pi.stderr().count(waits) >= n + 1, timeout=10), pi.stderr()[-3000:]


def the_review_runs_once_and_the_cast_completes(pi, fake_llm, root: Path, begin: int) -> list[dict]:
    run = run_dir(root)
    done = wait_cast_end(pi, run, timeout=30)
    assert done[-1]["data"]["ok"] is True, done[-1]
    assert not any(e["type"] == "turn_interrupted" for e in done), [e["type"] for e in done]
    assert completes(run) == ["Socket-1", "Socket-2"]
    assert len(requests_with(fake_llm, "REVIEWER-MATERIA")) == 1, "the Reviewer's turn ran more than once"
    assert error_toasts(pi, begin) == []
    return done


def test_a_turn_sent_again_while_the_users_run_is_mid_tool_call_runs_after_the_users_answer(start_pi, fake_llm,
                                                                                             tmp_path):
    """The user's run is running a tool (a command that takes 3 s) when the Reviewer's turn is
    asked for and sent again: the tool ends with its result, the user's run answers, then the
    Reviewer runs once."""
    pi, gate, marker, root = casting_behind_a_gate(start_pi, fake_llm, tmp_path)
    tool_done = root / "tool-done"
    fake_llm.reply_tool_call("bash", {"command": f"sleep 3; touch {tool_done}"}, when="USER-BUSY")
    fake_llm.reply_text("USER-ANSWER-STANDS", when="USER-BUSY")
    fake_llm.reply_text("REVIEWED-AFTER-RESTART", when="REVIEWER-MATERIA")
    begin = pi.command("/materia cast build the thing")
    run_dir(root)
    pi.send({"type": "prompt", "message": "USER-BUSY run the slow command"})
    pi.wait_for(lambda e: e.get("type") == "tool_execution_start", start=begin, timeout=15)
    gate.touch()
    assert poll_until(lambda: QUEUED in pi.stderr(), timeout=15), pi.stderr()[-2000:]
    crash(pi, marker, 1)
    assert not tool_done.exists(), "the tool ended before the turn was sent again: the test proves nothing"
    the_review_runs_once_and_the_cast_completes(pi, fake_llm, root, begin)
    assert tool_done.exists(), "the tool was stopped"
    answers = [e for e in pi.events[begin:] if e.get("type") == "message_end"
               and (e.get("message") or {}).get("role") == "assistant"]
    assert any("USER-ANSWER-STANDS" in json.dumps(e) for e in answers), "the user's answer is not in the session"


def test_a_turn_sent_twice_again_behind_the_users_run_runs_once_after_the_users_answer(start_pi, fake_llm,
                                                                                      tmp_path):
    """Two crashes while the Reviewer's turn waits behind the user's run: castor sends it again
    twice before either copy ran. The user's answer stands, then the Reviewer runs once."""
    pi, gate, marker, root = casting_behind_a_gate(start_pi, fake_llm, tmp_path)
    fake_llm.reply_text("USER-ANSWER-STANDS", when="USER-BUSY", delay=6.0)
    fake_llm.reply_text("REVIEWED-AFTER-RESTART", when="REVIEWER-MATERIA", delay=0.5)
    fake_llm.reply_text("REVIEWED-TWICE never wanted", when="REVIEWER-MATERIA")
    begin = pi.command("/materia cast build the thing")
    run_dir(root)
    pi.send({"type": "prompt", "message": "USER-BUSY what is going on"})
    wait_request(fake_llm, "USER-BUSY")
    gate.touch()
    assert poll_until(lambda: QUEUED in pi.stderr(), timeout=15), pi.stderr()[-2000:]
    crash(pi, marker, 1)
    crash(pi, marker, 2)
    assert requests_with(fake_llm, "REVIEWER-MATERIA") == [], "a copy ran before the user's answer"
    the_review_runs_once_and_the_cast_completes(pi, fake_llm, root, begin)
    answers = [e for e in pi.events[begin:] if e.get("type") == "message_end"
               and (e.get("message") or {}).get("role") == "assistant"]
    assert any("USER-ANSWER-STANDS" in json.dumps(e) for e in answers), "the user's answer is not in the session"


def test_a_turn_sent_again_while_pi_compacts_runs_after_the_compaction(start_pi, fake_llm, tmp_path):
    """The user compacts the session (an RPC ``compact``; the model takes 4 s over the summary) when
    the Reviewer's turn is asked for and sent again: the compaction completes, then the Reviewer
    runs once."""
    settings = {"compaction": {"enabled": False, "keepRecentTokens": 50}}
    pi, gate, marker, root = casting_behind_a_gate(start_pi, fake_llm, tmp_path, settings)
    pi.prompt("EARLIER-CHAT about the weather, long enough to be worth a summary")
    pi.prompt("MORE-CHAT about the weather tomorrow, so that there is something before the kept part")
    fake_llm.reply_text("CHECKPOINT-SUMMARY: the user chatted about the weather.", when="concise checkpoint",
                        delay=4.0)
    fake_llm.reply_text("REVIEWED-AFTER-RESTART", when="REVIEWER-MATERIA")
    begin = pi.command("/materia cast build the thing")
    run_dir(root)
    compact_id = pi.send({"type": "compact"})
    wait_request(fake_llm, "concise checkpoint")
    gate.touch()
    assert poll_until(lambda: HELD in pi.stderr(), timeout=15), pi.stderr()[-2000:]
    crash(pi, marker, 1, HELD)
    assert requests_with(fake_llm, "REVIEWER-MATERIA") == [], "the turn ran beside the compaction"
    the_review_runs_once_and_the_cast_completes(pi, fake_llm, root, begin)
    answer = pi.wait_for(lambda e: e.get("type") == "response" and e.get("id") == compact_id, start=begin, timeout=10)
    assert answer.get("success") is True, answer
    types = [e.get("type") for e in pi.events[begin:]]
    assert types.index("compaction_end") < types.index("agent_start"), "the Reviewer's run began mid-compaction"
    compactions = [e for e in session_entries(tmp_path / "sessions") if e.get("type") == "compaction"]
    assert len(compactions) == 1 and "CHECKPOINT-SUMMARY" in compactions[0]["summary"], compactions


def test_abort_cancelling_the_compaction_a_resent_turn_waits_for_lets_the_turn_run(start_pi, fake_llm, tmp_path):
    """The same, then an ``abort`` (a client's Esc) at once after castor sent the turn again: it
    cancels Pi's compaction, and only that -- the turn held for the compaction's end runs once and
    the cast completes. Before, the key counted as stopping the restarted cast's turn (it came
    within the restart's window), and the held turn was stopped as it started: the cast was
    interrupted, though the user had only cancelled the compaction."""
    settings = {"compaction": {"enabled": False, "keepRecentTokens": 50}}
    pi, gate, marker, root = casting_behind_a_gate(start_pi, fake_llm, tmp_path, settings)
    pi.prompt("EARLIER-CHAT about the weather, long enough to be worth a summary")
    pi.prompt("MORE-CHAT about the weather tomorrow, so that there is something before the kept part")
    fake_llm.reply_text("CHECKPOINT-SUMMARY never sent", when="context summarization assistant", delay=60.0)
    fake_llm.reply_text("REVIEWED-AFTER-RESTART", when="REVIEWER-MATERIA")
    begin = pi.command("/materia cast build the thing")
    run_dir(root)
    compact_id = pi.send({"type": "compact"})
    wait_request(fake_llm, "context summarization assistant")
    gate.touch()
    assert poll_until(lambda: HELD in pi.stderr(), timeout=15), pi.stderr()[-2000:]
    crash(pi, marker, 1, HELD)
    pi.request({"type": "abort"})
    answer = pi.wait_for(lambda e: e.get("type") == "response" and e.get("id") == compact_id, start=begin, timeout=10)
    assert answer.get("success") is False, answer
    the_review_runs_once_and_the_cast_completes(pi, fake_llm, root, begin)
    assert "no castor turn is stopped" in pi.stderr()

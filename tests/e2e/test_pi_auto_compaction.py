"""Pi compacts on its own (auto-compaction: the context is near full) while a castor turn waits, and
the user presses Esc (an RPC ``abort``) during that compaction.

Real Pi on the real ``castor serve``, the FAKE model. The cast runs a utility socket held by a gate,
then the Reviewer's turn: the gate opens while the user's own prompt streams, so castor's Reviewer
turn waits behind it (Pi's follow-up queue). The user's answer reports a usage near the model's
window (20000 of 32000 tokens, past Pi's threshold: the window less its 16384 reserved tokens), so
before Pi sends the waiting turn it compacts the session -- asks the model for a summary.

The rule is the user's ``/compact``'s: a stop key while Pi compacts goes to the compaction. It
cancels the compaction and stops no castor turn waiting for its end: the Reviewer's turn runs once,
after it, and the cast completes, not interrupted.
"""

from __future__ import annotations

import json
import threading
import time

import pytest

from tests.support.waiting import poll_until, wait_for

from .pi_tty import ESC
from .test_pi_cancel_moments import write_loadout
from .test_pi_cancellation import (
    CALL_TIMEOUT_MS,
    STALL_S,
    completes,
    error_toasts,
    events,
    requests_with,
    run_dir,
    up,
    wait_cast_end,
    wait_request,
)
from .test_pi_compact_while_turn_waits import QUEUED, SUMMARY

pytestmark = [pytest.mark.pi, pytest.mark.timeout(150)]

SETTINGS = {"defaultProjectTrust": "always", "compaction": {"enabled": True, "keepRecentTokens": 50}}
# Past Pi's auto-compaction threshold for the fake model (window 32000, 16384 reserved).
NEAR_FULL = {"prompt_tokens": 20000, "completion_tokens": 5, "total_tokens": 20005}


def gated_loadout(root):
    gate = root / "go"
    write_loadout(root, {"type": "utility", "command": ["sh", "-c", f"while [ ! -e {gate} ]; do sleep 0.05; done"],
                         "timeoutMs": 60000, "edges": [{"when": "always", "to": "Socket-2"}]})
    return gate


def the_review_ran_once_after_the_summary_request(fake_llm, run) -> None:
    done = events(run)
    assert done[-1]["type"] == "cast_end" and done[-1]["data"]["ok"] is True, done[-1]
    assert not any(e["type"] == "turn_interrupted" for e in done), [e["type"] for e in done]
    assert completes(run) == ["Socket-1", "Socket-2"]
    assert len(requests_with(fake_llm, "REVIEWER-MATERIA")) == 1, "the Reviewer's turn ran more than once"
    log = [json.dumps(r["messages"]) for r in fake_llm.log()]
    first_review = min(i for i, r in enumerate(log) if "REVIEWER-MATERIA" in r)
    assert min(i for i, r in enumerate(log) if SUMMARY in r) < first_review


def test_abort_during_pis_auto_compaction_stops_no_castor_turn_waiting_for_it(start_pi, castor_command, fake_llm,
                                                                              tmp_path):
    """RPC: the user's answer fills the context; Pi compacts before it sends the waiting turn, and an
    ``abort`` comes while the summary streams. The turn runs once, after it; the cast completes."""
    root = tmp_path / "project"
    gate = gated_loadout(root)
    pi = start_pi(castor_command, cwd=root, settings=SETTINGS, timeout_ms=CALL_TIMEOUT_MS)
    up(pi)
    pi.prompt("EARLIER-CHAT about the weather, long enough to be worth a summary")
    pi.prompt("MORE-CHAT about the weather tomorrow, so that there is something before the kept part")
    begin = pi.command("/materia cast build the thing")
    run = run_dir(root)
    answer = threading.Event()
    fake_llm.reply_text("USER-ANSWER that fills the context", when="USER-BUSY", usage=NEAR_FULL, hold=answer)
    pi.send({"type": "prompt", "message": "USER-BUSY what is going on"})
    wait_request(fake_llm, "USER-BUSY")
    gate.touch()  # the utility ends: castor asks for Socket-2's turn while the user's run streams
    assert poll_until(lambda: QUEUED in pi.stderr(), timeout=15), pi.stderr()[-2000:]
    fake_llm.reply_text("CHECKPOINT-SUMMARY never sent", when=SUMMARY, delay=STALL_S)
    fake_llm.reply_text("REVIEWED-AFTER-CANCEL", when="REVIEWER-MATERIA")
    answer.set()
    wait_request(fake_llm, SUMMARY)
    assert requests_with(fake_llm, "REVIEWER-MATERIA") == [], "the turn ran before (or beside) the compaction"
    pi.request({"type": "abort"})
    wait_cast_end(pi, run, timeout=40)
    the_review_ran_once_after_the_summary_request(fake_llm, run)
    ends = [e for e in pi.events[begin:] if e.get("type") == "compaction_end"]
    assert ends and ends[0].get("aborted") is True and ends[0].get("reason") == "threshold", ends
    assert error_toasts(pi, begin) == []


def test_esc_during_pis_auto_compaction_in_the_terminal_stops_no_castor_turn(start_tty, castor_command, fake_llm,
                                                                             tmp_path):
    """The same in Pi's terminal UI: Esc while Pi's auto-compaction's summary streams cancels the
    compaction (Pi says 'Auto-compaction cancelled'); the waiting turn runs once and the cast completes."""
    root = tmp_path / "project"
    gate = gated_loadout(root)
    pi = start_tty(castor_command, settings=SETTINGS)
    wait_for(lambda: "castor: up" in pi.screen_tail(100_000), timeout=30,
             what=f"castor up; Pi drew: {pi.screen_tail()!r}")
    fake_llm.reply_text("EARLIER-ANSWER about the weather, long enough to be worth a summary", when="EARLIER-CHAT")
    pi.type("EARLIER-CHAT about the weather, long enough to be worth a summary")
    wait_for(lambda: "EARLIER-ANSWER" in pi.screen_tail(100_000), timeout=20,
             what=f"the earlier answer; Pi drew: {pi.screen_tail()!r}")
    fake_llm.reply_text("MORE-ANSWER about the weather tomorrow, so that there is something before the kept part",
                        when="MORE-CHAT")
    pi.type("MORE-CHAT about the weather tomorrow, so that there is something before the kept part")
    wait_for(lambda: "MORE-ANSWER" in pi.screen_tail(100_000), timeout=20,
             what=f"the second answer; Pi drew: {pi.screen_tail()!r}")
    pi.type("/materia cast build the thing")
    run = run_dir(root)
    answer = threading.Event()
    fake_llm.reply_text("USER-ANSWER that fills the context", when="USER-BUSY", usage=NEAR_FULL, hold=answer)
    pi.type("USER-BUSY what is going on")
    wait_request(fake_llm, "USER-BUSY")
    gate.touch()
    wait_for(lambda: "materia: Reviewer (Socket-2)" in pi.screen_tail(100_000), timeout=15,
             what=f"Socket-2's turn asked for; Pi drew: {pi.screen_tail()!r}")
    time.sleep(0.3)  # the turn's hidden prompt reaches Pi's queue (drawn first, sent a moment later)
    fake_llm.reply_text("CHECKPOINT-SUMMARY never sent", when=SUMMARY, delay=STALL_S)
    fake_llm.reply_text("REVIEWED-AFTER-CANCEL", when="REVIEWER-MATERIA")
    answer.set()
    wait_for(lambda: requests_with(fake_llm, SUMMARY), timeout=15,
             what=f"the auto-compaction's summary request; Pi drew: {pi.screen_tail()!r}")
    assert requests_with(fake_llm, "REVIEWER-MATERIA") == [], "the turn ran before (or beside) the compaction"
    pi.press(ESC)
    wait_for(lambda: any(e["type"] == "cast_end" for e in events(run)), timeout=40,
             what=f"the cast's end; Pi drew: {pi.screen_tail()!r}")
    the_review_ran_once_after_the_summary_request(fake_llm, run)
    assert "Auto-compaction cancelled" in pi.screen_tail(100_000)

"""The user compacts the session (an RPC ``compact``) while a castor turn waits: behind the user's
own streaming run, or held by the extension until a compaction ends.

Real Pi in RPC mode on the real ``castor serve``, the FAKE model. The cast runs a utility socket
held by a gate, then the Reviewer's turn: the gate opens while Pi is busy, so castor's Reviewer turn
waits for Pi.

- ``compact`` while the user's run streams: Pi aborts that run to compact. Nobody pressed Esc, so
  the extension sent the waiting turn again at once -- and Pi started it before its compaction
  (which then waited for the whole turn, or it ran beside it). The user asked for a compaction, not
  for the cast to stop: the turn now waits for the compaction's end, then runs once, with the
  compacted context, and the cast completes.
- an ``abort`` (a client's Esc) that cancels a compaction while a turn is held for it: Pi's own
  messages typed during a compaction are sent when it is cancelled; the held turn likewise runs
  once the compaction is cancelled, and the cast completes.
"""

from __future__ import annotations

import json
import threading
import time

import pytest

from tests.support.waiting import poll_until, wait_for

from .conftest import session_entries
from .pi_tty import ENTER, ESC
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

pytestmark = [pytest.mark.pi, pytest.mark.timeout(150)]

QUEUED = "queued as a follow-up"
HELD = "held until Pi's compaction ends"
# The system prompt of every request of Pi's for a compaction's summary.
SUMMARY = "context summarization assistant"
SETTINGS = {"defaultProjectTrust": "always", "compaction": {"enabled": False, "keepRecentTokens": 50}}


def casting_behind_a_gate(start_pi, castor_command, tmp_path):
    root = tmp_path / "project"
    gate = root / "go"
    write_loadout(root, {"type": "utility", "command": ["sh", "-c", f"while [ ! -e {gate} ]; do sleep 0.05; done"],
                         "timeoutMs": 60000, "edges": [{"when": "always", "to": "Socket-2"}]})
    pi = start_pi(castor_command, cwd=root, settings=SETTINGS, timeout_ms=CALL_TIMEOUT_MS)
    up(pi)
    # Something worth a summary before the kept part.
    pi.prompt("EARLIER-CHAT about the weather, long enough to be worth a summary")
    pi.prompt("MORE-CHAT about the weather tomorrow, so that there is something before the kept part")
    return pi, gate, root


def the_review_runs_once_after_the_compaction(pi, fake_llm, root, begin, compact_id, compacted: bool) -> None:
    run = run_dir(root)
    done = wait_cast_end(pi, run, timeout=40)
    assert done[-1]["data"]["ok"] is True, done[-1]
    assert not any(e["type"] == "turn_interrupted" for e in done), [e["type"] for e in done]
    assert completes(run) == ["Socket-1", "Socket-2"]
    assert len(requests_with(fake_llm, "REVIEWER-MATERIA")) == 1, "the Reviewer's turn ran more than once"
    answer = pi.wait_for(lambda e: e.get("type") == "response" and e.get("id") == compact_id, start=begin, timeout=10)
    assert answer.get("success") is compacted, answer
    types = [e.get("type") for e in pi.events[begin:]]
    ends = [i for i, t in enumerate(types) if t == "compaction_end"]
    review_starts = [i for i, e in enumerate(pi.events[begin:]) if e.get("type") == "agent_start"]
    assert ends and review_starts[-1] > ends[0], "the Reviewer's run began before the compaction ended"
    log = [json.dumps(r["messages"]) for r in fake_llm.log()]
    summary_at = [i for i, r in enumerate(log) if SUMMARY in r]
    review_at = [i for i, r in enumerate(log) if "REVIEWER-MATERIA" in r]
    assert summary_at and review_at and summary_at[0] < review_at[0], \
        "the Reviewer's request went out before the compaction's summary call"
    assert error_toasts(pi, begin) == []


def test_compact_while_the_users_run_streams_and_a_turn_waits_behind_it(start_pi, castor_command, fake_llm, tmp_path):
    """``compact`` aborts the user's streaming run: the turn queued behind it waits for the
    compaction's end (the summary takes 4 s), then runs once; the cast is not interrupted."""
    pi, gate, root = casting_behind_a_gate(start_pi, castor_command, tmp_path)
    begin = pi.command("/materia cast build the thing")
    run_dir(root)
    fake_llm.reply_text("USER-ANSWER never sent", when="USER-BUSY", delay=STALL_S)
    pi.send({"type": "prompt", "message": "USER-BUSY what is going on"})
    wait_request(fake_llm, "USER-BUSY")
    gate.touch()  # the utility ends: castor asks for Socket-2's turn while the user's run streams
    assert poll_until(lambda: QUEUED in pi.stderr(), timeout=15), pi.stderr()[-2000:]
    fake_llm.reply_text("CHECKPOINT-SUMMARY: the user chatted about the weather.", when=SUMMARY,
                        delay=4.0)
    fake_llm.reply_text("REVIEWED-AFTER-COMPACT", when="REVIEWER-MATERIA")
    compact_id = pi.send({"type": "compact"})
    wait_request(fake_llm, SUMMARY)
    assert requests_with(fake_llm, "REVIEWER-MATERIA") == [], "the turn ran before (or beside) the compaction"
    the_review_runs_once_after_the_compaction(pi, fake_llm, root, begin, compact_id, compacted=True)
    compactions = [e for e in session_entries(tmp_path / "sessions") if e.get("type") == "compaction"]
    assert len(compactions) == 1 and "CHECKPOINT-SUMMARY" in compactions[0]["summary"], compactions


def test_abort_cancelling_the_compaction_a_turn_waits_for_lets_the_turn_run(start_pi, castor_command, fake_llm,
                                                                           tmp_path):
    """The same ``compact``, then an ``abort`` (a client's Esc) while the summary streams: Pi cancels
    the compaction; the turn held for its end then runs once and the cast completes -- the key
    went to the compaction, as Pi's own messages queued during it are sent when it is cancelled."""
    pi, gate, root = casting_behind_a_gate(start_pi, castor_command, tmp_path)
    begin = pi.command("/materia cast build the thing")
    run_dir(root)
    fake_llm.reply_text("USER-ANSWER never sent", when="USER-BUSY", delay=STALL_S)
    pi.send({"type": "prompt", "message": "USER-BUSY what is going on"})
    wait_request(fake_llm, "USER-BUSY")
    gate.touch()
    assert poll_until(lambda: QUEUED in pi.stderr(), timeout=15), pi.stderr()[-2000:]
    fake_llm.reply_text("CHECKPOINT-SUMMARY never sent", when=SUMMARY, delay=STALL_S)
    fake_llm.reply_text("REVIEWED-AFTER-CANCEL", when="REVIEWER-MATERIA")
    compact_id = pi.send({"type": "compact"})
    wait_request(fake_llm, SUMMARY)
    assert poll_until(lambda: HELD in pi.stderr(), timeout=5), pi.stderr()[-2000:]
    pi.request({"type": "abort"})
    the_review_runs_once_after_the_compaction(pi, fake_llm, root, begin, compact_id, compacted=False)
    assert not [e for e in session_entries(tmp_path / "sessions") if e.get("type") == "compaction"]


def _turn_waiting_behind_the_users_run(start_tty, castor_command, fake_llm, tmp_path):
    """Pi's terminal UI with a cast whose utility socket waits for a gate, two chat turns (something
    to summarise), then the user's prompt streaming (its answer stalls) when the gate opens: the next
    socket's turn is asked for and waits behind the user's run. Pi and the cast's run directory."""
    root = tmp_path / "project"
    gate = root / "go"
    write_loadout(root, {"type": "utility", "command": ["sh", "-c", f"while [ ! -e {gate} ]; do sleep 0.05; done"],
                         "timeoutMs": 60000, "edges": [{"when": "always", "to": "Socket-2"}]})
    pi = start_tty(castor_command, settings=SETTINGS)
    wait_for(lambda: "castor: up" in pi.screen_tail(100_000), timeout=30,
             what=f"castor up; Pi drew: {pi.screen_tail()!r}")
    pi.type("/materia cast build the thing")
    run = run_dir(root)
    fake_llm.reply_text("EARLIER-ANSWER about the weather, long enough to be worth a summary", when="EARLIER-CHAT")
    pi.type("EARLIER-CHAT about the weather, long enough to be worth a summary")
    wait_for(lambda: "EARLIER-ANSWER" in pi.screen_tail(100_000), timeout=20,
             what=f"the earlier answer; Pi drew: {pi.screen_tail()!r}")
    fake_llm.reply_text("MORE-ANSWER about the weather tomorrow, so that there is something before the kept part",
                        when="MORE-CHAT")
    pi.type("MORE-CHAT about the weather tomorrow, so that there is something before the kept part")
    wait_for(lambda: "MORE-ANSWER" in pi.screen_tail(100_000), timeout=20,
             what=f"the second answer; Pi drew: {pi.screen_tail()!r}")
    fake_llm.reply_text("USER-ANSWER never sent", when="USER-BUSY", delay=STALL_S)
    pi.type("USER-BUSY what is going on")
    wait_request(fake_llm, "USER-BUSY")
    gate.touch()
    wait_for(lambda: "materia: Reviewer (Socket-2)" in pi.screen_tail(100_000), timeout=15,
             what=f"Socket-2's turn asked for; Pi drew: {pi.screen_tail()!r}")
    return pi, run


def test_compact_in_the_terminal_while_the_users_run_streams_then_esc_cancels_it(start_tty, castor_command,
                                                                                 fake_llm, tmp_path):
    """The same in Pi's terminal UI: ``/compact`` typed while the user's prompt streams and the next
    socket's turn waits behind it, then Esc while the summary streams. The key cancels the
    compaction, and only that: the held turn then runs once and the cast completes."""
    pi, run = _turn_waiting_behind_the_users_run(start_tty, castor_command, fake_llm, tmp_path)
    fake_llm.reply_text("CHECKPOINT-SUMMARY never sent", when=SUMMARY, delay=STALL_S)
    fake_llm.reply_text("REVIEWED-AFTER-CANCEL", when="REVIEWER-MATERIA")
    pi.type("/compact")  # Enter takes the completion Pi lists for it ...
    time.sleep(0.3)
    pi.press(ENTER)  # ... and this one submits (on an empty editor it does nothing)
    wait_for(lambda: requests_with(fake_llm, SUMMARY), timeout=15,
             what=f"the compaction's summary request; Pi drew: {pi.screen_tail()!r}")
    assert requests_with(fake_llm, "REVIEWER-MATERIA") == [], "the turn ran before (or beside) the compaction"
    pi.press(ESC)
    done = wait_cast_end_in(run, pi)
    assert done[-1]["data"]["ok"] is True, done[-1]
    assert not any(e["type"] == "turn_interrupted" for e in done), [e["type"] for e in done]
    assert completes(run) == ["Socket-1", "Socket-2"]
    assert len(requests_with(fake_llm, "REVIEWER-MATERIA")) == 1, "the Reviewer's turn ran more than once"
    log = [json.dumps(r["messages"]) for r in fake_llm.log()]
    first_review = min(i for i, r in enumerate(log) if "REVIEWER-MATERIA" in r)
    assert min(i for i, r in enumerate(log) if SUMMARY in r) < first_review
    assert not [e for e in session_entries(tmp_path / "sessions") if e.get("type") == "compaction"]


def wait_cast_end_in(run, pi) -> list[dict]:
    wait_for(lambda: any(e["type"] == "cast_end" for e in events(run)), timeout=30,
             what=f"the cast's end; Pi drew: {pi.screen_tail()!r}")
    return events(run)


def test_a_held_turn_waits_for_the_prompt_the_user_typed_during_the_compaction(start_tty, castor_command, fake_llm,
                                                                               tmp_path):
    """``/compact`` typed while the user's prompt streams and the next socket's turn waits behind it,
    then a new prompt typed while the summary streams: Pi holds that prompt and sends it as the
    compaction ends, so the user's new run streams when the held turn is sent again. The turn waits
    for that run's end and runs once, as its own turn -- it used to go to Pi as a steer message, taken
    into the user's run after its tool call, before its answer."""
    pi, run = _turn_waiting_behind_the_users_run(start_tty, castor_command, fake_llm, tmp_path)
    summary = threading.Event()
    fake_llm.reply_text("CHECKPOINT-SUMMARY: the user chatted about the weather.", when=SUMMARY, hold=summary)
    fake_llm.reply_tool_call("bash", {"command": "echo NEXT-TOOL-RAN"}, when="USER-NEXT")
    fake_llm.reply_text("REVIEWED-AFTER-THE-USER", when="REVIEWER-MATERIA")
    pi.type("/compact")  # Enter takes the completion Pi lists for it ...
    time.sleep(0.3)
    pi.press(ENTER)  # ... and this one submits (on an empty editor it does nothing)
    wait_for(lambda: requests_with(fake_llm, SUMMARY), timeout=15,
             what=f"the compaction's summary request; Pi drew: {pi.screen_tail()!r}")
    pi.type("USER-NEXT run the tool")  # Pi holds it while it compacts, sends it at the end
    wait_for(lambda: "USER-NEXT" in pi.screen_tail(100_000), timeout=10,
             what=f"the prompt typed during the compaction; Pi drew: {pi.screen_tail()!r}")
    summary.set()
    done = wait_cast_end_in(run, pi)
    assert done[-1]["data"]["ok"] is True, done[-1]
    assert not any(e["type"] == "turn_interrupted" for e in done), [e["type"] for e in done]
    assert completes(run) == ["Socket-1", "Socket-2"]
    assert len(requests_with(fake_llm, "REVIEWER-MATERIA")) == 1, "the Reviewer's turn ran more than once"
    log = fake_llm.log()
    first_review = min(i for i, r in enumerate(log) if "REVIEWER-MATERIA" in json.dumps(r["messages"]))
    # (Pi runs the user's tool call with the tool scope of the turn waiting, the Reviewer's: none. The
    # request with the call's result is the user's run going on, whatever the result says.)
    tool_answers = [i for i, r in enumerate(log) if r["messages"][-1].get("role") == "tool"]
    assert tool_answers, "the user's run never asked the model about its tool's result: the turn took it over"
    assert tool_answers[0] < first_review, "the Reviewer's turn went out before the user's run answered"

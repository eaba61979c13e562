"""The extension's side of aborting a castor turn, driven through real Pi with the PROBE castor.

castor → harness: the notification ``agent.abort_turn {session_id, turn_id, reason}`` (sent when a
cast is aborted while its turn runs). The extension must abort Pi's run in flight now, report the
turn's end once (``aborted: true``), never start that turn again, and raise no "did not take the
end of turn" toast for a turn castor aborted. ``/materia abort`` and the read-only ``/materia``
commands run while a turn is in flight (they no longer wait for Pi to be idle).

The fake model stalls the turn (its reply starts after 8 s), so a run that was not aborted would
still be streaming when the asserts run.
"""

from __future__ import annotations

import json
import time

import pytest

from tests.support.waiting import poll_until

from .conftest import read_jsonl

pytestmark = [pytest.mark.pi, pytest.mark.timeout(60)]

STALL_S = 8.0
#: The issue's latency bound for an abort ("within 1 s"); generous for a 2-core CI box running Pi.
ABORT_LATENCY_S = 1.0


def calls(log, method):
    return [c["params"] for c in read_jsonl(log) if c["method"] == method]


def start_stalled_turn(pi, log, fake_llm, marker: str) -> int:
    """A user prompt makes the probe ask for a castor turn whose model call stalls; returns once
    the turn's request reached the model (the run is streaming)."""
    fake_llm.reply_text("LATE-ANSWER", when=f"TURN: {marker}", delay=STALL_S)
    start = pi.mark()
    pi.prompt(f"PROBE turn {marker}")
    assert poll_until(lambda: any(f"TURN: {marker}" in json.dumps(r["messages"]) for r in fake_llm.log()),
                      timeout=15), "the castor turn never reached the model"
    return start


@pytest.fixture
def probe(start_pi, probe_command):
    def start(**env):
        command, log = probe_command
        pi = start_pi(command, env={"CASTOR_PROBE_LOG": str(log), **env}, timeout_ms=15000)
        pi.wait_ui("setStatus", lambda e: str(e.get("statusText", "")).startswith("castor: up"), timeout=40)
        assert poll_until(lambda: calls(log, "session.open"), timeout=10)
        return pi, log
    return start


def no_error_toasts(pi, start):
    errors = [e.get("message") for e in pi.ui("notify", start=start) if e.get("notifyType") == "error"]
    assert errors == [], errors


def test_abort_turn_aborts_the_running_turn_at_once_and_reports_it_once(probe, fake_llm):
    pi, log = probe()
    start = start_stalled_turn(pi, log, fake_llm, "STALL-ONE")
    requests_before = len(fake_llm.log())
    t0 = time.monotonic()
    cmd = pi.command("/materia abort")  # answered while the turn streams (no idle wait)
    pi.wait_ui("notify", lambda e: "probe cast.abort probe-1" in e.get("message", ""), start=cmd, timeout=5)
    answered = time.monotonic() - t0
    settled = pi.wait_for(lambda e: e.get("type") == "agent_settled", start=cmd, timeout=5)
    stopped = time.monotonic() - t0
    assert settled["aborted"] is True
    assert answered < ABORT_LATENCY_S and stopped < ABORT_LATENCY_S, (answered, stopped)
    assert poll_until(lambda: calls(log, "agent.turn_ended"), timeout=5)
    ended = calls(log, "agent.turn_ended")
    assert [e["turn_id"] for e in ended] == ["probe-1"]
    # Stopped before the provider said what it used (the stall is before the first byte): unknown.
    assert ended[0]["aborted"] is True and ended[0]["usage"] is None and ended[0]["usages"] == []
    abort = calls(log, "cast.abort")
    assert len(abort) == 1
    # Nothing more is asked of the model, and Pi is idle (no queued run of the turn started).
    state = pi.request({"type": "get_state"})
    assert state["data"]["isStreaming"] is False
    assert len(fake_llm.log()) == requests_before
    no_error_toasts(pi, start)


def test_abort_twice_is_one_abort(probe, fake_llm):
    pi, log = probe(CASTOR_PROBE_ABORT_TWICE="1")
    start = start_stalled_turn(pi, log, fake_llm, "STALL-TWICE")
    cmd = pi.command("/materia abort")
    pi.wait_for(lambda e: e.get("type") == "agent_settled", start=cmd, timeout=5)
    again = pi.command("/materia abort")  # the second command: no turn any more
    pi.wait_ui("notify", lambda e: "probe cast.abort no turn" in e.get("message", ""), start=again, timeout=5)
    assert poll_until(lambda: calls(log, "agent.turn_ended"), timeout=5)
    assert [e["turn_id"] for e in calls(log, "agent.turn_ended")] == ["probe-1"]
    assert calls(log, "agent.turn_ended")[0]["aborted"] is True
    no_error_toasts(pi, start)


def test_esc_then_abort(probe, fake_llm):
    """Esc (the RPC abort) ends the turn as aborted, its usage unknown (null: the provider had said
    nothing of it yet); a later /materia abort finds no turn to stop and raises no error."""
    pi, log = probe()
    start = start_stalled_turn(pi, log, fake_llm, "STALL-ESC")
    esc = pi.mark()
    pi.request({"type": "abort"})
    pi.wait_for(lambda e: e.get("type") == "agent_settled", start=esc, timeout=5)
    assert poll_until(lambda: calls(log, "agent.turn_ended"), timeout=5)
    ended = calls(log, "agent.turn_ended")[0]
    assert ended["aborted"] is True and ended["stop_reason"] == "aborted"
    assert ended["usage"] is None and ended["usages"] == []
    cmd = pi.command("/materia abort")
    pi.wait_ui("notify", lambda e: "probe cast.abort no turn" in e.get("message", ""), start=cmd, timeout=5)
    assert len(calls(log, "agent.turn_ended")) == 1
    no_error_toasts(pi, start)


def test_abort_while_the_turn_is_ending_raises_no_toast(probe, fake_llm):
    """The turn's end is on the wire (castor holds it) when the abort lands; castor then refuses the
    end ("no pending turn"): the user is not told castor failed to take it."""
    pi, log = probe(CASTOR_PROBE_HOLD_TURN_END="10")
    fake_llm.reply_text("QUICK-ANSWER", when="TURN: ENDING")
    start = pi.mark()
    pi.prompt("PROBE turn ENDING")
    assert poll_until(lambda: calls(log, "turn_end_held"), timeout=15), "the turn's end never reached the probe"
    cmd = pi.command("/materia abort")
    pi.wait_ui("notify", lambda e: "probe cast.abort probe-1" in e.get("message", ""), start=cmd, timeout=5)
    # The refused end comes back to the extension right after the abort; give its toast a chance.
    assert poll_until(lambda: "end of aborted turn probe-1 not taken" in pi.stderr(), timeout=5), pi.stderr()[-2000:]
    no_error_toasts(pi, start)


def test_read_only_commands_answer_while_a_turn_runs(probe, fake_llm):
    pi, log = probe()
    start_stalled_turn(pi, log, fake_llm, "STALL-STATUS")
    t0 = time.monotonic()
    cmd = pi.command("/materia status")
    pi.wait_ui("notify", lambda e: "probe cast.status" in e.get("message", ""), start=cmd, timeout=5)
    assert time.monotonic() - t0 < ABORT_LATENCY_S
    state = pi.request({"type": "get_state"})
    assert state["data"]["isStreaming"] is True, "the turn is still running"
    pi.request({"type": "abort"})


def test_a_turn_asked_for_while_pi_is_busy_runs_as_a_follow_up_and_reports_its_own_answer(probe, fake_llm):
    """castor asks for a turn while the user's run streams: Pi delivers it inside that run (no
    before_agent_start); the extension binds it there and reports only the turn's own answer."""
    pi, log = probe()
    fake_llm.reply_text("USER-ANSWER", when="PROBE busyturn", delay=1.5)  # the user's run is busy meanwhile
    fake_llm.reply_text("FOLLOW-UP-ANSWER", when="TURN: BUSY-ONE")
    start = pi.mark()
    pi.request({"type": "prompt", "message": "PROBE busyturn BUSY-ONE"})
    assert poll_until(lambda: calls(log, "agent.turn_ended"), timeout=20), pi.tail()
    (ended,) = calls(log, "agent.turn_ended")
    assert ended["turn_id"] == "probe-1" and ended["text"] == "FOLLOW-UP-ANSWER" and ended["aborted"] is False
    assert ended["usage"]["input"] == 10, "the user's answer is not counted as the turn's"
    no_error_toasts(pi, start)


def test_an_abort_while_castor_answers_the_turns_before_agent_start_reports_the_turn_aborted(probe, fake_llm):
    """castor slow to answer a castor turn's own before_agent_start, and the RPC client aborts (its
    Esc): the wait ends at once, the run stops before its first model request, and the turn's end
    is reported once, aborted -- never left bound with castor waiting for it."""
    pi, log = probe(CASTOR_PROBE_SLOW_TURN_START="8")
    start = pi.mark()
    pi.prompt("PROBE turn SLOWSTART")
    assert poll_until(lambda: [c for c in calls(log, "harness.event") if c["event"] == "before_agent_start"
                               and c["data"].get("message_type") == "custom"], timeout=15)
    t0 = time.monotonic()
    pi.request({"type": "abort"}, timeout=20)
    assert poll_until(lambda: calls(log, "agent.turn_ended"), timeout=3.0), "no end of the aborted turn"
    assert time.monotonic() - t0 < 3.0
    (ended,) = calls(log, "agent.turn_ended")
    assert ended["turn_id"] == "probe-1" and ended["aborted"] is True, ended
    assert not any("TURN: SLOWSTART" in json.dumps(r["messages"]) for r in fake_llm.log())
    no_error_toasts(pi, start)



def test_an_abort_while_a_follow_up_turn_waits_in_pis_queue_reports_it_interrupted(probe, fake_llm):
    """castor asked for a turn while the user's run streamed (Pi queues it as a follow-up), and the
    run is aborted before it got there. Pi's Esc drops the queue; an RPC abort leaves it until the
    next prompt: either way the turn never ran, and castor -- told nothing -- waited for it (the
    cast stuck "awaiting", `/materia continue` refused). Its end is now reported at once, aborted
    (castor interrupts the cast: continue runs it), and a late delivery of its prompt is stopped."""
    pi, log = probe()
    fake_llm.reply_text("USER-ANSWER", when="PROBE busyturn", delay=STALL_S)
    start = pi.mark()
    pi.request({"type": "prompt", "message": "PROBE busyturn QUEUED-ONE"})
    assert poll_until(lambda: "queued as a follow-up" in pi.stderr(), timeout=10), pi.stderr()[-2000:]
    pi.request({"type": "abort"})
    assert poll_until(lambda: calls(log, "agent.turn_ended"), timeout=3.0), "the queued turn's end was never reported"
    (ended,) = calls(log, "agent.turn_ended")
    assert ended["turn_id"] == "probe-1" and ended["aborted"] is True and ended["text"] == "", ended
    no_error_toasts(pi, start)
    # The next prompt is the user's: the stale hidden prompt Pi still held is not run as a turn.
    fake_llm.reply_text("NEXT-ANSWER", when="NEXT-PROMPT")
    pi.prompt("NEXT-PROMPT hello")
    assert any("NEXT-PROMPT" in json.dumps(r["messages"]) for r in fake_llm.log())
    assert len(calls(log, "agent.turn_ended")) == 1, calls(log, "agent.turn_ended")
    assert not any(json.dumps(r["messages"]).endswith('"TURN: QUEUED-ONE"}]}]') for r in fake_llm.log()), \
        "the withdrawn turn's prompt reached the model"
    # Stopping the stale prompt is not the user's abort: their exchange ended with its answer, and
    # castor hears it so (a memory capture of it is not skipped as an aborted run).
    assert poll_until(lambda: _settled_after(log, "NEXT-PROMPT"), timeout=10), calls(log, "harness.event")
    ended_run, settled_run = _settled_after(log, "NEXT-PROMPT")
    assert ended_run["last_answer"] == {"text": "NEXT-ANSWER", "stop_reason": "stop"}, ended_run
    assert settled_run["data"]["aborted"] is False, settled_run


def _settled_after(log, prompt_marker: str):
    """The ``agent_end`` and ``agent_settled`` events castor heard for the run of the prompt with
    ``prompt_marker``, once it settled."""
    events = calls(log, "harness.event")
    starts = [i for i, e in enumerate(events) if e["event"] == "before_agent_start"
              and prompt_marker in str(e["data"].get("prompt"))]
    if not starts:
        return None
    after = events[starts[-1]:]
    # The run's own settle follows its agent_end: an earlier run's settle, reported late (after
    # the quit grace of an aborted run), may reach castor after this run's before_agent_start.
    ends = [i for i, e in enumerate(after) if e["event"] == "agent_end"]
    if not ends:
        return None
    settles = [e for e in after[ends[-1]:] if e["event"] == "agent_settled"]
    return (after[ends[-1]], settles[0]) if settles else None


def test_materia_abort_while_a_follow_up_turn_waits_in_pis_queue_never_runs_it(probe, fake_llm):
    """`/materia abort` while castor's turn waits behind the user's run: the turn is dropped (never
    reported: castor stopped waiting for it), the user's run answers, and when Pi delivers the
    dropped prompt at the end of that run, it is stopped there -- no model request for it."""
    pi, log = probe()
    fake_llm.reply_text("USER-ANSWER", when="PROBE busyturn", delay=2.0)
    start = pi.mark()
    pi.send({"type": "prompt", "message": "PROBE busyturn DROPPED-ONE"})
    assert poll_until(lambda: "queued as a follow-up" in pi.stderr(), timeout=10), pi.stderr()[-2000:]
    pi.command("/materia abort")
    assert poll_until(lambda: calls(log, "cast.abort"), timeout=5)
    pi.wait_for(lambda e: e.get("type") == "agent_settled", start=start, timeout=20)
    assert any("USER-ANSWER" in json.dumps(e.get("messages", "")) for e in pi.events[start:]
               if e.get("type") == "agent_end"), "the user's run answered"
    assert not any(json.dumps(r["messages"]).endswith('"TURN: DROPPED-ONE"}]}]') for r in fake_llm.log())
    assert calls(log, "agent.turn_ended") == []
    no_error_toasts(pi, start)
    # The stop at the dropped prompt is the extension's: castor hears the user's run settled, with
    # the user's answer as its last (a memory capture of the exchange is not skipped).
    assert poll_until(lambda: _settled_after(log, "DROPPED-ONE"), timeout=10), calls(log, "harness.event")
    ended_run, settled_run = _settled_after(log, "DROPPED-ONE")
    assert ended_run["last_answer"] == {"text": "USER-ANSWER", "stop_reason": "stop"}, ended_run
    assert settled_run["data"]["aborted"] is False, settled_run


def test_an_rpc_abort_while_castor_answers_a_context_event_ends_the_run_at_once(probe, fake_llm):
    """castor may take seconds over a ``context`` event (a context filter asks a classifier): Pi's
    abort then waited for its answer before the run could end -- Pi gives that event the run's abort
    signal, which the extension did not listen to. Now the wait ends with the run."""
    pi, log = probe(CASTOR_PROBE_SLOW_CONTEXT=str(STALL_S))
    start = pi.mark()
    pi.send({"type": "prompt", "message": "a prompt whose context castor is slow to answer"})
    assert poll_until(lambda: any(c["method"] == "harness.event" and c["params"].get("event") == "context"
                                  for c in read_jsonl(log)), timeout=15), "no context event reached castor"
    aborted = time.monotonic()
    pi.send({"type": "abort"})
    settled = pi.wait_for(lambda e: e.get("type") == "agent_settled", start=start, timeout=STALL_S + 10)
    took = time.monotonic() - aborted
    assert took < 3, f"the abort waited {took:.1f} s for castor's answer to the context event"
    assert settled.get("aborted") is True, settled
    assert not fake_llm.log(), "the aborted run made a model request"
    no_error_toasts(pi, start)
    # castor's late answer comes, and goes nowhere.
    assert poll_until(lambda: calls(log, "slow_context_answered"), timeout=STALL_S + 5)


def test_an_abort_while_castor_answers_materia_cast_stops_the_turn_the_cast_starts(probe, fake_llm):
    """An Esc (RPC abort) typed while castor answers ``/materia cast`` came before there was a run to
    stop: Pi's abort did nothing and the cast's first turn then went to the model. Now that turn is
    stopped as it starts and reported interrupted (castor keeps none of it; /materia continue runs it)."""
    pi, log = probe(CASTOR_PROBE_SLOW_CAST_START="1.5")
    start = pi.mark()
    pi.send({"type": "prompt", "message": "/materia cast build it"})
    assert poll_until(lambda: calls(log, "cast.start"), timeout=10), "cast.start never reached castor"
    pi.send({"type": "abort"})
    assert poll_until(lambda: calls(log, "agent.turn_ended"), timeout=10), "the turn's end was never reported"
    (ended,) = calls(log, "agent.turn_ended")
    assert ended["aborted"] is True and ended["turn_id"] == calls(log, "cast_start_answered")[0]["turn_id"], ended
    assert not any("TURN: cast" in json.dumps(r) for r in fake_llm.log()), "the stopped turn reached the model"
    note = pi.wait_ui("notify", lambda e: "the turn the command started is stopped" in str(e.get("message")),
                      start=start)
    assert "/materia continue" in note["message"]
    no_error_toasts(pi, start)
    # The Esc was for that turn only: the next prompt runs.
    after = pi.prompt("an ordinary prompt afterwards")
    settled = [e for e in pi.events[after:] if e.get("type") == "agent_settled"]
    assert settled and settled[-1].get("aborted") is False


def test_materia_cast_with_no_abort_runs_its_turn(probe, fake_llm):
    pi, log = probe(CASTOR_PROBE_SLOW_CAST_START="0.2")
    pi.command("/materia cast build it")
    assert poll_until(lambda: calls(log, "agent.turn_ended"), timeout=15), "the turn's end was never reported"
    (ended,) = calls(log, "agent.turn_ended")
    assert ended["aborted"] is False, ended
    assert any("TURN: cast" in json.dumps(r) for r in fake_llm.log())

"""What a user does at odd moments under real Pi: a prompt while ``/castor restart`` stops castor,
and the like.

Real Pi in RPC mode with the extension, the real castor runtime and the FAKE model (the shapes of
test_pi_cancel_moments.py). Each test drives Pi as a user would and checks what the user sees and
what is left running.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from pathlib import Path

import pytest

from tests.support.waiting import poll_until, wait_for

from .test_pi_cancel_moments import pi_whose_memory_retrievals_take_20_s, processes_with, start, write_loadout
from .test_pi_cancellation import (
    CALL_TIMEOUT_MS,
    STALL_S,
    completes,
    continue_completes_the_review,
    error_toasts,
    events,
    project,
    requests_with,
    resume_completes,
    run_dir,
    settled_after,
    up,
    wait_cast_end,
    wait_request,
)

pytestmark = [pytest.mark.pi, pytest.mark.timeout(120)]


def pi_casting_a_command_that_ignores_sigterm(start_pi, castor_command, tmp_path: Path, marker: str):
    """Pi whose ``/materia cast`` has started a cast whose first socket is a utility command that
    ignores SIGTERM (``marker`` names it in the process list: castor SIGKILLs it a second after its TERM)."""
    utility = {"type": "utility", "timeoutMs": 120000, "edges": [{"when": "always", "to": "Socket-2"}],
               "command": ["sh", "-c", f"trap '' TERM; {marker}"]}
    root = write_loadout(tmp_path / "project", utility)
    pi = start(start_pi, castor_command, root)
    pi.command("/materia cast build the thing")
    run_dir(root)
    return pi


def test_a_prompt_while_castor_restart_stops_castor_waits_for_the_stop_and_the_old_castor_gets_its_grace(
        start_pi, castor_command, fake_llm, tmp_path):
    """``/castor restart`` stops castor (its stdin closed, SIGKILL only after a 2 s grace, in which
    castor ends the utility commands its casts run), then starts the next one. A prompt sent at the
    same moment has a hook (``before_agent_start``) that calls castor: it used to start the next
    castor at once, and the old one was then SIGKILLed without its grace -- a command that takes a
    moment to end (here one that ignores SIGTERM, which castor SIGKILLs after its own second) went
    on running with no owner. The hook now waits for the stop to end and is answered by the next castor."""
    marker = "sleep 46.25"
    pi = pi_casting_a_command_that_ignores_sigterm(start_pi, castor_command, tmp_path, marker)
    try:
        assert poll_until(lambda: processes_with(marker), timeout=20), "the utility never ran"
        fake_llm.reply_text("PLAIN-ANSWER", when="USER-DURING-RESTART")
        begin = pi.mark()
        restart = pi.send({"type": "prompt", "message": "/castor restart"})
        prompt = pi.send({"type": "prompt", "message": "USER-DURING-RESTART hello"})
        # castor's shutdown SIGKILLs the command a second after its SIGTERM; a castor SIGKILLed
        # before that leaves it running.
        assert poll_until(lambda: not processes_with(marker), timeout=8), "the utility's command outlived the restart"
    finally:
        for pid in processes_with(marker):  # what a failure leaves is not left to the next test
            os.kill(pid, signal.SIGKILL)
    for cid in (restart, prompt):
        answer = pi.wait_for(lambda e, cid=cid: e.get("type") == "response" and e.get("id") == cid, start=begin,
                             timeout=30)
        assert answer.get("success"), answer
    pi.wait_for(lambda e: e.get("type") == "agent_settled", start=begin, timeout=30)
    assert requests_with(fake_llm, "USER-DURING-RESTART"), "the prompt reached no model"
    time.sleep(0.5)  # a late error toast would come after the settle
    assert error_toasts(pi, begin) == []


def test_the_next_prompt_after_an_abort_does_not_wait_out_the_hung_retrieval(start_pi, castor_command, fake_llm,
                                                                             tmp_path):
    """An abort (an RPC client's Esc) while castor answers a prompt's before_agent_start with a memory
    retrieval that hangs (20 s) ends the run at once; the retrieval runs on in castor's worker. The
    next prompt's retrieval queues behind it: it used to wait the hung one out (pi-icarus-hook does
    the same). Now the next prompt waits at most 2 s for it and then goes to the model without memory
    context, saying so."""
    pi, retrievals = pi_whose_memory_retrievals_take_20_s(start_pi, castor_command, tmp_path)
    begin = pi.mark()
    pi.send({"type": "prompt", "message": "tell me about the zebra herd"})
    wait_for(lambda: retrievals("start"), timeout=15, what="the retrieval running")
    pi.request({"type": "abort"}, timeout=30)
    settled_after(pi, begin)
    fake_llm.reply_text("PLAIN-ANSWER", when="USER-AFTER-ABORT")
    after = pi.mark()
    t0 = time.monotonic()
    pi.send({"type": "prompt", "message": "USER-AFTER-ABORT and the giraffes?"})
    wait_request(fake_llm, "USER-AFTER-ABORT", timeout=30)
    took = time.monotonic() - t0
    assert took < 6.0, f"the next prompt waited {took:.1f} s for the hung retrieval"
    assert not retrievals("end"), "the hung retrieval cannot have ended yet"
    note = pi.wait_ui("notify", lambda e: "without memory context" in str(e.get("message")), start=after, timeout=5)
    assert note.get("notifyType") == "info", note
    pi.wait_for(lambda e: e.get("type") == "agent_settled", start=after, timeout=15)
    assert error_toasts(pi, after) == []


CRASHY = Path(__file__).with_name("crashy_serve.py")


def test_an_abort_as_castor_restarts_a_crashed_casts_actor_stops_the_turn_it_sends_again(start_pi, fake_llm,
                                                                                        tmp_path):
    """The cast's actor crashes while its builder turn runs: castor restarts it, stops the run
    (``agent.abort_turn``, ``cast_restarted``) and sends the turn again under a new id. An abort
    (the user's Esc) that comes while the old run is being stopped found that run ending and stopped
    only it: the re-sent turn then ran, as if no Esc had been pressed. Now the re-sent turn is
    stopped before its first model request and reported aborted: the cast is interrupted at that
    socket, the user is told, and ``/materia continue`` runs the turn."""
    marker = tmp_path / "crash-cast"
    root = project(tmp_path)
    pi = start_pi([sys.executable, str(CRASHY)], cwd=root, settings={"defaultProjectTrust": "always"},
                  timeout_ms=CALL_TIMEOUT_MS, env={"CASTOR_CRASH_CAST_FILE": str(marker)})
    up(pi)
    fake_llm.reply_text("BUILT-PARTIAL never sent", when="BUILDER-MATERIA", delay=STALL_S)
    begin = pi.command("/materia cast build the thing")
    run = run_dir(root)
    wait_request(fake_llm, "BUILDER-MATERIA")
    marker.touch()
    wait_for(lambda: "(cast_restarted)" in pi.stderr(), timeout=10, what="castor stopping the turn to send it again")
    esc = pi.mark()
    pi.request({"type": "abort"})
    assert poll_until(lambda: any(e["type"] == "turn_interrupted" for e in events(run)), timeout=10), \
        f"the cast was not interrupted; builder requests: {len(requests_with(fake_llm, 'BUILDER-MATERIA'))}"
    assert len(requests_with(fake_llm, "BUILDER-MATERIA")) == 1, "the re-sent turn reached the model"
    note = pi.wait_ui("notify", lambda e: "sent its turn again" in str(e.get("message")), start=esc, timeout=5)
    assert "/materia continue" in str(note["message"]), note
    pi.wait_for(lambda e: e.get("type") == "agent_settled", start=esc, timeout=10)
    assert error_toasts(pi, begin) == []
    resume_completes(pi, fake_llm, run, "BUILT-AFTER-RESTART")


def test_a_session_replaced_while_castor_restart_stops_castor_leaves_one_castor(start_pi, castor_command, fake_llm,
                                                                                tmp_path):
    """``/castor restart`` stops castor (a second or two while its utility command ends), then starts
    the next one; an RPC ``new_session`` sent at once replaces the session meanwhile. The old
    session's restart used to start its castor all the same once the stop ended -- for a session
    that had ended, in an extension instance Pi never calls again: that castor stayed under Pi, with
    its workers, until Pi quit. Now a restart whose session ended starts nothing."""
    from .test_pi_session_switch import castor_runtimes

    marker = "sleep 47.25"
    pi = pi_casting_a_command_that_ignores_sigterm(start_pi, castor_command, tmp_path, marker)
    try:
        assert poll_until(lambda: processes_with(marker), timeout=20), "the utility never ran"
        begin = pi.mark()
        restart = pi.send({"type": "prompt", "message": "/castor restart"})
        pi.request({"type": "new_session"}, timeout=40)
        pi.wait_for(lambda e: e.get("type") == "response" and e.get("id") == restart, start=begin, timeout=30)
        pi.wait_ui("setStatus", lambda e: str(e.get("statusText", "")).startswith("castor: up"), start=begin,
                   timeout=40)
        time.sleep(1.0)  # a castor the old session's restart starts would be up by now (it took ~0.5 s)
        assert poll_until(lambda: len(castor_runtimes(pi)) == 1, timeout=10), \
            [p.cmdline() for p in castor_runtimes(pi)]
        assert poll_until(lambda: not processes_with(marker), timeout=8), "the utility's command outlived the restart"
    finally:
        for pid in processes_with(marker):
            os.kill(pid, signal.SIGKILL)
    assert len(castor_runtimes(pi)) == 1, [p.cmdline() for p in castor_runtimes(pi)]


def test_castor_restart_twice_at_once_restarts_castor_without_an_error(start_pi, castor_command, fake_llm, tmp_path):
    """An impatient user types ``/castor restart`` as soon as the footer says castor is up, and again
    a moment later. The first stopped castor while Pi's session was still being opened on it: that
    open went on against the castor the restart started, whose connection had not opened the
    session, and failed with an error toast ("castor runtime unavailable: session … is not open on
    this connection"). The open is now done again on the new castor; both restarts answer, one
    castor runs and no error is shown."""
    from .test_pi_session_switch import castor_runtimes

    pi = start_pi(castor_command, timeout_ms=CALL_TIMEOUT_MS)
    up(pi)
    begin = pi.mark()
    first = pi.send({"type": "prompt", "message": "/castor restart"})
    time.sleep(0.3)  # the first restart's stop is over (no cast runs): its next castor is starting
    second = pi.send({"type": "prompt", "message": "/castor restart"})
    for cid in (first, second):
        answer = pi.wait_for(lambda e, cid=cid: e.get("type") == "response" and e.get("id") == cid, start=begin,
                             timeout=40)
        assert answer.get("success"), answer
    time.sleep(0.5)
    assert error_toasts(pi, begin) == []
    assert poll_until(lambda: len(castor_runtimes(pi)) == 1, timeout=10), [p.cmdline() for p in castor_runtimes(pi)]
    pi.wait_ui("notify", lambda e: " up (" in str(e.get("message")), start=begin, timeout=10)


def pi_whose_casts_next_turn_waits_behind_the_users_run_when_its_actor_crashes(start_pi, fake_llm, tmp_path: Path):
    """Pi (on crashy_serve.py) casting a utility socket then the Reviewer's turn: the user's prompt
    streams (its answer comes after 3 s) when the utility ends, so castor's Reviewer turn waits in
    Pi's follow-up queue; then the cast's actor crashes and castor restarts it: it stops that turn
    (``cast_restarted``, the turn is queued: Pi still holds its hidden prompt) and sends it again
    under a new id, queued behind the user's run too. Returns Pi, the cast's run dir and the mark
    before the cast."""
    marker = tmp_path / "crash-cast"
    root = tmp_path / "project"
    gate = root / "go"
    write_loadout(root, {"type": "utility", "command": ["sh", "-c", f"while [ ! -e {gate} ]; do sleep 0.05; done"],
                         "timeoutMs": 60000, "edges": [{"when": "always", "to": "Socket-2"}]})
    pi = start_pi([sys.executable, str(CRASHY)], cwd=root, settings={"defaultProjectTrust": "always"},
                  timeout_ms=CALL_TIMEOUT_MS, env={"CASTOR_CRASH_CAST_FILE": str(marker)})
    up(pi)
    begin = pi.command("/materia cast build the thing")
    run = run_dir(root)
    fake_llm.reply_text("USER-ANSWER-STANDS", when="USER-BUSY", delay=3.0)
    pi.send({"type": "prompt", "message": "USER-BUSY what is going on"})
    wait_request(fake_llm, "USER-BUSY")
    gate.touch()  # the utility ends: castor asks for the Reviewer's turn while the user's run streams
    assert poll_until(lambda: "queued as a follow-up" in pi.stderr(), timeout=15), pi.stderr()[-2000:]
    marker.touch()
    wait_for(lambda: "(cast_restarted)" in pi.stderr(), timeout=10, what="castor stopping the turn to send it again")
    assert poll_until(lambda: pi.stderr().count("queued as a follow-up") >= 2, timeout=10), pi.stderr()[-2000:]
    return pi, run, begin


def test_a_crashed_casts_turn_sent_again_behind_the_users_run_runs_after_it(start_pi, fake_llm, tmp_path):
    """castor restarts the crashed cast's actor while its Reviewer turn waits behind the user's run,
    and sends the turn again. The user's answer came, then Pi delivered the stopped turn's prompt,
    which the extension stops there -- and the run ended aborted, so the turn sent again, queued
    behind it, was reported interrupted: nobody had pressed anything, yet the cast stopped at that
    socket ("the turn was interrupted", /materia continue needed), while castor had said the turn
    runs again. Now it runs (once: the copy Pi held is stopped), the cast completes and the user's
    answer stands."""
    pi, run, begin = pi_whose_casts_next_turn_waits_behind_the_users_run_when_its_actor_crashes(start_pi, fake_llm,
                                                                                                tmp_path)
    fake_llm.reply_text("REVIEWED-AFTER-RESTART", when="REVIEWER-MATERIA", delay=0.5)
    fake_llm.reply_text("REVIEWED-TWICE never wanted", when="REVIEWER-MATERIA")
    done = wait_cast_end(pi, run)
    assert done[-1]["data"]["ok"] is True, done[-1]
    assert not any(e["type"] == "turn_interrupted" for e in done), [e["type"] for e in done]
    assert completes(run) == ["Socket-1", "Socket-2"]
    answered = pi.wait_for(lambda e: e.get("type") == "message_end" and "REVIEWED-AFTER-RESTART" in json.dumps(e),
                           start=begin, timeout=5)
    # The run that answered settles once the copy Pi held is delivered: stopped there, or answered again.
    pi.wait_for(lambda e: e.get("type") == "agent_settled", start=pi.events.index(answered), timeout=10)
    assert len(requests_with(fake_llm, "REVIEWER-MATERIA")) == 1
    answers = [e for e in pi.events[begin:] if e.get("type") == "message_end"
               and (e.get("message") or {}).get("role") == "assistant"]
    assert any("USER-ANSWER-STANDS" in json.dumps(e) for e in answers), "the user's answer is not in the session"
    assert error_toasts(pi, begin) == []


def test_an_abort_as_castor_restarts_a_turn_waiting_behind_the_users_run_stops_it_and_continue_runs_at_once(
        start_pi, fake_llm, tmp_path):
    """The same crash, and the user stops their run (an RPC abort, the Esc) right after castor's
    restart: the turn sent again, waiting behind it, is stopped too and the cast is interrupted at
    that socket. The Esc also armed the stop for the turn castor sends again as it starts, which
    stayed armed for three seconds: a ``/materia continue`` typed at once was stopped as well ("castor
    restarted the cast's crashed actor ... that turn is stopped too"). Now the stop ends with the
    turn it was for, and the continue runs the Reviewer and completes the cast."""
    pi, run, begin = pi_whose_casts_next_turn_waits_behind_the_users_run_when_its_actor_crashes(start_pi, fake_llm,
                                                                                                tmp_path)
    esc = pi.mark()
    pi.request({"type": "abort"})
    assert poll_until(lambda: any(e["type"] == "turn_interrupted" for e in events(run)), timeout=10), \
        [e["type"] for e in events(run)]
    settled_after(pi, esc)
    assert requests_with(fake_llm, "REVIEWER-MATERIA") == []
    continue_completes_the_review(pi, run, fake_llm)


def test_an_abort_right_after_a_turn_answers_stops_the_casts_next_turn(start_pi, castor_command, fake_llm, tmp_path):
    """The builder's turn answers and the user presses Esc (an RPC abort) at once, as castor sends the
    Reviewer's turn: no run went on, so Pi's abort stopped nothing and the Reviewer's turn ran to its
    end as if no key had been pressed (the cast completed). Now that turn is stopped before its first
    model request, the user is told, the cast is interrupted at Socket-2 and ``/materia continue``
    completes it."""
    root = project(tmp_path)
    pi = start(start_pi, castor_command, root)
    fake_llm.reply_text("BUILT-OK", when="BUILDER-MATERIA")
    fake_llm.reply_text("REVIEWED never wanted", when="REVIEWER-MATERIA", delay=STALL_S)
    begin = pi.command("/materia cast build the thing")
    run = run_dir(root)
    pi.wait_for(lambda e: e.get("type") == "agent_settled", start=begin, timeout=20)
    esc = pi.mark()
    pi.request({"type": "abort"})
    assert poll_until(lambda: any(e["type"] == "turn_interrupted" for e in events(run)), timeout=10), \
        [e["type"] for e in events(run)]
    assert requests_with(fake_llm, "REVIEWER-MATERIA") == []
    # stopped before any model request, the turn used nothing: not a turn whose usage went unreported
    assert not [e for e in events(run) if e["type"] == "usage_unreported" and e["data"]["socket"] == "Socket-2"], \
        events(run)
    note = pi.wait_ui("notify", lambda e: "next turn" in str(e.get("message")), start=esc, timeout=5)
    assert "/materia continue" in str(note["message"]), note
    assert completes(run) == ["Socket-1"]
    assert error_toasts(pi, begin) == []
    continue_completes_the_review(pi, run, fake_llm)


def test_an_abort_right_after_a_turn_answers_does_not_stop_a_utility_socket_nor_the_turn_after_it(
        start_pi, castor_command, fake_llm, tmp_path):
    """The same abort when the cast's next socket is a utility command (a second long) and an agent
    turn follows it: the key never stops a command, and the notice says so and what does; the turn
    after the command is not stopped by a key pressed before the command ran, and the cast completes."""
    root = tmp_path / "project"
    doc = {"artifactDir": ".pi/pi-materia", "activeLoadout": "L",
           "limits": {"maxSocketVisits": 5, "maxEdgeTraversals": 5},
           "materia": {"Builder": {"prompt": "BUILDER-MATERIA: build.", "tools": "none"},
                       "Reviewer": {"prompt": "REVIEWER-MATERIA: review.", "tools": "none"}},
           "loadouts": {"L": {"entry": "Socket-1", "sockets": {
               "Socket-1": {"type": "agent", "materia": "Builder", "parse": "text",
                            "edges": [{"when": "always", "to": "Socket-2"}]},
               "Socket-2": {"type": "utility", "command": ["sh", "-c", "sleep 1"], "timeoutMs": 60000,
                            "edges": [{"when": "always", "to": "Socket-3"}]},
               "Socket-3": {"type": "agent", "materia": "Reviewer", "parse": "text",
                            "edges": [{"when": "always", "to": "end"}]}}}}}
    (root / ".pi").mkdir(parents=True)
    (root / ".pi" / "pi-materia.json").write_text(json.dumps(doc))
    pi = start(start_pi, castor_command, root)
    fake_llm.reply_text("BUILT-OK", when="BUILDER-MATERIA")
    fake_llm.reply_text("REVIEWED-OK", when="REVIEWER-MATERIA")
    begin = pi.command("/materia cast build the thing")
    run = run_dir(root)
    pi.wait_for(lambda e: e.get("type") == "agent_settled", start=begin, timeout=20)
    esc = pi.mark()
    pi.request({"type": "abort"})
    done = wait_cast_end(pi, run)
    assert done[-1]["data"]["ok"] is True, done[-1]
    assert completes(run) == ["Socket-1", "Socket-2", "Socket-3"]
    pi.wait_ui("notify", lambda e: "does not stop Socket-2's command" in str(e.get("message")), start=esc, timeout=5)
    assert not [e for e in pi.ui("notify", start=esc) if "next turn" in str(e.get("message"))]
    assert error_toasts(pi, begin) == []

"""Which Esc stops the cast's next turn, in Pi's terminal.

A castor turn answers and castor sends the cast's next turn a moment later: an Esc in that gap
finds no run to stop, so the extension stops the next turn as it starts (the user meant to stop
the cast; an RPC abort does the same, test_pi_odd_moments.py). But Pi's Esc is not always a stop:
with a picker open (``/settings``, ``/model``, ``/resume``...) an extension's dialog, or the
editor's completion list, Esc closes that and stops nothing. Such an Esc used to count too, and
the next turn was stopped although the user had only closed a picker. Driven as a user drives it:
the interactive Pi on a pseudo-terminal and the PROBE castor, which sends a second turn 1.5 s
after its first one is answered (``$CASTOR_PROBE_NEXT_TURN_AFTER``).
"""

from __future__ import annotations

import json
import time

import pytest

from tests.support.waiting import poll_until, wait_for

from .conftest import read_jsonl
from .pi_tty import ESC

pytestmark = [pytest.mark.pi, pytest.mark.timeout(120)]


def calls(log, method):
    return [c["params"] for c in read_jsonl(log) if c["method"] == method]


def requests_with(fake_llm, text):
    return [r for r in fake_llm.log() if text in json.dumps(r)]


@pytest.fixture
def tty_pi(start_tty, probe_command):
    command, log = probe_command
    pi = start_tty(command, env={"CASTOR_PROBE_LOG": str(log), "CASTOR_PROBE_NEXT_TURN_AFTER": "1.5"})
    wait_for(lambda: calls(log, "harness.event"), timeout=20,
             what=f"session_start at the probe; Pi drew: {pi.screen_tail()!r}")
    return pi, log


def esc_as_the_first_turn_answers(pi, log, fake_llm, *, opened: str | None, marker: str | None,
                                  presses: int = 1) -> None:
    """The user's prompt, then the probe's first turn (its model reply a second and a half late);
    ``opened`` typed while that turn streams (a picker: ``marker`` is drawn once it is open); the
    Esc pressed as soon as the turn's end reaches castor, before the probe sends the next turn."""
    fake_llm.reply_text("FIRST-TURN-OK", when="TURN: first", delay=1.5)
    pi.type("PROBE turn first")
    wait_for(lambda: requests_with(fake_llm, "TURN: first"), timeout=20,
             what=f"the first castor turn's request; Pi drew: {pi.screen_tail()!r}")
    if opened:
        pi.type(opened)
        wait_for(lambda: marker in pi.screen_tail(20_000), timeout=10,
                 what=f"the picker {opened} opened; Pi drew: {pi.screen_tail()!r}")
    wait_for(lambda: calls(log, "agent.turn_ended"), timeout=20,
             what=f"the first turn's end at the probe; Pi drew: {pi.screen_tail()!r}")
    pi.press(ESC)
    if presses == 2:
        time.sleep(0.15)  # a user's second press, within Pi's 500 ms double Esc (one read of both is Alt+Esc)
        pi.press(ESC)
    wait_for(lambda: calls(log, "next_turn_sent"), timeout=10, what="the probe sending the next turn")


@pytest.mark.parametrize("presses", [1, 2])
def test_an_esc_right_after_a_turn_answers_stops_the_casts_next_turn(tty_pi, fake_llm, presses):
    """The Esc reaches Pi's editor (nothing else open): the user's stop. The next turn is stopped
    before its first model request and its end goes to castor as interrupted. Pressed twice
    quickly, the second Esc opens Pi's session tree (its double Esc on an empty editor): the turn
    is stopped all the same, once."""
    pi, log = tty_pi
    esc_as_the_first_turn_answers(pi, log, fake_llm, opened=None, marker=None, presses=presses)
    wait_for(lambda: len(calls(log, "agent.turn_ended")) >= 2, timeout=10,
             what=f"the next turn's end; Pi drew: {pi.screen_tail()!r}")
    ended = calls(log, "agent.turn_ended")[1]
    assert ended.get("aborted") is True, ended
    assert requests_with(fake_llm, "TURN: next") == []
    assert len(calls(log, "agent.turn_ended")) == 2


@pytest.mark.parametrize(("opened", "marker"), [("/settings", "Auto-compact"), ("/model", "Model Name:")])
def test_an_esc_that_closes_a_picker_right_after_a_turn_answers_does_not_stop_the_next_turn(tty_pi, fake_llm,
                                                                                              opened, marker):
    """The same Esc with a picker open closes the picker, and that is all: the next turn runs."""
    pi, log = tty_pi
    esc_as_the_first_turn_answers(pi, log, fake_llm, opened=opened, marker=marker)
    wait_for(lambda: requests_with(fake_llm, "TURN: next"), timeout=10,
             what=f"the next turn's model request; Pi drew: {pi.screen_tail()!r}")
    wait_for(lambda: len(calls(log, "agent.turn_ended")) >= 2, timeout=10,
             what=f"the next turn's end; Pi drew: {pi.screen_tail()!r}")
    ended = calls(log, "agent.turn_ended")[1]
    assert ended.get("aborted") is not True, ended
    assert not poll_until(lambda: "is stopped" in pi.screen_tail(20_000), timeout=0.5), pi.screen_tail()


def test_an_esc_that_closes_the_model_selector_opened_by_its_key_does_not_end_the_wait_for_castor(tty_pi, fake_llm):
    """While castor answers a prompt's ``before_agent_start`` (a slow memory retrieval), the user
    opens the model selector with its key (Ctrl+L: no command typed, so the extension's watch of
    the editor's commands did not see a picker open) and closes it with Esc. That Esc used to end
    the wait as the user's stop: the prompt went to the model without castor's answer, though
    Pi's run went on. Now the wait goes on and the prompt gets castor's answer."""
    pi, log = tty_pi
    pi.type("PROBE slow 4")
    wait_for(lambda: [c for c in calls(log, "harness.event") if c["event"] == "before_agent_start"], timeout=15,
             what=f"before_agent_start at the probe; Pi drew: {pi.screen_tail()!r}")
    pi.press(b"\x0c")  # Ctrl+L: Pi's model selector
    wait_for(lambda: "Model Name:" in pi.screen_tail(20_000), timeout=10,
             what=f"the model selector open; Pi drew: {pi.screen_tail()!r}")
    pi.press(ESC)
    wait_for(lambda: fake_llm.log(), timeout=15, what=f"the prompt's model request; Pi drew: {pi.screen_tail()!r}")
    assert "PROBE-LATE" in json.dumps(fake_llm.log()[0]), "the prompt went without castor's answer"
    assert not poll_until(lambda: "stopped waiting" in pi.screen_tail(20_000), timeout=0.5), pi.screen_tail()


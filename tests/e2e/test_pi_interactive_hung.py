"""A castor that stops answering (SIGSTOP: wedged, not dead) under the interactive Pi.

Its pipe stays open, so nothing tells the extension it is down: every hook used to wait its whole
deadline -- ``before_agent_start`` and ``context`` before each model request, ``agent_end`` and
``agent_settled`` after -- prompt after prompt, the footer still said ``castor: up``, and quitting
Pi waited two deadlines (the shutdown event, then ``session.close``). Now a deadline that passes
with nothing heard from castor since the call was sent marks it silent (footer ``castor: not
answering``, one notice); hooks then skip it after a quick probe (one at most every few seconds)
until anything comes from it again, and quitting asks one probe, not a deadline. Driven as a user
drives it: the interactive Pi on a pseudo-terminal, the real runtime stopped with SIGSTOP.
"""

from __future__ import annotations

import json
import os
import re
import signal
import sys
import time
from pathlib import Path

import psutil
import pytest

from tests.support.waiting import poll_until, wait_for

pytestmark = [pytest.mark.pi, pytest.mark.timeout(120)]

DEADLINE_MS = 6000
STOP_AT_OPEN = Path(__file__).with_name("stop_at_open.py")


def castor_process(pi) -> psutil.Process:
    found = [p for p in psutil.Process(pi.proc.pid).children(recursive=True)
             if any("serve" in part for part in p.cmdline())]
    assert len(found) == 1, [p.cmdline() for p in found]
    return found[0]


_ESCAPE = re.compile(r"\x1b\[[0-?]*[ -/]*[@-~]|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)|\x1b[@-_]")


def footer_says_not_answering(raw: str) -> bool:
    """Whether Pi drew the footer ``castor: not answering``. Pi's renderer may redraw only what
    changed on the footer's line (``castor: up (…)`` to ``castor: not answering``: just "not
    answering" at its column), so the drawn text is searched with escapes removed, and a "not
    answering" that is not the notice's ("castor is not answering") is the footer's."""
    text = _ESCAPE.sub("", raw)
    return "castor: not answering" in text or text.count("not answering") > text.count("castor is not answering")


def reached_model(fake_llm, marker: str) -> bool:
    return any(marker in json.dumps(r["messages"]) for r in fake_llm.log())


@pytest.fixture
def stopped(start_tty, castor_command):
    pi = start_tty(castor_command, timeout_ms=DEADLINE_MS)
    wait_for(lambda: "castor: up" in pi.screen_tail(100_000), timeout=30,
             what=f"castor up in Pi's footer; Pi drew: {pi.screen_tail()!r}")
    castor = castor_process(pi)
    os.kill(castor.pid, signal.SIGSTOP)
    yield pi, castor
    try:
        os.kill(castor.pid, signal.SIGCONT)
    except ProcessLookupError:
        pass


def test_a_stopped_castor_costs_one_deadline_then_prompts_skip_it_until_it_answers(stopped, fake_llm):
    pi, castor = stopped
    started = time.monotonic()
    pi.type("first prompt")
    wait_for(lambda: reached_model(fake_llm, "first prompt"), timeout=DEADLINE_MS / 1000 * 2 + 10,
             what=f"the first prompt at the model; Pi drew: {pi.screen_tail()!r}")
    first = time.monotonic() - started
    wait_for(lambda: "castor is not answering" in pi.screen_tail(100_000), timeout=5,
             what=f"the not-answering notice; Pi drew: {pi.screen_tail()!r}")
    # The footer is drawn once, when castor is marked silent; the whole kept screen is searched (a
    # busy redraw can push it out of a shorter tail), and it may land a frame after the notice.
    wait_for(lambda: footer_says_not_answering(pi.screen_tail(200_000)), timeout=5,
             what=f"the not-answering footer; Pi drew: {pi.screen_tail()!r}")
    wait_for(lambda: "FAKE-REPLY" in pi.screen_tail(100_000), timeout=10,
             what=f"the first answer drawn; Pi drew: {pi.screen_tail()!r}")
    started = time.monotonic()  # the first run's end hooks skip castor: the second prompt waits for none
    pi.type("second prompt")
    wait_for(lambda: reached_model(fake_llm, "second prompt"), timeout=DEADLINE_MS / 1000 * 2 + 10,
             what=f"the second prompt at the model; Pi drew: {pi.screen_tail()!r}")
    second = time.monotonic() - started
    print(f"first prompt reached the model after {first:.1f} s, the second after {second:.1f} s")
    assert first >= DEADLINE_MS / 1000 - 0.5  # the one deadline that finds castor silent
    assert second < DEADLINE_MS / 1000 - 1.5, f"the second prompt waited {second:.1f} s for a silent castor"
    os.kill(castor.pid, signal.SIGCONT)
    wait_for(lambda: "castor is answering again" in pi.screen_tail(100_000), timeout=15,
             what=f"the answering-again notice; Pi drew: {pi.screen_tail()!r}")


def test_quitting_pi_with_a_stopped_castor_takes_a_probe_not_two_deadlines(stopped):
    pi, castor = stopped
    started = time.monotonic()
    pi.press(b"\x04")  # Ctrl+D on the empty editor: quit
    assert poll_until(lambda: pi.proc.poll() is not None, timeout=30), "Pi did not exit"
    took = time.monotonic() - started
    print(f"Pi exited {took:.1f} s after Ctrl+D")
    assert took < 8, f"quitting took {took:.1f} s with castor stopped (the deadline is {DEADLINE_MS} ms)"
    assert poll_until(lambda: not castor.is_running() or castor.status() == psutil.STATUS_ZOMBIE, timeout=5)



def test_a_castor_stopped_before_it_opened_the_session_costs_one_deadline_not_one_per_hook(start_tty, fake_llm):
    """The session is opened by the first hook that needs castor, after the handshake; a castor
    stopped between its hello and its answer to the open (what a loaded machine hit by chance) used
    to be asked to open again, with a whole deadline, by every hook of every prompt: 18 s to the
    first prompt's request, 12 s to the second's. Once a deadline has found castor silent, the open
    costs the quick probe like any other call."""
    pi = start_tty([sys.executable, str(STOP_AT_OPEN)], timeout_ms=DEADLINE_MS)
    wait_for(lambda: "castor: up" in pi.screen_tail(100_000), timeout=30,
             what=f"castor up in Pi's footer; Pi drew: {pi.screen_tail()!r}")
    castor = castor_process(pi)
    wait_for(lambda: castor.status() == psutil.STATUS_STOPPED, timeout=10, what="castor stopped at the open")
    wait_for(lambda: "castor is not answering" in pi.screen_tail(100_000), timeout=DEADLINE_MS / 1000 + 10,
             what=f"the not-answering notice; Pi drew: {pi.screen_tail()!r}")
    for prompt in ("first prompt", "second prompt"):
        started = time.monotonic()
        pi.type(prompt)
        wait_for(lambda prompt=prompt: reached_model(fake_llm, prompt), timeout=DEADLINE_MS / 1000 * 3 + 10,
                 what=f"{prompt} at the model; Pi drew: {pi.screen_tail()!r}")
        took = time.monotonic() - started
        print(f"{prompt} reached the model after {took:.1f} s")
        assert took < DEADLINE_MS / 1000 - 1.5, f"{prompt} waited {took:.1f} s: the open asked again"
        wait_for(lambda: "FAKE-REPLY" in pi.screen_tail(100_000), timeout=10,
                 what=f"the answer drawn; Pi drew: {pi.screen_tail()!r}")
    os.kill(castor.pid, signal.SIGCONT)
    wait_for(lambda: "castor is answering again" in pi.screen_tail(100_000), timeout=15,
             what=f"the answering-again notice; Pi drew: {pi.screen_tail()!r}")

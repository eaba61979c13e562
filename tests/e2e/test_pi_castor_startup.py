"""Esc and quit in Pi's terminal UI while castor is still starting.

Pi holds a submitted prompt until the extension's ``session_start`` handler returns, and that
handler waits for castor's start: a cold start, a memory backend's slow session start, or a whole
deadline for a castor that hangs. An Esc then found no run to stop, and the prompt went to the model
once castor was up; quitting paid the runtime's 2 s stop grace for a castor that had not even
answered its handshake. Now the handler watches the terminal while it waits, as ``before_agent_start``
does: an Esc after a prompt stops that prompt before its first model request, and at Pi's quit keys
the starting castor is killed with no grace (it runs nothing yet). Pi's quit does not wait for the
handler, but what Pi does once the handler returns does come first: returned at the keys, it let Pi
finish its own start (its syntax grammars load) before quitting, which on a loaded machine took 2 s.
The handler now holds Pi's start while Pi quits. The castor here is slow to start (a shell that
sleeps before it becomes castor).

In RPC mode Pi reads no command until the session has started, so there the handler does not hold
the session's start for castor's: castor starts behind it, and a prompt's ``before_agent_start``
waits for that start instead, where an RPC ``abort`` (or the end of Pi's input) ends the wait.
Before, an ``abort`` sent then, or the end of Pi's input, waited for castor's whole start.
"""

from __future__ import annotations

import json
import sys
import time

import psutil
import pytest

from tests.support.waiting import poll_until, wait_for

from .conftest import SERVE
from .pi_rpc import PiRpc
from .pi_tty import PiTty

pytestmark = [pytest.mark.pi, pytest.mark.timeout(90)]

START_S = 8.0
TITLE = "\x1b]0;"  # OSC 0: the terminal title Pi sets as its start ends (and as it shuts down)
SCREEN = 200_000  # all PiTty keeps of what Pi drew
CTRL_C, ESC = b"\x03", b"\x1b"


def slow_castor() -> list[str]:
    return ["sh", "-c", f"sleep {START_S}; exec {json.dumps(sys.executable)} {json.dumps(str(SERVE))}"]


def castor_starting(pi: PiTty | PiRpc) -> psutil.Process:
    """The slow castor's shell under Pi, once Pi has started it."""
    found: list[psutil.Process] = []

    def look() -> bool:
        for p in psutil.Process(pi.proc.pid).children(recursive=True):
            try:
                if f"sleep {START_S}" in " ".join(p.cmdline()):
                    found.append(p)
                    return True
            except psutil.NoSuchProcess:
                continue
        return False

    assert poll_until(look, timeout=15), "Pi never started castor"
    return found[0]


def ui_up(pi: PiTty) -> None:
    """Pi's terminal UI is drawn (its footer names the model): its keys are Pi's now (before, the
    terminal was not in raw mode yet and a Ctrl+C was a SIGINT that ended Pi outright)."""
    wait_for(lambda: "fake-model" in pi.screen_tail(100_000), timeout=15,
             what=f"Pi's UI; Pi drew: {pi.screen_tail()!r}")
    time.sleep(0.5)


def test_ctrl_c_twice_while_castor_starts_quits_at_once(start_tty):
    pi = start_tty(slow_castor())
    shell = castor_starting(pi)
    ui_up(pi)
    assert pi.screen_tail(SCREEN).count(TITLE) == 0, "Pi's start was not held while castor starts"
    started = time.monotonic()
    pi.press(CTRL_C)
    pi.press(CTRL_C)
    assert poll_until(lambda: pi.proc.poll() is not None, timeout=START_S + 10), "Pi did not exit"
    took = time.monotonic() - started
    assert pi.proc.returncode == 0, pi.proc.returncode  # Pi's own quit, not a signal
    assert took < 1.5, f"quitting waited {took:.1f} s for castor to start"
    # Pi's start did not go on before its quit: the handler returned at the keys, Pi finished its
    # start first (its syntax grammars load: half a second of its event loop, which at a load of 15
    # made quitting take 2 s). Pi titles the terminal as its start ends and again as it shuts down.
    assert pi.drained(timeout=5), "Pi's terminal stayed open after it exited"
    titles = pi.screen_tail(SCREEN).count(TITLE)
    assert titles <= 1, f"Pi finished its start before quitting (the terminal titled {titles} times)"
    gone = poll_until(lambda: not shell.is_running() or shell.status() == psutil.STATUS_ZOMBIE, timeout=3)
    assert gone, "the castor that was starting was left behind"


def test_esc_after_a_prompt_while_castor_starts_stops_that_prompt(start_tty, fake_llm):
    pi = start_tty(slow_castor())
    castor_starting(pi)
    ui_up(pi)
    pi.type("HELD-PROMPT")
    time.sleep(0.3)
    pi.press(ESC)
    wait_for(lambda: "the prompt sent meanwhile is stopped" in pi.screen_tail(100_000), timeout=3,
             what=f"the notice; Pi drew: {pi.screen_tail()!r}")
    # castor goes on starting behind the Esc; the held prompt never reaches the model, the next one does.
    wait_for(lambda: "castor: up" in pi.screen_tail(100_000), timeout=START_S + 10,
             what=f"castor up in Pi's footer; Pi drew: {pi.screen_tail()!r}")
    pi.type("NEXT-PROMPT")
    wait_for(lambda: any("NEXT-PROMPT" in json.dumps(r) for r in fake_llm.log()), timeout=15,
             what=f"the next prompt's model request; Pi drew: {pi.screen_tail()!r}")
    assert not any("HELD-PROMPT" in json.dumps(r["messages"][-1]) for r in fake_llm.log()), \
        "the prompt the Esc was meant for was asked of the model"


def test_an_rpc_abort_after_a_prompt_while_castor_starts_ends_the_prompt_at_once(start_pi, fake_llm):
    pi = start_pi(slow_castor())
    castor_starting(pi)
    # Pi reads its commands while castor starts (before, it read none until castor was up).
    asked = time.monotonic()
    pi.request({"type": "get_state"}, timeout=START_S + 10)
    assert time.monotonic() - asked < 1.5, "Pi read no command until castor had started"
    held = pi.mark()
    pi.send({"type": "prompt", "message": "HELD-PROMPT"})
    time.sleep(0.3)
    started = time.monotonic()
    pi.request({"type": "abort"}, timeout=START_S + 10)
    took = time.monotonic() - started
    assert took < 1.5, f"the abort waited {took:.1f} s for castor to start"
    assert pi.wait_for(lambda e: e.get("type") == "agent_settled", start=held, timeout=3)["aborted"] is True
    # castor goes on starting behind the abort; the held prompt never reaches the model, the next one does.
    pi.wait_ui("setStatus", lambda e: str(e.get("statusText", "")).startswith("castor: up"), timeout=START_S + 10)
    pi.prompt("NEXT-PROMPT")
    assert any("NEXT-PROMPT" in json.dumps(r["messages"]) for r in fake_llm.log())
    assert not any("HELD-PROMPT" in json.dumps(r["messages"][-1]) for r in fake_llm.log()), \
        "the prompt the abort was meant for was asked of the model"


def test_the_end_of_rpc_input_while_castor_starts_exits_at_once_and_leaves_no_castor(start_pi):
    pi = start_pi(slow_castor())
    shell = castor_starting(pi)
    time.sleep(0.3)
    started = time.monotonic()
    assert pi.proc.stdin is not None
    pi.proc.stdin.close()
    assert poll_until(lambda: pi.proc.poll() is not None, timeout=START_S + 10), "Pi did not exit"
    took = time.monotonic() - started
    assert took < 2.0, f"Pi's exit waited {took:.1f} s for castor to start"
    gone = poll_until(lambda: not shell.is_running() or shell.status() == psutil.STATUS_ZOMBIE, timeout=3)
    assert gone, "the castor that was starting was left behind"

"""A /materia or /icarus command while castor does not answer (stopped with SIGSTOP: wedged, not dead).

The hooks already skip a castor a deadline found silent after a quick probe. The commands did
not: each one waited out the whole deadline again (``/materia status`` typed three times against a
stopped castor took three deadlines), where a probe says in two seconds that castor is not answering
and how to restart it.
"""

from __future__ import annotations

import os
import signal
import time

import psutil
import pytest

from .pi_rpc import PiRpc
from .test_pi_castor_e2e import up

pytestmark = [pytest.mark.pi, pytest.mark.timeout(120)]

DEADLINE_MS = 6000


def castor_process(pi: PiRpc) -> psutil.Process:
    found = [p for p in psutil.Process(pi.proc.pid).children(recursive=True)
             if "serve" in p.cmdline() and "--stdio" in p.cmdline()]
    assert len(found) == 1, [p.cmdline() for p in found]
    return found[0]


def timed_command(pi: PiRpc, text: str) -> tuple[float, str, str]:
    """Run a command; (seconds until its notice, the notice, its level)."""
    started = time.monotonic()
    mark = pi.command(text)
    note = pi.wait_ui("notify", lambda e: not str(e.get("message", "")).startswith("castor is not answering (nothing"),
                      start=mark, timeout=DEADLINE_MS / 1000 + 10)
    return time.monotonic() - started, str(note.get("message")), str(note.get("notifyType"))


def test_commands_against_a_stopped_castor_cost_a_probe_after_the_first_deadline(start_pi, castor_command):
    pi = start_pi(castor_command, timeout_ms=DEADLINE_MS)
    up(pi)
    opened = pi.command("/materia status")
    pi.wait_ui("notify", lambda e: "No pi-materia cast state" in str(e.get("message")), start=opened)
    castor = castor_process(pi)  # the session is open on it: its answer came
    os.kill(castor.pid, signal.SIGSTOP)
    try:
        first, text, level = timed_command(pi, "/materia status")
        # The one deadline that finds castor silent.
        assert first >= DEADLINE_MS / 1000 - 0.5 and level == "error", (first, text)
        for command in ("/materia status", "/materia casts", "/icarus status"):
            took, text, level = timed_command(pi, command)
            print(f"{command} answered after {took:.1f} s: {text}")
            assert took < DEADLINE_MS / 1000 - 2, f"{command} waited {took:.1f} s for a stopped castor"
            assert level == "error" and "castor is not answering" in text and "/castor restart" in text, text
        mark = pi.mark()
        os.kill(castor.pid, signal.SIGCONT)
        # castor answers what it owed, so it speaks again: the next command reaches it.
        pi.wait_ui("notify", lambda e: e.get("message") == "castor is answering again", start=mark, timeout=15)
        took, text, level = timed_command(pi, "/materia status")
        assert "not answering" not in text and "did not answer" not in text, text
    finally:
        try:
            os.kill(castor.pid, signal.SIGCONT)
        except ProcessLookupError:
            pass

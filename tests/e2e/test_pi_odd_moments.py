"""What a user does at odd moments under real Pi: a prompt while ``/castor restart`` stops castor,
and the like.

Real Pi in RPC mode with the extension, the real castor runtime and the FAKE model (the shapes of
test_pi_cancel_moments.py). Each test drives Pi as a user would and checks what the user sees and
what is left running.
"""

from __future__ import annotations

import os
import signal
import time

import pytest

from tests.support.waiting import poll_until

from .test_pi_cancel_moments import processes_with, start, write_loadout
from .test_pi_cancellation import error_toasts, requests_with, run_dir

pytestmark = [pytest.mark.pi, pytest.mark.timeout(120)]


def test_a_prompt_while_castor_restart_stops_castor_waits_for_the_stop_and_the_old_castor_gets_its_grace(
        start_pi, castor_command, fake_llm, tmp_path):
    """``/castor restart`` stops castor (its stdin closed, SIGKILL only after a 2 s grace, in which
    castor ends the utility commands its casts run), then starts the next one. A prompt sent at the
    same moment has a hook (``before_agent_start``) that calls castor: it used to start the next
    castor at once, and the old one was then SIGKILLed without its grace -- a command that takes a
    moment to end (here one that ignores SIGTERM, which castor SIGKILLs after its own second) went
    on running with no owner. The hook now waits for the stop to end and is answered by the next castor."""
    marker = "sleep 46.25"
    utility = {"type": "utility", "timeoutMs": 120000, "edges": [{"when": "always", "to": "Socket-2"}],
               "command": ["sh", "-c", f"trap '' TERM; {marker}"]}
    root = write_loadout(tmp_path / "project", utility)
    pi = start(start_pi, castor_command, root)
    pi.command("/materia cast build the thing")
    run_dir(root)
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

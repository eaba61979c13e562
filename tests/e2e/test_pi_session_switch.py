"""Pi replacing its session (/new, /resume, /fork) while castor runs, and in the middle of a cast.

Pi 1.x loads every extension afresh for the session that replaces the current one: the instance
that served the old session gets its ``session_shutdown`` and is never called again, and the new
instance starts a castor of its own. The old instance stopped its castor only when Pi quit, so each
replacement left one more ``castor serve`` (and its workers) running until Pi exited.

A cast whose turn was running when the session was replaced is not lost: the old session closes
mid-turn (the cast stays resumable), the new session's start says the cast was restored, and
``/materia continue`` there runs the lost turn again and completes the cast.
"""

from __future__ import annotations

import json
from pathlib import Path

import psutil
import pytest

from tests.support.waiting import poll_until

from .conftest import read_jsonl
from .pi_rpc import PiRpc
from .test_pi_cancellation import (
    STALL_S,
    completes,
    error_toasts,
    project,
    requests_with,
    run_dir,
    status,
    up,
    wait_cast_end,
    wait_request,
)

pytestmark = [pytest.mark.pi, pytest.mark.timeout(120)]


def castor_runtimes(pi: PiRpc) -> list[psutil.Process]:
    """The ``castor serve --stdio`` processes under Pi that are still running."""
    found = []
    for p in psutil.Process(pi.proc.pid).children(recursive=True):
        try:
            line = p.cmdline()
            if "serve" in line and "--stdio" in line and p.status() != psutil.STATUS_ZOMBIE:
                found.append(p)
        except psutil.NoSuchProcess:
            continue
    return found


def replace_session(pi: PiRpc, command: dict) -> None:
    """Run an RPC command that replaces the session; wait until the new session's castor is up."""
    mark = pi.mark()
    pi.request(command, timeout=40)
    pi.wait_ui("setStatus", lambda e: str(e.get("statusText", "")).startswith("castor: up"), start=mark, timeout=40)


def test_replacing_the_session_leaves_one_castor_not_one_per_session(start_pi, castor_command, tmp_path):
    pi = start_pi(castor_command, settings={"defaultProjectTrust": "always"})
    up(pi)
    assert poll_until(lambda: len(castor_runtimes(pi)) == 1, timeout=10)
    pi.prompt("hello there")  # a session with a message is saved: /resume and /fork can go back to it
    first_file = pi.request({"type": "get_state"})["data"]["sessionFile"]
    replace_session(pi, {"type": "new_session"})
    replace_session(pi, {"type": "switch_session", "sessionPath": first_file})
    (message, *_) = pi.request({"type": "get_fork_messages"})["data"]["messages"]
    replace_session(pi, {"type": "fork", "entryId": message["entryId"]})
    # Before, three castor runtimes more were left behind here (one per replaced session).
    assert poll_until(lambda: len(castor_runtimes(pi)) == 1, timeout=10), \
        [p.cmdline() for p in castor_runtimes(pi)]
    # The castor that is left is the current session's: it answers.
    start = pi.command("/castor status")
    pi.wait_ui("notify", lambda e: " up (pid " in str(e.get("message", "")), start=start, timeout=10)


def test_new_session_mid_turn_restores_the_cast_there_and_continue_completes_it(start_pi, castor_command, fake_llm,
                                                                                 tmp_path):
    root = project(tmp_path, "text")
    pi = start_pi(castor_command, cwd=root, settings={"defaultProjectTrust": "always"})
    up(pi)
    fake_llm.reply_text("BUILT never sent", when="BUILDER-MATERIA", delay=STALL_S)
    pi.command("/materia cast build the thing")
    run = run_dir(root)
    wait_request(fake_llm, "BUILDER-MATERIA")
    switched = pi.mark()
    replace_session(pi, {"type": "new_session"})
    # The new session's start names the cast the old one left mid-turn, and its footer.
    pi.wait_ui("notify", lambda e: f"pi-materia cast {run.name} restored" in str(e.get("message", "")),
               start=switched, timeout=10)
    assert completes(run) == [] and status(run) == "active"
    assert poll_until(lambda: len(castor_runtimes(pi)) == 1, timeout=10), \
        [p.cmdline() for p in castor_runtimes(pi)]
    fake_llm.reply_text("BUILT-AFTER-NEW", when="BUILDER-MATERIA")
    fake_llm.reply_text("REVIEWED-OK", when="REVIEWER-MATERIA")
    start = pi.command("/materia continue")
    done = wait_cast_end(pi, run, timeout=30)
    assert done[-1]["data"]["ok"] is True, done[-1]
    assert completes(run) == ["Socket-1", "Socket-2"]
    assert len(requests_with(fake_llm, "BUILDER-MATERIA")) == 2, "the lost builder turn runs again"
    assert error_toasts(pi, start) == []
    # The turns after the switch ran in the new session: its file holds the reviewer's prompt.
    new_file = Path(pi.request({"type": "get_state"})["data"]["sessionFile"])
    assert poll_until(lambda: new_file.exists() and "REVIEWER-MATERIA" in new_file.read_text(), timeout=10)


@pytest.mark.parametrize("command", ["new_session", "quit"])
def test_a_turn_castor_asks_for_as_the_session_ends_is_not_run(start_pi, probe_command, fake_llm, command):
    """castor may ask for a socket's turn in the moment Pi ends the session (a utility socket ended
    just then): the extension started it in the session being torn down, and the model got a request
    nobody would read. It is left unstarted: castor closes the session with the turn pending, so the
    cast stays resumable and a continue sends it again."""
    probe, log = probe_command
    pi = start_pi(probe, env={"CASTOR_PROBE_LOG": str(log), "CASTOR_PROBE_TURN_AT_SHUTDOWN": "LATE-SOCKET"})
    up(pi)
    if command == "new_session":
        replace_session(pi, {"type": "new_session"})
        pi.prompt("a prompt in the new session")  # Pi is usable; the late turn did not run before it
    else:
        pi.close(timeout=10)
    assert poll_until(lambda: any("session.close" == c["method"] for c in read_jsonl(log)), timeout=10)
    assert not any("TURN: LATE-SOCKET" in json.dumps(r["messages"]) for r in fake_llm.log()), \
        "the turn asked for as the session ended reached the model"

"""Quitting the interactive Pi while a cast's utility command runs.

The extension killed castor (SIGKILL) the moment castor closed its end of the pipe on its way
out, before castor could end the command: the command went on after Pi was gone (its outcome
seen by nobody) and ``/materia continue`` ran it a second time. Now castor gets its grace: the
command is ended (SIGTERM) as castor stops, and nothing of it runs on after Pi.
"""

from __future__ import annotations

import json
import time

import psutil
import pytest

from tests.support.waiting import poll_until, wait_for

pytestmark = [pytest.mark.pi, pytest.mark.timeout(120)]

UTILITY = ("echo $$ > util.pid; trap 'echo TERM >> util.log; exit 143' TERM; echo start >> util.log; "
           "sleep 60 & wait; echo done >> util.log")
CONFIG = {
    "activeLoadout": "U",
    "materia": {"W": {"prompt": "WRITER-MATERIA: write it.", "tools": "none"}},
    "loadouts": {"U": {"entry": "Socket-1", "sockets": {
        "Socket-1": {"type": "utility", "command": ["sh", "-c", UTILITY], "timeoutMs": 120000,
                     "edges": [{"when": "always", "to": "Socket-2"}]},
        "Socket-2": {"type": "agent", "materia": "W"}}}},
}


def test_quitting_pi_ends_the_running_utility_command_instead_of_leaving_it_behind(start_tty, castor_command,
                                                                                  tmp_path):
    project = tmp_path / "project"
    (project / ".pi").mkdir(parents=True)
    (project / ".pi" / "pi-materia.json").write_text(json.dumps(CONFIG))
    pi = start_tty(castor_command, settings={"defaultProjectTrust": "always"})
    wait_for(lambda: "castor: up" in pi.screen_tail(100_000), timeout=30,
             what=f"castor up in Pi's footer; Pi drew: {pi.screen_tail()!r}")
    pi.type("/materia cast build it")
    wait_for(lambda: (project / "util.pid").exists() and (project / "util.pid").read_text().strip(), timeout=30,
             what=f"the utility command running; Pi drew: {pi.screen_tail()!r}")
    shell = psutil.Process(int((project / "util.pid").read_text()))
    tree = [shell, *shell.children(recursive=True)]
    started = time.monotonic()
    pi.press(b"\x03")
    pi.press(b"\x03")  # Ctrl+C twice: quit
    assert poll_until(lambda: pi.proc.poll() is not None, timeout=30), "Pi did not exit"
    print(f"Pi exited {time.monotonic() - started:.1f} s after the second Ctrl+C")
    gone = poll_until(lambda: not any(p.is_running() and p.status() != psutil.STATUS_ZOMBIE for p in tree),
                      timeout=10)
    assert gone, [p.cmdline() for p in tree if p.is_running()]
    assert (project / "util.log").read_text().split() == ["start", "TERM"], "ended gently, never ran on"

"""``castor status ID`` of a cast another runtime holds says which one: the pid and command line of
the process holding its lease, as an operator needs to find it (``castor recast``'s conflict says
"`castor status ID` shows where"). Real processes: a ``castor serve`` holding a cast whose agent turn
never ends (no harness answers it), and ``castor status`` typed in another process."""

from __future__ import annotations

import json
import re
import signal
import subprocess
from pathlib import Path

import pytest

from castor.client import Client
from tests.support.served import CASTOR, served_env, start_a_cast_awaiting_its_turn, start_serve
from tests.support.waiting import wait_for

pytestmark = pytest.mark.timeout(90)



def _env(tmp_path: Path) -> dict[str, str]:
    return served_env(tmp_path)


def test_status_of_a_cast_a_serve_holds_names_the_serving_process(tmp_path):
    env = _env(tmp_path)
    served = start_serve(tmp_path, env)
    server, sock, project = served.process, served.socket, served.project
    try:
        wait_for(sock.exists, timeout=30, what="the socket")
        with Client.connect_unix(str(sock)) as client:
            cast_id = start_a_cast_awaiting_its_turn(client, project)
            text = subprocess.run([*CASTOR, "status", cast_id, "--cwd", str(project)], env=env,
                                  capture_output=True, text=True, timeout=30)
            assert text.returncode == 0, text.stderr
            first = text.stdout.splitlines()[0]
            assert f"pid {server.pid}" in first and "castor serve --socket" in first, first
            # what it does there and since when (as of its last save: the holder says no more)
            second = text.stdout.splitlines()[1]
            assert re.fullmatch(r"now: awaiting the agent's turn at Socket-1 \(greeter\), visit 1, since its last "
                                r"save at \d\d:\d\d:\d\d UTC \(\d+s ago\)", second), second
            shown = subprocess.run([*CASTOR, "status", cast_id, "--cwd", str(project), "--json"], env=env,
                                   capture_output=True, text=True, timeout=30)
            view = json.loads(shown.stdout)
            assert view["elsewhere"] is True
            assert view["held_by"]["pid"] == server.pid
            assert "serve" in view["held_by"]["command"]
    finally:
        server.send_signal(signal.SIGTERM)
        server.wait(30)


def test_a_wait_saved_before_today_reads_with_its_date():
    """``since its last save at 14:03:12 UTC (26h 0m ago)`` gave a time alone, for a save of yesterday
    as for one of today; a save not of today (UTC) now reads with its date before its time."""
    import time

    from castor.cli.materia import _waits_now

    pending = {"kind": "agent_turn", "socket_id": "Socket-1", "visit": 1}
    old = time.time() - 26 * 3600
    said = _waits_now({"pending": pending, "current_materia": "greeter", "updated_at": old})
    day = time.strftime("%Y-%m-%d", time.gmtime(old))
    assert said is not None and re.search(rf", since its last save at {day} \d\d:\d\d:\d\d UTC \(26h 0m ago\)$",
                                          said), said
    now = _waits_now({"pending": pending, "current_materia": "greeter", "updated_at": time.time()})
    assert now is not None and re.search(r", since its last save at \d\d:\d\d:\d\d UTC \(0s ago\)$", now), now

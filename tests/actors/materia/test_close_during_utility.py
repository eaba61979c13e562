"""A session that closes (its harness quit) while its cast's utility command runs ends the
command: nobody would take its outcome, and a continue runs it again. It went on unseen until
it finished (a shared `castor serve` keeps running when one Pi quits)."""

from __future__ import annotations

import time

import psutil
import pytest

from tests.support.waiting import poll_until

from .helpers import wait_for, write_project_config
from .test_endpoint import FakeHarness

# util.pid is written last: once the test sees it, the trap is set and the sleep is forked (a TERM
# before the trap ended the shell silently; a tree read before the fork missed the sleep)
UTILITY = ("trap 'echo TERM >> util.log; exit 143' TERM; echo start >> util.log; "
           "sleep 60 & echo $$ > util.pid; wait; echo done >> util.log")


@pytest.mark.timeout(60)
def test_closing_the_session_ends_its_casts_running_command_gently(served, project):
    write_project_config(project, {"activeLoadout": "U", "loadouts": {"U": {"entry": "Socket-1", "sockets": {
        "Socket-1": {"type": "utility", "command": ["sh", "-c", UTILITY], "timeoutMs": 120000}}}}})
    client = served()
    FakeHarness(client, "pi-1", {})
    client.call("session.open", {"session_id": "pi-1", "cwd": str(project), "trusted": True})
    cast_id = client.call("cast.start", {"session_id": "pi-1", "cwd": str(project), "request": "go"})["cast_id"]
    pid_file = project / "util.pid"
    wait_for(lambda: pid_file.exists() and pid_file.read_text().strip(), what="the command running")
    shell = psutil.Process(int(pid_file.read_text()))
    tree = [shell, *shell.children(recursive=True)]
    started = time.monotonic()
    client.call("session.close", {"session_id": "pi-1"})
    assert poll_until(lambda: not any(p.is_running() and p.status() != psutil.STATUS_ZOMBIE for p in tree),
                      timeout=5), [p.cmdline() for p in tree if p.is_running()]
    assert time.monotonic() - started < 3
    assert (project / "util.log").read_text().split() == ["start", "TERM"]
    # the cast stays resumable: a new session continues it and the command runs again
    client.call("session.open", {"session_id": "pi-2", "cwd": str(project), "trusted": True})
    rows = client.call("cast.list", {"session_id": "pi-2", "cwd": str(project)})["casts"]
    assert [(r["cast_id"], r["resumable"]) for r in rows] == [(cast_id, True)]

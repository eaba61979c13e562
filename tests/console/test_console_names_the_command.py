""""What is it doing?" asked of the console about a cast stuck in a long utility command.

``castor status`` names the command a cast runs (its command line, its pid, how long it has run);
the console's cast rows named none of it: a live cast said "its command runs (pid N)", a cast
another castor runs said only who holds it, and a cast whose runtime was killed (``kill -9``), its
command running on unowned, looked like any other cast not running here. Each row now carries
the command as ``castor status`` finds it (the API's ``command_running``: ``pid``, ``command``,
``started_at``) and the page says it in ``castor status``'s words: a cast running here, one another
castor runs (its runtime alive), and the same one once that runtime was killed.

A real ``castor serve --console`` in a real headless Chromium (see test_console_browser), the
other runtime a real ``castor cast``."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from castor.client import Client
from tests.console.conftest import TOKENS, browser_errors, serve_env, start_console, stop
from tests.support.processes import terminate_then_kill
from tests.support.waiting import wait_for

pytestmark = [pytest.mark.browser, pytest.mark.timeout(150)]

COMMAND = 'echo $$ >> started.txt; while [ ! -e release.txt ]; do sleep 0.05; done; echo ok'
CONFIG = {"activeLoadout": "U", "loadouts": {"U": {"entry": "Socket-1", "sockets": {
    "Socket-1": {"type": "utility", "command": ["sh", "-c", COMMAND], "timeoutMs": 600000}}}}}
WORDS = re.compile(r"`sh -c echo \$\$ >> started\.txt; [^`]*` \(pid (\d+), for \d+s\)")


def _text(browser, selector: str) -> str | None:
    return browser.execute_script(f"const li = document.querySelector({json.dumps(selector)});"
                                  " return li && li.textContent")


def _started(project: Path) -> list[int]:
    path = project / "started.txt"
    return [int(line) for line in path.read_text().split()] if path.exists() else []


def test_the_console_names_the_utility_command_a_cast_runs_as_castor_status_does(browser, tmp_path):
    project = tmp_path / "project"
    (project / ".pi").mkdir(parents=True)
    (project / ".pi" / "pi-materia.json").write_text(json.dumps(CONFIG))
    server, url, sock = start_console(tmp_path)
    client = Client.connect_unix(str(sock))
    other = None
    try:
        client.on_request("session.append_entry", lambda p: {"ok": True, "entry_id": "e"})
        client.call("session.open", {"session_id": "s1", "cwd": str(project), "trusted": True}, timeout=20)
        here = client.call("cast.start", {"session_id": "s1", "cwd": str(project), "request": "here"},
                           timeout=20)["cast_id"]
        wait_for(lambda: len(_started(project)) == 1, timeout=30, what="the command of the cast running here")
        env = {**serve_env(tmp_path), "CASTOR_AGENT": "", "PYTHONPATH": os.environ.get("PYTHONPATH", "")}
        (tmp_path / "answers.json").write_text("[]")
        other = subprocess.Popen([sys.executable, "-m", "castor", "cast", "elsewhere", "--agent",
                                  f"script:{tmp_path / 'answers.json'}", "--quiet"], cwd=str(project),
                                 env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                 stderr=subprocess.DEVNULL)
        wait_for(lambda: len(_started(project)) == 2 or other.poll() is not None, timeout=40,
                 what="the command of the cast another castor runs")
        assert other.poll() is None
        [elsewhere] = [p.name for p in (project / ".pi" / "pi-materia").iterdir() if p.is_dir() and p.name != here]

        browser.get(f"{url}?token={TOKENS[url]}")
        # The cast running here: its row names the command, its pid and how long, as castor status does.
        line = wait_for(lambda: (t := _text(browser, f'[data-session="s1"] li[data-cast="{here}"]'))
                        and WORDS.search(t) and t, timeout=20, what="the live cast's command on its row")
        assert "; running its utility command `sh -c" in line, line
        assert int(WORDS.search(line).group(1)) == _started(project)[0]
        # The cast another castor runs (its runtime alive): who holds it, and the command it runs.
        row = f'[data-session="s1"] li[data-ended="{elsewhere}"]'
        line = wait_for(lambda: (t := _text(browser, row)) and WORDS.search(t) and t, timeout=20,
                        what="the other runtime's cast's command on its row")
        assert f"held by pid {other.pid}" in line and "; running its utility command `sh -c" in line, line
        assert int(WORDS.search(line).group(1)) == _started(project)[1]
        assert "left by the runtime that stopped" not in line

        other.send_signal(signal.SIGKILL)  # its runtime killed: the command runs on, unowned
        other.wait(10)
        line = wait_for(lambda: (t := _text(browser, row)) and "left by the runtime that stopped" in t and t,
                        timeout=30, what="the killed runtime's command, still running, on its row")
        assert "held by" not in line and WORDS.search(line), line
        assert "; its utility command `sh -c echo $$ >> started.txt;" in line
        assert int(WORDS.search(line).group(1)) == _started(project)[1]

        # The API says the same: the document the page draws.
        doc = browser.execute_script("return lastDoc")
        [session] = [s for s in doc["sessions"] if s["session_id"] == "s1"]
        [live] = [c for c in session["casts"] if c["cast_id"] == here]
        [left] = [c for c in session["ended"] if c["cast_id"] == elsewhere]
        assert live["command_running"]["pid"] == _started(project)[0]
        assert left["command_running"]["pid"] == _started(project)[1] and left["command_running"]["orphaned"]
        assert browser_errors(browser) == []
    finally:
        (project / "release.txt").write_text("go")
        if other is not None:
            terminate_then_kill(other)
        client.close()
        stop(server)

"""``/metrics`` of a real ``castor serve``: a gauge by kind keeps its series when the last actor of
the kind is gone (a cast that ended: its CastActor and SocketActor stop), at 0, as the counters by
kind do -- a series that vanishes leaves a dashboard's line with a gap, and an alert on it reads
"no data" rather than "0"."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest

from castor.client import Client
from tests.support.waiting import wait_for

pytestmark = pytest.mark.timeout(90)

CASTOR = [sys.executable, "-m", "castor"]


def _env(tmp_path: Path) -> dict[str, str]:
    env = dict(os.environ)
    env["HOME"] = str(tmp_path / "home")
    (tmp_path / "home").mkdir(exist_ok=True)
    env["PI_CODING_AGENT_DIR"] = str(tmp_path / "home" / ".pi" / "agent")
    env.pop("MATERIA_CONFIG", None)
    env.pop("CASTOR_LOG_JSON", None)
    env.pop("XDG_RUNTIME_DIR", None)
    return env


def _sample(text: str, series: str) -> float | None:
    for line in text.splitlines():
        if line.startswith(series + " "):
            return float(line.rsplit(" ", 1)[1])
    return None


def test_gauges_by_kind_stay_at_0_once_the_last_actor_of_the_kind_is_gone(tmp_path):
    env = _env(tmp_path)
    project = tmp_path / "project"
    project.mkdir()
    sock = tmp_path / "castor.sock"
    log = tmp_path / "serve.log"
    with log.open("w") as stderr:
        server = subprocess.Popen([*CASTOR, "serve", "--socket", str(sock), "--console", "127.0.0.1:0"],
                                  env=env, stdout=subprocess.DEVNULL, stderr=stderr)
    try:
        console = wait_for(lambda: re.search(r"console: (http://127\.0\.0\.1:\d+/) \(token file: ([^)]+)\)",
                                             log.read_text()), 30, "the console's line")
        token = Path(console.group(2)).read_text().strip()

        def metrics() -> str:
            request = urllib.request.Request(console.group(1) + "metrics",
                                             headers={"Authorization": f"Bearer {token}"})
            with urllib.request.urlopen(request, timeout=10) as response:
                return response.read().decode()

        with Client.connect_unix(str(sock)) as client:
            turns: list[dict] = []
            client.on_notification("agent.run_turn", turns.append)
            client.on_request("session.append_entry", lambda p: {"ok": True, "entry_id": "e"})
            client.call("session.open", {"session_id": "s1", "cwd": str(project), "trusted": True}, timeout=20)
            client.call("loadout.set", {"session_id": "s1", "cwd": str(project), "name": "hello"}, timeout=20)
            cast_id = client.call("cast.start", {"session_id": "s1", "cwd": str(project), "request": "hi"},
                                  timeout=20)["cast_id"]
            wait_for(lambda: turns, timeout=20, what="the agent turn")
            live = metrics()
            assert _sample(live, 'castor_actors{kind="CastActor",state="running"}') == 1
            assert _sample(live, 'castor_mailbox_depth{kind="SocketActor"}') == 0
            client.call("cast.abort", {"session_id": "s1", "cwd": str(project), "cast_id": cast_id}, timeout=20)
            wait_for(lambda: 'kind="CastActor",state="running"} 1' not in metrics(), 30, "the cast's actor gone")
            ended = metrics()
        for kind in ("CastActor", "SocketActor"):
            assert _sample(ended, f'castor_actors{{kind="{kind}",state="running"}}') == 0, ended
            assert _sample(ended, f'castor_mailbox_depth{{kind="{kind}"}}') == 0
            assert _sample(ended, f'castor_mailbox_oldest_age_seconds{{kind="{kind}"}}') == 0
            assert _sample(ended, f'castor_actor_restarts{{kind="{kind}"}}') == 0
            assert _sample(ended, f'castor_starts_total{{kind="{kind}"}}') == 1  # the counters kept theirs
    finally:
        server.send_signal(signal.SIGTERM)
        server.wait(30)

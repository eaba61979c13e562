"""A real ``castor serve`` as an operator's tests start it, apart from the user's own setup.

``served_env`` is the environment: a home of the test's own (no user config, no Pi settings but
the Icarus package given), no ``MATERIA_CONFIG``, JSON logs and runtime directory left to the
command line. ``metrics_reader`` waits for the console's line in the serve's log and reads
``/metrics`` with its token. ``start_a_cast_awaiting_its_turn`` opens a trusted session on a
client and starts the ``hello`` loadout's cast, returning once its agent turn was asked for.
``start_serve`` starts the serve itself beside an empty project directory.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from castor.client import Client
from tests.support.waiting import wait_for

CASTOR = [sys.executable, "-m", "castor"]
_CONSOLE_LINE = re.compile(r"console: (http://127\.0\.0\.1:\d+/) \(token file: ([^)]+)\)")


def served_env(tmp_path: Path, icarus_package: Path | None = None, **extra: str) -> dict[str, str]:
    """The serve's (and the CLI's) environment under ``tmp_path``; ``icarus_package``: the Pi
    settings name it (its Python the test's, memory under ``tmp_path/fabric``, no classifier)."""
    env = dict(os.environ)
    env["HOME"] = str(tmp_path / "home")
    agent = tmp_path / "home" / ".pi" / "agent"
    agent.mkdir(parents=True, exist_ok=True)
    if icarus_package is not None:
        (agent / "settings.json").write_text(json.dumps({"piIcarusHook": {
            "icarusDir": str(icarus_package), "python": sys.executable, "fabricDir": str(tmp_path / "fabric"),
            "classifier": "none"}}))
    env["PI_CODING_AGENT_DIR"] = str(agent)
    for name in ("XDG_RUNTIME_DIR", "MATERIA_CONFIG", "CASTOR_LOG_JSON"):
        env.pop(name, None)
    env.update(extra)
    return env


def metrics_reader(serve_log: Path) -> Callable[[], str]:
    """Once the serve's log names its console: a function that reads its ``/metrics`` text."""
    console = wait_for(lambda: _CONSOLE_LINE.search(serve_log.read_text()), 30, "the console's line")
    url, token = console.group(1) + "metrics", Path(console.group(2)).read_text().strip()

    def metrics() -> str:
        request = urllib.request.Request(url, headers={"Authorization": f"Bearer {token}"})
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.read().decode()

    return metrics


def start_a_cast_awaiting_its_turn(client: Client, project: Path) -> str:
    """The id of a cast of the ``hello`` loadout in session ``s1``, its first agent turn asked for
    (and never answered: the cast waits for it)."""
    turns: list[dict] = []
    client.on_notification("agent.run_turn", turns.append)
    client.on_request("session.append_entry", lambda p: {"ok": True, "entry_id": "e"})
    client.call("session.open", {"session_id": "s1", "cwd": str(project), "trusted": True}, timeout=20)
    client.call("loadout.set", {"session_id": "s1", "cwd": str(project), "name": "hello"}, timeout=20)
    cast_id: str = client.call("cast.start", {"session_id": "s1", "cwd": str(project), "request": "hi"},
                               timeout=20)["cast_id"]
    wait_for(lambda: turns, timeout=20, what="the agent turn")
    return cast_id


@dataclass(frozen=True)
class Served:
    """A ``castor serve`` a test started: its process, its socket, the file its stderr goes to,
    and the empty project directory beside it."""

    process: subprocess.Popen[bytes]
    socket: Path
    log: Path
    project: Path


def start_serve(tmp_path: Path, env: dict[str, str], *serve_flags: str, log_json: bool = False) -> Served:
    """``castor [--log-json] serve --socket tmp_path/castor.sock SERVE_FLAGS``, its stderr in
    ``tmp_path/serve.log``, ``tmp_path/project`` made; returns at once (the socket may not be
    there yet: ``metrics_reader`` or a wait on ``socket.exists`` tells when it is)."""
    project = tmp_path / "project"
    project.mkdir()
    sock, log = tmp_path / "castor.sock", tmp_path / "serve.log"
    with log.open("w") as stderr:
        process = subprocess.Popen([*CASTOR, *(["--log-json"] if log_json else []), "serve", "--socket", str(sock),
                                    *serve_flags], env=env, stdout=subprocess.DEVNULL, stderr=stderr)
    return Served(process, sock, log, project)

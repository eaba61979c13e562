"""``castor abort ID`` of a cast a ``castor serve`` holds, typed at another terminal.

The abort leaves its request in the cast's run directory; the runtime that holds the cast -- here
a real ``castor serve`` with a real client session playing the harness -- takes it and aborts the
cast within the abort's wait, so the command says ``aborted``, and the harness session is told as
by its own ``/materia abort``. It used to be taken only by a ``castor cast`` process's own loop:
a serve never did, and the abort waited 5 s then said ``conflict``; ``castor status`` sent the
operator to ``/materia abort`` in a session they cannot type into."""

from __future__ import annotations

import json
import os
import queue
import re
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from castor.client import Client
from tests.cli.interrupted_cast import castor_cli
from tests.support.waiting import wait_for

SID = "s1"


class Served:
    """A ``castor serve`` on a unix socket and one client session of it in ``project``."""

    def __init__(self, tmp_path: Path, project: Path) -> None:
        self.sock = tmp_path / "castor.sock"
        self.server = subprocess.Popen([sys.executable, "-m", "castor", "serve", "--socket", str(self.sock)],
                                       env={**os.environ, "HOME": str(tmp_path / "home")},
                                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        self.client: Client | None = None
        self.turns: queue.Queue[dict[str, Any]] = queue.Queue()
        self.notes: queue.Queue[dict[str, Any]] = queue.Queue()
        wait_for(self.sock.exists, timeout=30, what="the socket")
        self.client = Client.connect_unix(str(self.sock))
        self.client.on_notification("agent.run_turn", self.turns.put)
        self.client.on_notification("ui.notify", self.notes.put)
        self.call("session.open", cwd=str(project), trusted=True)
        self.project = project

    def call(self, method: str, **params: Any) -> Any:
        assert self.client is not None
        return self.client.call(method, {"session_id": SID, **params}, timeout=20)

    def close(self) -> None:
        if self.client is not None:
            self.client.close()
        self.server.send_signal(signal.SIGTERM)
        try:
            self.server.wait(30)
        except subprocess.TimeoutExpired:
            self.server.kill()
            self.server.wait(10)

    def told(self, pattern: str, timeout: float = 10) -> str:
        """The first ``ui.notify`` message the session is told that matches ``pattern``."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                note = self.notes.get(timeout=max(0.01, deadline - time.monotonic()))
            except queue.Empty:
                raise AssertionError(f"the session was never told {pattern!r}") from None
            if re.search(pattern, str(note.get("message"))):
                return str(note.get("message"))


def _served_cast(tmp_path: Path) -> tuple[Served, str]:
    project = tmp_path / "my project"
    project.mkdir()
    served = Served(tmp_path, project)
    served.call("loadout.set", cwd=str(project), name="hello")
    cast_id = served.call("cast.start", cwd=str(project), request="hi")["cast_id"]
    served.turns.get(timeout=20)  # the agent's turn runs (the harness never answers it)
    return served, cast_id


def test_castor_abort_from_another_directory_aborts_a_cast_a_serve_holds(tmp_path):
    served, cast_id = _served_cast(tmp_path)
    try:
        elsewhere = tmp_path / "elsewhere"
        elsewhere.mkdir()
        shown = castor_cli(tmp_path, "status", cast_id, "--cwd", str(served.project), cwd=elsewhere)
        assert shown.returncode == 0, shown.stderr
        first = shown.stdout.splitlines()[0]
        hint = re.search(r"(castor abort .*?) asks", first)  # the abort status names, typed as shown
        assert hint, first
        assert "/materia abort" not in first, first
        started = time.monotonic()
        aborted = castor_cli(tmp_path, *shlex.split(hint.group(1))[1:], cwd=elsewhere)
        took = time.monotonic() - started
        assert aborted.returncode == 0, aborted.stderr
        assert f"pi-materia cast {cast_id} aborted." in aborted.stdout, aborted.stdout
        assert took < 30, took  # within its wait (5 s) plus a process start under load
        note = served.told(rf"pi-materia cast {cast_id} aborted")  # as the session's own /materia abort tells it
        # but its user did not ask for it: said so, with how to go on in the session
        assert note == (f"pi-materia cast {cast_id} aborted from outside this session (castor abort). "
                        f"Recast it with /materia recast {cast_id}."), note
        saved = json.loads((served.project / ".pi" / "pi-materia" / cast_id / "state.json").read_text())["state"]
        assert saved["aborted"] is True and saved["active"] is False
        assert not (served.project / ".pi" / "pi-materia" / cast_id / "abort.request").exists()
        view = served.call("cast.status", cast_id=cast_id)
        assert view["status"] == "aborted"
    finally:
        served.close()


def test_a_stale_abort_request_never_aborts_the_cast_a_serve_takes_over(tmp_path):
    """A request left from before the serve took the cast (a killed ``castor abort``'s) is removed
    with a warning to the session, never applied: the cast runs on."""
    served, cast_id = _served_cast(tmp_path)
    try:
        run_dir = served.project / ".pi" / "pi-materia" / cast_id
        request = run_dir / "abort.request"
        request.write_text(json.dumps({"requested_at": time.time() - 3600, "pid": 1}))
        served.told(r"abort request .* was left from before")
        assert not request.exists()
        view = served.call("cast.status", cast_id=cast_id)
        assert view["status"] == "active", view
    finally:
        served.close()

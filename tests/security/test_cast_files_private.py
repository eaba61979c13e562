"""Another local user reading a project's casts: a cast's files hold its request, the prompts
castor sent (with the memory Icarus recalled into them) and the model's answers. The project is
the user's, and often world-readable (a home of ``0755``, a checkout under ``umask 022``), so
castor keeps what it writes about a cast to its own user: a run directory is ``0700``, the
artifact root castor makes is ``0700``, and the cast index (which keeps each request's head) is
``0600``. Each test runs a real ``castor cast``, then reads the project as uid ``nobody``."""

from __future__ import annotations

import json
import os
import stat
import subprocess
from pathlib import Path

import pytest

from tests.support.other_user import files_nobody_reads

from .conftest import castor_argv, serve_env

pytestmark = [pytest.mark.timeout(120),
              pytest.mark.skipif(os.geteuid() != 0, reason="reading as another user needs root to fork one")]

REQUEST = "secret-request-7f3a: rotate the production database password"
ANSWER = "secret-answer-9c1e"
TITLE = "secret-title-41d0"  # a work item's title, which the CLI's session log keeps beside the runs



def _cast(project: Path, tmp: Path) -> None:
    env = {**serve_env(tmp), "CASTOR_AGENT": "", "MATERIA_CONFIG": ""}
    answers = [{"key": "Socket-3", "text": json.dumps({"workItems": [{"id": "w1", "title": TITLE}]})},
               {"key": "Socket-4/w1", "text": ANSWER}, {"key": "Socket-5/w1", "text": '{"satisfied": true}'},
               "Summary: done."]
    (tmp / "answers.json").write_text(json.dumps(answers))
    done = subprocess.run(castor_argv("cast", REQUEST, "--agent", f"script:{tmp / 'answers.json'}", "--quiet"),
                          cwd=str(project), env=env, capture_output=True, text=True, timeout=100)
    assert done.returncode == 0, done.stderr


def test_another_user_reads_no_request_prompt_or_answer_of_a_cast(reachable, tmp_path):
    project = reachable / "project"
    project.mkdir(mode=0o755)
    _cast(project, tmp_path)
    root = project / ".pi" / "pi-materia"
    [run] = [p for p in root.iterdir() if p.is_dir()]
    assert REQUEST in (run / "state.json").read_text()  # it is there, for castor's user
    assert files_nobody_reads(project, (REQUEST, ANSWER, "secret-")) == []
    assert stat.S_IMODE(run.stat().st_mode) == 0o700
    assert stat.S_IMODE(root.stat().st_mode) == 0o700
    index = root / ".castor-index.sqlite3"
    assert index.exists() and stat.S_IMODE(index.stat().st_mode) & 0o077 == 0


def test_a_new_cast_in_an_artifact_root_others_may_read_is_still_private(reachable, tmp_path):
    """A project whose ``.pi/pi-materia`` exists already, ``0755`` (made by an older castor or by
    pi-materia): the new cast's run directory, a new index and a new session log (the CLI's, which
    keeps each work item's title) are the user's alone all the same."""
    project = reachable / "project"
    root = project / ".pi" / "pi-materia"
    root.mkdir(parents=True, mode=0o755)
    root.chmod(0o755)
    _cast(project, tmp_path)
    assert files_nobody_reads(project, (REQUEST, ANSWER, "secret-")) == []
    assert stat.S_IMODE(root.stat().st_mode) == 0o755  # the user's own directory is left as it was


def test_a_cast_a_harness_starts_through_castor_serve_is_private_too(reachable, tmp_path):
    """The same through the endpoint: a harness's ``cast.start`` on a project others may read."""
    import threading

    from tests.support.waiting import wait_for

    from .conftest import SocketServer

    project = reachable / "project"
    project.mkdir(mode=0o755)
    server = SocketServer(tmp_path)
    client = server.client()
    try:
        def run_turn(params: dict) -> None:
            threading.Thread(target=lambda: client.call(
                "agent.turn_ended", {"session_id": "s1", "turn_id": params["turn_id"], "text": ANSWER,
                                     "stop_reason": "stop"}, timeout=20), daemon=True).start()

        client.on_notification("agent.run_turn", run_turn)
        client.on_request("session.append_entry", lambda p: {"ok": True, "entry_id": "e"})
        client.call("session.open", {"session_id": "s1", "cwd": str(project), "trusted": True}, timeout=20)
        client.call("loadout.set", {"session_id": "s1", "name": "hello"}, timeout=20)
        cast_id = client.call("cast.start", {"session_id": "s1", "request": REQUEST}, timeout=20)["cast_id"]
        wait_for(lambda: client.call("cast.status", {"session_id": "s1", "cast_id": cast_id},
                                     timeout=20)["status"] == "complete", timeout=30, what="the cast to complete")
    finally:
        client.close()
        server.stop()
    run = project / ".pi" / "pi-materia" / cast_id
    assert REQUEST in (run / "state.json").read_text() and ANSWER in (run / "events.jsonl").read_text() + "".join(
        p.read_text() for p in (run / "sockets").rglob("*.md"))
    assert files_nobody_reads(project, (REQUEST, ANSWER, "secret-")) == []

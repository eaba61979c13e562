"""The next command ``castor status`` and ``castor casts`` print, typed as shown where the operator
typed theirs: it names the project they named (``--cwd``, ``--config``), so it acts on the same
cast. It used to say ``castor abort ID`` alone, which from any other directory answered
``not_found: Unknown pi-materia cast id``."""

from __future__ import annotations

import os
import re
import shlex
import signal
import subprocess
import sys

from castor.client import Client
from tests.cli.interrupted_cast import castor_cli, interrupted_cast
from tests.support.waiting import wait_for

PROJECTS = "my projects"  # a space: the --cwd in a hint is quoted for the shell


def _typed_as_shown(tmp_path, line: str, where):
    argv = shlex.split(line)
    assert argv[0] == "castor", line
    return castor_cli(tmp_path, *argv[1:], cwd=where)


def test_status_of_a_project_named_with_cwd_advises_commands_that_name_it_too(tmp_path):
    (tmp_path / PROJECTS).mkdir()
    project, run = interrupted_cast(tmp_path / PROJECTS)
    shown = castor_cli(tmp_path, "status", run.name, "--cwd", str(project), cwd=tmp_path)
    assert shown.returncode == 0, shown.stderr
    abort = re.search(r"(castor abort .*?) to stop the cast", shown.stdout)
    assert abort, shown.stdout
    aborted = _typed_as_shown(tmp_path, abort.group(1), tmp_path)
    assert aborted.returncode == 0, aborted.stderr
    assert f"pi-materia cast {run.name} aborted" in aborted.stdout
    # and the recast the abort names is typed as shown too
    recast_line = re.search(r"Recast it with (castor recast .*)\.$", aborted.stdout.strip())
    assert recast_line and recast_line.group(1).endswith(f" --cwd {shlex.quote(str(project))}"), aborted.stdout
    # the same from the listing: its recast target is typed as shown
    listed = castor_cli(tmp_path, "casts", "--cwd", str(project), cwd=tmp_path)
    recast = re.search(r"recast: (castor recast .*)$", listed.stdout, re.MULTILINE)
    assert recast, listed.stdout
    assert f"--cwd {shlex.quote(str(project))}" in recast.group(1)


def test_a_hint_in_the_project_itself_stays_short(tmp_path):
    project, run = interrupted_cast(tmp_path)
    shown = castor_cli(tmp_path, "status", run.name, cwd=project)
    assert f"castor abort {run.name} to stop the cast" in shown.stdout
    assert "--cwd" not in shown.stdout


def test_a_cast_run_with_cwd_ends_on_a_resuming_command_that_names_the_project(tmp_path):
    (tmp_path / PROJECTS).mkdir()
    project, _run = interrupted_cast(tmp_path / PROJECTS)  # its esc.json: the next cast is interrupted too
    stopped = castor_cli(tmp_path, "cast", "y", "--agent", f"script:{project / 'esc.json'}", "--quiet",
                         "--cwd", str(project), cwd=tmp_path)
    assert stopped.returncode == 1, stopped.stderr
    resume = re.search(r"`(castor continue [^`]*)` runs it again", stopped.stderr)
    assert resume, stopped.stderr
    assert resume.group(1).endswith(f" --cwd {shlex.quote(str(project))}")


def test_status_of_a_cast_a_serve_runs_names_the_abort_that_reaches_it(tmp_path):
    """Status of a cast a harness session's ``castor serve`` runs names ``castor abort ID``, which
    reaches it (the serve takes the request: tests/cli/test_abort_a_served_cast.py), not the
    session's own ``/materia abort``, which an operator at another terminal cannot type."""
    project = tmp_path / "project"
    project.mkdir()
    sock = tmp_path / "castor.sock"
    server = subprocess.Popen([sys.executable, "-m", "castor", "serve", "--socket", str(sock)],
                              env={**os.environ, "HOME": str(tmp_path / "home")},
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    client = None
    try:
        wait_for(sock.exists, timeout=20, what="the socket")
        client = Client.connect_unix(str(sock))
        turns: list[dict] = []
        client.on_notification("agent.run_turn", turns.append)
        client.call("session.open", {"session_id": "s1", "cwd": str(project), "trusted": True}, timeout=20)
        client.call("loadout.set", {"session_id": "s1", "cwd": str(project), "name": "hello"}, timeout=20)
        cast_id = client.call("cast.start", {"session_id": "s1", "cwd": str(project), "request": "hi"},
                              timeout=20)["cast_id"]
        wait_for(lambda: turns, timeout=20, what="the agent's turn")
        shown = castor_cli(tmp_path, "status", cast_id, cwd=project)
        assert shown.returncode == 0, shown.stderr
        first = shown.stdout.splitlines()[0]
        assert f"castor abort {cast_id} asks it to abort" in first and "/materia" not in first, first
    finally:
        if client is not None:
            client.close()
        server.send_signal(signal.SIGTERM)
        server.wait(30)

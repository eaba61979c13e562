"""An operator asks "what is it doing?" of a cast another ``castor cast`` runs, stuck in a long
utility command. ``castor status`` said "running its utility command at Socket-2 ... since its last
save", naming neither the command nor its process: the operator had to dig through ``ps`` for
whatever held the terminal. The command's process is findable (its environment carries the visit
and the run directory castor gave it), so the status names it, its pid and how long it has run."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.support.processes import terminate_then_kill
from tests.support.waiting import wait_for

from .conftest import castor_env

pytestmark = pytest.mark.timeout(90)

COMMAND = 'echo started > started.txt; while [ ! -e release.txt ]; do sleep 0.05; done; echo ok'
CONFIG = {"activeLoadout": "U", "loadouts": {"U": {"entry": "Socket-1", "sockets": {
    "Socket-1": {"type": "agent", "materia": "greeter", "edges": [{"to": "Socket-2"}]},
    "Socket-2": {"type": "utility", "command": ["sh", "-c", COMMAND]}}}}}


def _castor(tmp: Path, project: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "castor", *args], env=castor_env(tmp), cwd=str(project),
                          capture_output=True, text=True, timeout=30)


def test_status_of_a_cast_in_a_long_command_names_the_command_its_pid_and_how_long_it_runs(tmp_path):
    project = tmp_path / "project"
    (project / ".pi").mkdir(parents=True)
    (project / ".pi" / "pi-materia.json").write_text(json.dumps(CONFIG))
    (project / "answers.json").write_text(json.dumps(["hi", "hi"]))
    with open(tmp_path / "cast.stderr", "wb") as err:
        cast = subprocess.Popen([sys.executable, "-m", "castor", "cast", "A", "--agent", "script:answers.json",
                                 "--quiet"], env=castor_env(tmp_path), cwd=str(project), stdin=subprocess.DEVNULL,
                                stdout=subprocess.DEVNULL, stderr=err)
    try:
        wait_for(lambda: (project / "started.txt").exists() or cast.poll() is not None, timeout=40,
                 what="the utility command to start")
        assert cast.poll() is None, (tmp_path / "cast.stderr").read_text()
        started = time.time()
        shown = _castor(tmp_path, project, "status", "latest")
        assert shown.returncode == 0, shown.stderr
        now = next(line for line in shown.stdout.splitlines() if line.startswith("now: "))
        assert "running its utility command `sh -c echo started > started.txt;" in now, now
        pid = int(now.split("(pid ", 1)[1].split(",", 1)[0])
        with open(f"/proc/{pid}/cmdline", "rb") as cmdline:  # the command's own process, still running
            assert cmdline.read().split(b"\0")[:2] == [b"sh", b"-c"]
        assert " at Socket-2, visit 1, since its last save at " in now, now

        as_json = _castor(tmp_path, project, "status", "latest", "--json")
        assert as_json.returncode == 0, as_json.stderr
        running = json.loads(as_json.stdout)["command_running"]
        assert running["pid"] == pid and running["command"].startswith("sh -c echo started")
        assert running["started_at"] <= started + 1

        (project / "release.txt").write_text("go")
        assert cast.wait(40) == 0, (tmp_path / "cast.stderr").read_text()
        done = _castor(tmp_path, project, "status", "latest", "--json")
        assert "command_running" not in json.loads(done.stdout)
    finally:
        if os.path.exists(project):
            (project / "release.txt").write_text("go")
        terminate_then_kill(cast)


def test_status_of_a_cast_whose_runtime_was_killed_names_the_command_it_left_running(tmp_path):
    """``kill -9`` of the ``castor cast`` running it: the cast reads ``orphaned``, resumable, and its
    command runs on, reparented to init, with nothing to say so; the status names it, and the recast
    it offers kills it before running the command again."""
    project = tmp_path / "project"
    (project / ".pi").mkdir(parents=True)
    (project / ".pi" / "pi-materia.json").write_text(json.dumps(CONFIG))
    (project / "answers.json").write_text(json.dumps(["hi", "hi"]))
    cast = subprocess.Popen([sys.executable, "-m", "castor", "cast", "A", "--agent", "script:answers.json", "--quiet"],
                            env=castor_env(tmp_path), cwd=str(project), stdin=subprocess.DEVNULL,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    left = None
    try:
        wait_for(lambda: (project / "started.txt").exists() or cast.poll() is not None, timeout=40,
                 what="the utility command to start")
        cast.kill()
        cast.wait(10)
        shown = _castor(tmp_path, project, "status", "latest")
        assert shown.returncode == 0, shown.stderr
        line = next((x for x in shown.stdout.splitlines() if x.startswith("its utility command ")), None)
        assert line is not None, shown.stdout
        assert line.startswith("its utility command `sh -c echo started > started.txt;") and \
            line.endswith("still runs, left by the runtime that stopped; a recast kills it before it runs the "
                          "command again"), line
        left = int(line.split("(pid ", 1)[1].split(",", 1)[0])
        assert json.loads(_castor(tmp_path, project, "status", "latest", "--json").stdout)["command_running"]["pid"] \
            == left

        (project / "release.txt").write_text("go")  # the command the recast runs again ends at once
        recast = _castor(tmp_path, project, "recast", "latest", "--agent", "script:answers.json", "--quiet")
        assert recast.returncode == 0, recast.stdout + recast.stderr
        assert not os.path.exists(f"/proc/{left}") or open(f"/proc/{left}/stat").read().split()[2] == "Z"
    finally:
        if os.path.exists(project):
            (project / "release.txt").write_text("go")
        terminate_then_kill(cast)

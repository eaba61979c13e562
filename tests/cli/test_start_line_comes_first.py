"""``castor cast`` says ``cast ID started`` before anything the cast says.

A cast's first effects run on its own thread once its start is saved, and the command prints its
start line once the start is answered: a quick cast's first notices (a config warning, even "cast
complete") came before that line, every time on a cast of inline sockets. The command now holds
the cast's notices until it has printed the line (the start itself is not delayed)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.cli.interrupted_cast import REPO

pytestmark = pytest.mark.timeout(120)

# One inline socket (an echo: the cast completes within its first transition's effects) and a
# field no one reads (a config warning, said by the cast's first transition).
QUICK = {"activeLoadout": "Q", "unreadField": 1,
         "loadouts": {"Q": {"entry": "Socket-1", "sockets": {
             "Socket-1": {"type": "utility", "utility": "echo", "params": {"output": "hi"}}}}}}


def _merged(tmp_path: Path, *args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    """``castor ARGS`` with stdout and stderr on one pipe, as a terminal shows them."""
    env = {**os.environ, "PYTHONPATH": str(REPO), "CASTOR_AGENT": "", "HOME": str(tmp_path / "home"),
           "PI_MATERIA_PROFILE_DIR": str(tmp_path / "profile"), "MATERIA_CONFIG": ""}
    return subprocess.run([sys.executable, "-m", "castor", *args], cwd=cwd, env=env, text=True,
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=90)


def test_a_quick_casts_notices_come_after_its_start_line(tmp_path):
    project = tmp_path / "project"
    (project / ".pi").mkdir(parents=True)
    (project / ".pi" / "pi-materia.json").write_text(json.dumps(QUICK))
    (project / "answers.json").write_text(json.dumps(["unused"]))
    for _ in range(3):
        ran = _merged(tmp_path, "cast", "q", "--agent", "script:answers.json", "--quiet", cwd=project)
        assert ran.returncode == 0, ran.stdout
        lines = ran.stdout.splitlines()
        assert lines[0].startswith("cast ") and " started (Q): " in lines[0], ran.stdout
        warning = next(i for i, line in enumerate(lines) if "materia config warning" in line)
        complete = next(i for i, line in enumerate(lines) if "pi-materia cast complete" in line)
        assert 0 < warning < complete < len(lines) - 1, ran.stdout  # nothing lost, in order, before the outcome
        assert lines[-1].startswith("cast ") and " complete: " in lines[-1], ran.stdout


def test_held_notices_come_out_in_order_once_released_and_at_once_after():
    from castor.cli.materia import _HeldNotices

    printed: list[str] = []
    held = _HeldNotices(printed.append)
    held("one")
    held("two")
    assert printed == []
    held.release()
    assert printed == ["one", "two"]
    held("three")
    held.release()
    assert printed == ["one", "two", "three"]

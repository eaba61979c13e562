"""A utility command that ended just before its runtime was killed (``kill -9``), its outcome not
yet saved in the cast's state, ran again on the recast: its side effect (a deploy, a commit, an
append) happened twice. The command's outcome is now written to its record in the run directory
as it ends, before the cast is told, and a recast takes it from there instead of running the
command again.

The kill lands exactly in that window: the ``castor cast`` process runs with its cast actor's
outcome handler held (a test-only wrapper, below) -- the command has ended, the cast has not saved
its outcome -- and the test kills it ``-9`` there. Then ``castor recast`` runs in a new process
as a user types it, and the test counts the command's runs."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.cli.interrupted_cast import castor_cli
from tests.support.held_outcome import held_castor
from tests.support.waiting import wait_for

REPO = Path(__file__).resolve().parents[2]



def _killed_with_its_outcome_unsaved(tmp_path: Path, answers: list) -> tuple[Path, Path, Path]:
    """``castor cast`` of a utility socket (its command appends ``run`` to runs.txt) then an agent
    socket, killed ``-9`` once the command ended and before its outcome was saved: ``(project,
    runs.txt, the run directory)``."""
    project = tmp_path / "project"
    (project / ".pi").mkdir(parents=True)
    runs = project / "runs.txt"
    config = {"activeLoadout": "U", "loadouts": {"U": {"entry": "Socket-1", "sockets": {
        "Socket-1": {"type": "utility", "command": ["sh", "-c", f"echo run >> '{runs}'; echo deployed"],
                     "edges": [{"when": "always", "to": "Socket-2"}]},
        "Socket-2": {"type": "agent", "materia": "greeter"}}}}}
    (project / ".pi" / "pi-materia.json").write_text(json.dumps(config))
    (project / "answers.json").write_text(json.dumps(answers))
    held = tmp_path / "held"
    env = {**os.environ, "PYTHONPATH": str(REPO), "CASTOR_AGENT": "", "HOME": str(tmp_path / "home"),
           "PI_MATERIA_PROFILE_DIR": str(tmp_path / "profile"), "MATERIA_CONFIG": "", "HELD": str(held)}
    proc = subprocess.Popen([sys.executable, "-c", held_castor(), "cast", "go", "--agent", "script:answers.json",
                             "--quiet"], cwd=project, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    try:
        wait_for(held.exists, 60, "the command's end, held before its outcome is saved")
        assert runs.read_text().splitlines() == ["run"]
        proc.send_signal(signal.SIGKILL)
        proc.wait(30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(30)
    [run_dir] = [p for p in (project / ".pi" / "pi-materia").iterdir() if p.is_dir()]
    return project, runs, run_dir


@pytest.mark.timeout(120)
def test_a_command_that_ended_just_before_a_kill_9_is_not_run_again_by_the_recast(tmp_path):
    project, runs, run_dir = _killed_with_its_outcome_unsaved(tmp_path, ["hi"])
    saved = json.loads((run_dir / "state.json").read_text())["state"]
    assert saved["pending"]["kind"] == "utility" and saved["active"] is True  # its outcome was never saved
    done = castor_cli(tmp_path, "recast", run_dir.name, "--agent", "script:answers.json", "--quiet", cwd=project,
                      timeout=90)
    assert done.returncode == 0, done.stderr
    assert runs.read_text().splitlines() == ["run"]  # exactly once: the recast took its recorded outcome
    assert "was interrupted" not in done.stderr  # it ended: nothing runs again, nothing to warn of
    ended = json.loads((run_dir / "state.json").read_text())["state"]
    assert ended["active"] is False and ended["phase"] == "complete", ended
    assert (run_dir / "sockets" / "Socket-1" / "1.md").read_text().strip() == "deployed"
    assert not list((run_dir / ".commands").glob("*.json"))  # the record is gone once its outcome is saved


@pytest.mark.timeout(120)
def test_the_recast_that_takes_a_recorded_outcome_names_its_own_surfaces_commands_after(tmp_path):
    """The recorded outcome replaces the recast's re-dispatch, and the recast's ``surface`` was lost
    with it: a cast a harness session started and ``castor recast`` resumed past a kill ``-9`` kept
    naming ``/materia continue`` to the user at the terminal. The surface of the request is applied."""
    project, runs, run_dir = _killed_with_its_outcome_unsaved(
        tmp_path, [{"text": "partial", "stop_reason": "aborted"}])
    state = run_dir / "state.json"
    document = json.loads(state.read_text())
    document["state"]["surface"] = "harness"  # as a harness session's cast is saved
    state.write_text(json.dumps(document))
    resumed = castor_cli(tmp_path, "recast", run_dir.name, "--agent", "script:answers.json", "--quiet",
                         cwd=project, timeout=90)
    assert runs.read_text().splitlines() == ["run"], resumed.stderr  # the recorded outcome was taken
    ended = json.loads(state.read_text())["state"]
    assert ended["surface"] == "cli" and ended["socket_state"] == "interrupted", (ended["surface"], resumed.stderr)
    assert "/materia" not in ended["last_message"] and "/materia" not in resumed.stderr, (ended["last_message"],
                                                                                          resumed.stderr)

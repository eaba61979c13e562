"""A run directory an older castor or pi-materia made is ``0755``, its files ``0644``: a cast
castor goes on with there (``castor continue``, a recast, a revive) writes its prompts and answers
into it. Taking the cast's lease tightens a directory castor's user owns to ``0700`` (through a
descriptor opened without following a link); one of another user, or a link in its place, is left
as it is. Each real-process test reads the project as uid ``nobody``."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from castor.adapters.materia.cast_lease import CastLease
from tests.support.other_user import NOBODY, files_nobody_reads

pytestmark = [pytest.mark.timeout(120),
              pytest.mark.skipif(os.geteuid() != 0, reason="reading as another user needs root to fork one")]

REPO = Path(__file__).resolve().parents[2]
REQUEST = "secret-request-5be2: the payroll export"
ANSWER = "secret-answer-77d4"
ONE_SOCKET = {"activeLoadout": "One", "loadouts": {"One": {"entry": "Socket-1", "sockets": {
    "Socket-1": {"type": "agent", "materia": "greeter"}}}}}



def _castor(tmp_path: Path, *args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(REPO), "CASTOR_AGENT": "", "HOME": str(tmp_path / "home"),
           "PI_MATERIA_PROFILE_DIR": str(tmp_path / "profile"), "MATERIA_CONFIG": ""}
    return subprocess.run([sys.executable, "-m", "castor", *args], cwd=cwd, env=env, text=True,
                          capture_output=True, timeout=100)


def _as_an_older_castor_left_it(run: Path) -> None:
    run.chmod(0o755)
    for dirpath, dirnames, filenames in os.walk(run):
        for name in dirnames:
            os.chmod(os.path.join(dirpath, name), 0o755)
        for name in filenames:
            os.chmod(os.path.join(dirpath, name), 0o644)


def test_a_cast_continued_in_a_run_directory_others_could_read_is_made_private(reachable, tmp_path):
    project = reachable / "project"
    (project / ".pi").mkdir(parents=True)
    for path in (project, project / ".pi"):
        path.chmod(0o755)
    (project / ".pi" / "pi-materia.json").write_text(json.dumps(ONE_SOCKET))
    (project / "esc.json").write_text(json.dumps([{"text": "x", "stop_reason": "aborted"}]))
    (project / "answers.json").write_text(json.dumps([ANSWER]))
    interrupted = _castor(tmp_path, "cast", REQUEST, "--agent", "script:esc.json", "--quiet", cwd=project)
    assert interrupted.returncode == 1 and "interrupted" in interrupted.stderr, interrupted.stderr
    root = project / ".pi" / "pi-materia"
    [run] = [p for p in root.iterdir() if p.is_dir()]
    root.chmod(0o755)  # the artifact root of an older castor, and its run directory and files
    _as_an_older_castor_left_it(run)
    assert "state.json" in " ".join(files_nobody_reads(root, ("secret-",)))  # the test can see it

    done = _castor(tmp_path, "continue", run.name, "--agent", "script:answers.json", "--quiet", cwd=project)
    assert done.returncode == 0, done.stderr
    assert ANSWER in "".join(p.read_text(errors="replace") for p in run.rglob("*") if p.is_file())
    assert stat.S_IMODE(run.stat().st_mode) == 0o700
    assert files_nobody_reads(root, ("secret-",)) == []


def _lease_on(root: Path, name: str) -> None:
    lease = CastLease.try_acquire(root, name)
    assert lease is not None
    lease.release()


def test_a_run_directory_of_another_user_is_left_as_it_is(tmp_path):
    run = tmp_path / "c-1"
    run.mkdir(mode=0o755)
    run.chmod(0o755)
    os.chown(run, NOBODY, NOBODY)
    (run / "owner.lock").touch()  # root may write there all the same; the mode is not its to change
    _lease_on(tmp_path, "c-1")
    assert stat.S_IMODE(run.stat().st_mode) == 0o755 and run.stat().st_uid == NOBODY


def test_a_link_in_place_of_the_run_directory_is_never_followed_to_change_a_mode(tmp_path):
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir(mode=0o755)
    elsewhere.chmod(0o755)
    root = tmp_path / "root"
    root.mkdir()
    (root / "c-1").symlink_to(elsewhere)
    try:
        lease = CastLease.try_acquire(root, "c-1")
    except Exception:  # noqa: BLE001 - refused is fine too; the point is the mode
        lease = None
    if lease is not None:
        lease.release()
    assert stat.S_IMODE(elsewhere.stat().st_mode) == 0o755


def test_a_new_run_directory_is_private(tmp_path):
    _lease_on(tmp_path, "c-2")
    assert stat.S_IMODE((tmp_path / "c-2").stat().st_mode) == 0o700

"""A cast start killed before its cast's first save (``kill -9`` between the id's ``mkdir`` and the
first ``state.json``) left a run directory that every listing showed as ``unreadable`` for ever. It
was never a cast -- its client got an error, never a cast id -- so a reader removes it once it has
been left alone for ``ABANDONED_START_AFTER_S`` with its lease free; anything more in it (an events
log, an artifact, a link) or a lease someone holds keeps it.

The directories here are made by a real child process doing what a start does (allocate the id,
take the lease, create the artifact directories) and then killed with SIGKILL.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from castor.adapters.materia import state_store
from castor.adapters.materia.state_store import ABANDONED_START_AFTER_S, list_page

REPO = Path(__file__).resolve().parents[3]

_START_THEN_DIE = """
import os, signal, sys
from castor.adapters.materia.artifacts import CastArtifacts, allocate_cast_id
from castor.adapters.materia.cast_lease import CastLease
root = sys.argv[1]
cast_id = allocate_cast_id(root)
lease = CastLease.try_acquire(root, cast_id)
CastArtifacts(root, cast_id).create()
if sys.argv[2] == "note":
    open(os.path.join(root, cast_id, "cli.json"), "w").write("{}")
if sys.argv[2] == "cut-save":  # killed inside its first save, before the rename: the temp file stays
    open(os.path.join(root, cast_id, ".state.json.%d.9085c2e40.tmp" % os.getpid()), "w").write("{}")
print(cast_id, flush=True)
if sys.argv[2] == "hold":
    sys.stdin.read()  # keeps the lease until the test closes stdin
os.kill(os.getpid(), signal.SIGKILL)
"""


def _killed_start(root: Path, how: str = "plain") -> str:
    proc = subprocess.run([sys.executable, "-c", _START_THEN_DIE, str(root), how], capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": str(REPO)}, timeout=60)
    assert proc.returncode == -signal.SIGKILL, proc.stderr
    return proc.stdout.strip()


def _age(run_dir: Path, seconds: float = ABANDONED_START_AFTER_S + 5) -> None:
    past = time.time() - seconds
    os.utime(run_dir, (past, past))


def _listed(root: Path) -> tuple[list[str], list[str]]:
    page = list_page(root, limit=None)
    return [c.cast_id for c in page.casts], [p.cast_id for p in page.problems]


@pytest.mark.timeout(60)
@pytest.mark.parametrize("how", ["plain", "note", "cut-save"])
def test_a_start_killed_before_its_first_save_is_removed_by_the_next_listing_once_left_alone(
        tmp_path: Path, how: str) -> None:
    root = tmp_path / "pi-materia"
    cast_id = _killed_start(root, how)
    run_dir = root / cast_id
    assert run_dir.is_dir() and not (run_dir / "state.json").exists()
    # Fresh: it could be a live start between its mkdir and its lease -- listed, kept.
    assert _listed(root) == ([], [cast_id])
    assert run_dir.is_dir()
    _age(run_dir)
    assert _listed(root) == ([], [])
    assert not run_dir.exists()
    assert _listed(root) == ([], [])  # and the index forgot it


@pytest.mark.timeout(60)
def test_the_removal_happens_when_the_index_first_meets_the_directory_too(tmp_path: Path) -> None:
    """Found by the index's rebuild (a directory the index never knew), not only by a row."""
    root = tmp_path / "pi-materia"
    cast_id = _killed_start(root)
    _age(root / cast_id)
    for name in os.listdir(root):
        if name.startswith(".castor-index"):
            os.unlink(root / name)
    assert _listed(root) == ([], [])
    assert not (root / cast_id).exists()


@pytest.mark.timeout(60)
def test_a_run_directory_with_anything_of_the_users_or_a_held_lease_is_kept(tmp_path: Path) -> None:
    root = tmp_path / "pi-materia"
    with_events = _killed_start(root)
    (root / with_events / "events.jsonl").write_text('{"type": "cast_start"}\n')
    with_artifact = _killed_start(root)
    (root / with_artifact / "sockets" / "Socket-1").mkdir()
    with_link = _killed_start(root)
    os.rmdir(root / with_link / "contexts")
    os.symlink(tmp_path, root / with_link / "contexts")
    for cast_id in (with_events, with_artifact, with_link):
        _age(root / cast_id)
    # A start that is alive (it holds the lease), however long it has been.
    holder = subprocess.Popen([sys.executable, "-c", _START_THEN_DIE, str(root), "hold"], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True, env={**os.environ, "PYTHONPATH": str(REPO)})
    try:
        assert holder.stdout is not None
        held = holder.stdout.readline().strip()
        _age(root / held)
        kept = sorted([with_events, with_artifact, with_link, held], reverse=True)
        assert _listed(root) == ([], kept)
        for cast_id in kept:
            assert (root / cast_id).is_dir()
        assert not state_store.is_abandoned_start(root, held)
    finally:
        assert holder.stdin is not None
        holder.stdin.close()  # it kills itself: the lease is free now, and the directory is bare
        holder.wait(30)
    _age(root / held)
    assert _listed(root) == ([], sorted([with_events, with_artifact, with_link], reverse=True))
    assert not (root / held).exists()
    assert (tmp_path / "pi-materia").is_dir() and tmp_path.is_dir()  # the link's target untouched


@pytest.mark.timeout(120)
def test_castor_casts_in_a_project_never_shows_a_start_killed_before_its_first_save(tmp_path: Path) -> None:
    """From the outside: the CLI in the project, as the user meets it."""
    project = tmp_path / "project"
    root = project / ".pi" / "pi-materia"
    root.mkdir(parents=True)
    cast_id = _killed_start(root)
    env = {**os.environ, "PYTHONPATH": str(REPO), "HOME": str(tmp_path / "home"), "CASTOR_AGENT": "",
           "PI_MATERIA_PROFILE_DIR": str(tmp_path / "profile"), "MATERIA_CONFIG": ""}

    def casts() -> str:
        proc = subprocess.run([sys.executable, "-m", "castor", "casts"], cwd=project, env=env, capture_output=True,
                              text=True, timeout=60)
        assert proc.returncode == 0, proc.stderr
        return proc.stdout

    listed = casts()
    assert f"{cast_id}  unreadable  (no state.json)" in listed  # says why, not a blank
    _age(root / cast_id)
    out = casts()
    assert cast_id not in out and "unreadable" not in out
    assert not (root / cast_id).exists()

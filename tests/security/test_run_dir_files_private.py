"""The files inside a cast's run directory are castor's user's alone, not only the directory.

A run directory is ``0700``, but the files and sub-directories castor made in it were ``0644`` and
``0755``: the directory made wider later -- an operator's ``chmod -R go+rX`` to share a project, a
copy or a tarball that keeps the inner modes -- showed every other user the request, the prompts
castor sent and the answers. Each file castor writes there is now made ``0600`` and each
directory ``0700`` (what the cast index and the JSON-lines appends already were). The test runs
a real ``castor cast`` (an agent socket and a utility command, whose record castor keeps in the
run directory), then an abort of it, widens every directory as an operator would, and reads the
project as uid ``nobody``."""

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

REQUEST = "secret-request-52ab: the staging credentials"
ANSWER = "secret-answer-e07c"
OUTPUT = "secret-output-3d19"


def _widen_every_directory(root: Path) -> None:
    """What ``chmod -R go+rX`` does to directories (and a copy that keeps modes leaves as it was)."""
    for path in (root, *root.rglob("*")):
        if path.is_dir() and not path.is_symlink():
            path.chmod(0o755)


def test_every_file_castor_writes_in_a_run_directory_is_its_users_alone(reachable, tmp_path):
    project = reachable / "project"
    (project / ".pi").mkdir(parents=True, mode=0o755)
    config = {"activeLoadout": "U", "loadouts": {"U": {"entry": "Socket-1", "sockets": {
        "Socket-1": {"type": "utility", "command": ["sh", "-c", f"echo {OUTPUT}"],
                     "edges": [{"when": "always", "to": "Socket-2"}]},
        "Socket-2": {"type": "agent", "materia": "greeter"}}}}}
    (project / ".pi" / "pi-materia.json").write_text(json.dumps(config))
    (tmp_path / "answers.json").write_text(json.dumps([ANSWER]))
    env = {**serve_env(tmp_path), "CASTOR_AGENT": "", "MATERIA_CONFIG": "",
           "PI_MATERIA_PROFILE_DIR": str(tmp_path / "profile")}
    done = subprocess.run(castor_argv("cast", REQUEST, "--agent", f"script:{tmp_path / 'answers.json'}", "--quiet"),
                          cwd=str(project), env=env, capture_output=True, text=True, timeout=100)
    assert done.returncode == 0, done.stderr
    root = project / ".pi" / "pi-materia"
    [run] = [p for p in root.iterdir() if p.is_dir()]
    # An abort of the ended cast: refused, but it takes the run directory's abort lock first.
    subprocess.run(castor_argv("abort", run.name), cwd=str(project), env=env, capture_output=True, text=True,
                   timeout=60)
    assert (run / "abort.lock").exists()
    text = "".join(p.read_text(errors="replace") for p in run.rglob("*") if p.is_file())
    assert REQUEST in text and ANSWER in text and OUTPUT in text  # all there, for castor's user
    made = {p.relative_to(run).as_posix(): stat.S_IMODE(p.lstat().st_mode) for p in run.rglob("*")}
    assert {"state.json", "events.jsonl", "manifest.json", "cli.json", "usage.json", "config.resolved.json",
            "owner.lock", "state.lock", "abort.lock"} <= set(made), sorted(made)
    assert {name: oct(mode) for name, mode in made.items() if mode & 0o077} == {}
    _widen_every_directory(project)
    assert files_nobody_reads(run) == []


@pytest.mark.timeout(30)
def test_a_file_castor_rewrites_takes_the_private_mode_and_one_it_leaves_keeps_its_own(tmp_path):
    """A run directory an older castor filled (``0644`` files): the state castor saves again is
    replaced whole, ``0600``; a file it does not rewrite, and a lock file it only opens, keep their
    modes (castor changes no mode it did not make)."""
    import time

    from castor.adapters.materia.state_store import CastStateStore

    root = tmp_path / "root"
    root.mkdir()
    cast_id = "2026-01-01T00-00-00-000Z"
    store = CastStateStore(root)
    incarnation = store.claim(cast_id)
    store.save(cast_id, {"version": 2, "active": True, "phase": "running", "request": "r",
                         "updatedAt": time.time()}, incarnation=incarnation)
    run = root / cast_id
    old = run / "sockets" / "Socket-1" / "1.md"
    old.parent.mkdir(parents=True)
    old.write_text("an older castor's answer")
    for path in (old, run / "state.json", run / "state.lock"):
        path.chmod(0o644)
    store.save(cast_id, {"version": 2, "active": True, "phase": "later", "request": "r",
                         "updatedAt": time.time()}, incarnation=incarnation)
    assert stat.S_IMODE((run / "state.json").stat().st_mode) == 0o600
    assert stat.S_IMODE(old.stat().st_mode) == 0o644
    assert stat.S_IMODE((run / "state.lock").stat().st_mode) == 0o644

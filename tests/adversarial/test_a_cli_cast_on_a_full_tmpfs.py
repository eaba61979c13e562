"""``castor cast`` in a project on a small tmpfs that fills while the cast runs: the disk runs out at
its first write (the run directory's first files), at its start's save, at a socket's file effect,
or later at a transition's save, depending on how much room is left. Whichever write meets
``ENOSPC``, the command ends on one line naming the failure (``storage_unavailable``, the file and
the errno) or the command that resumes the cast, leaves no temp file and no ``state.json`` that does
not parse, lists no cast as ``unreadable``, and once space is freed ``castor recast`` completes it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.tmpfs import fill_to_the_last_block, mounted_tmpfs

from .conftest import castor_env

pytestmark = pytest.mark.timeout(300)

ANSWERS = [
    {"key": "Socket-3", "text": json.dumps({"workItems": [{"id": "w1", "title": "Parser"},
                                                          {"id": "w2", "title": "CLI"}]})},
    {"key": "Socket-4/w1", "text": "Built the parser."},
    {"key": "Socket-5/w1", "text": "{\"satisfied\": true}"},
    {"key": "Socket-4/w2", "text": "Built the CLI."},
    {"key": "Socket-5/w2", "text": "{\"satisfied\": true}"},
    "Summary: parser and CLI built.",
]


def _castor(tmp: Path, cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "castor", *args], env=castor_env(tmp), cwd=str(cwd),
                          capture_output=True, text=True, timeout=90)


def _casts(tmp: Path, project: Path) -> list[dict]:
    listed = _castor(tmp, project, "casts", "--json")
    assert listed.returncode == 0, listed.stderr
    return json.loads(listed.stdout)


@pytest.mark.parametrize("room_kib", [0, 8, 128, 200])
def test_a_cli_cast_that_fills_its_project_s_disk_ends_typed_and_recasts_once_space_is_freed(tmp_path, room_kib):
    answers = tmp_path / "answers.json"
    answers.write_text(json.dumps(ANSWERS))
    with mounted_tmpfs(tmp_path / "tiny", "1m") as disk:
        project = disk / "project"
        project.mkdir()
        fill_to_the_last_block(disk)
        filler = disk / "filler.bin"
        os.truncate(filler, max(0, filler.stat().st_size - room_kib * 1024))

        done = _castor(tmp_path, project, "cast", "build two things", "--agent", f"script:{answers}", "--quiet")
        last = done.stderr.strip().splitlines()[-1] if done.stderr.strip() else ""
        assert done.returncode == 1, done.stdout + done.stderr
        assert "Traceback" not in done.stderr and "internal" not in done.stderr, done.stderr
        assert (last.startswith("castor: storage_unavailable: ") and "(ENOSPC" in last) or \
            ("castor recast " in last and "resumes it" in last), done.stderr
        assert [p for p in project.rglob("*") if p.name.endswith(".tmp")] == []
        for state in project.rglob("state.json"):
            json.loads(state.read_text())  # whole, never half-written
        rows = _casts(tmp_path, project)
        assert [r for r in rows if r["status"] == "unreadable"] == [], rows

        filler.unlink()  # space freed
        if not rows:  # refused before its first save: nothing to resume, and a new cast fits now
            again = _castor(tmp_path, project, "cast", "build two things", "--agent", f"script:{answers}", "--quiet")
            assert again.returncode == 0, again.stderr
        else:
            [row] = rows
            assert row["resumable"] is True, row
            recast = _castor(tmp_path, project, "recast", row["cast_id"], "--agent", f"script:{answers}", "--quiet")
            assert recast.returncode == 0, recast.stdout + recast.stderr
        assert [r["status"] for r in _casts(tmp_path, project)] == ["complete"]

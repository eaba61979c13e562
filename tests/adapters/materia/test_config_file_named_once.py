"""A config layer castor cannot read names its file once in the refusal.

The refusal's text (``ConfigError``'s message: the ``invalid_config`` error a cast start, ``castor
grid`` or the Pi extension's ``/materia`` notice shows) was ``[invalid-json]
/p/.pi/pi-materia.json#/: malformed JSON in /p/.pi/pi-materia.json at line 2 ...``: the issue's
``file#/`` prefix, then the message naming the same file again. An issue about a whole file whose
message names the file is now shown as ``[code] <message>``; an issue at a place in the file keeps
its ``file#pointer`` prefix.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from castor.adapters.materia.config_loader import load_resolved
from castor.domain.materia.config import ConfigError, ConfigIssue

REPO = Path(__file__).resolve().parents[3]

MALFORMED = {
    "invalid-json": b'{"activeLoadout": "hello",\n  "x": }',
    "not-an-object": b"[1]",
    "byte-order-mark": b'\xef\xbb\xbf{"activeLoadout": "hello"}',
    "not-utf-8": b'{"activeLoadout": "\xff"}',
}


def _project(tmp_path: Path, content: bytes) -> Path:
    project = tmp_path / "p"
    (project / ".pi").mkdir(parents=True)
    (project / ".pi" / "pi-materia.json").write_bytes(content)
    return project


@pytest.mark.timeout(30)
@pytest.mark.parametrize("kind", sorted(MALFORMED))
def test_the_refusal_names_the_project_file_once(tmp_path: Path, kind: str) -> None:
    project = _project(tmp_path, MALFORMED[kind])
    layer = str(project / ".pi" / "pi-materia.json")
    with pytest.raises(ConfigError) as caught:
        load_resolved(project, env={"PI_MATERIA_PROFILE_DIR": str(tmp_path / "profile")}, home=tmp_path)
    assert caught.value.message.count(layer) == 1, caught.value.message
    assert [i.source for i in caught.value.issues] == [layer]  # the issue map still says which file


@pytest.mark.timeout(60)
def test_castor_grid_prints_the_path_once(tmp_path: Path) -> None:
    project = _project(tmp_path, MALFORMED["invalid-json"])
    env = {**os.environ, "PYTHONPATH": str(REPO), "HOME": str(tmp_path), "MATERIA_CONFIG": "",
           "PI_MATERIA_PROFILE_DIR": str(tmp_path / "profile")}
    grid = subprocess.run([sys.executable, "-m", "castor", "grid"], cwd=project, env=env, text=True,
                          capture_output=True, timeout=60)
    assert grid.returncode == 1
    assert grid.stderr.count(".pi/pi-materia.json") == 1, grid.stderr
    assert "malformed JSON in" in grid.stderr and "line 2 column 8" in grid.stderr


def test_an_issue_at_a_place_in_the_file_keeps_its_file_and_pointer() -> None:
    issue = ConfigIssue(code="invalid-budget", path="/budget/maxTokens", source="c.json", message="must be a number")
    assert str(issue) == "[invalid-budget] c.json#/budget/maxTokens: must be a number"
    whole = ConfigIssue(code="missing-loadouts", source="c.json", message="no loadouts")  # the message names no file
    assert str(whole) == "[missing-loadouts] c.json#/: no loadouts"

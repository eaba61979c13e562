"""docs/operations.md's exit status table, the rows no other test held to: a token file that does
not exist (exit 2, ``invalid_config``), a ``script:`` answers file that does not load (exit 1,
``invalid_config``, no cast started) and a ``--workdir`` other users could plant files in (exit 2,
``forbidden``, nothing written). Each through the real command line, in a fresh directory."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def _castor(tmp_path: Path, *args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(REPO), "CASTOR_AGENT": "", "HOME": str(tmp_path / "home"),
           "PI_MATERIA_PROFILE_DIR": str(tmp_path / "profile"), "MATERIA_CONFIG": "", "CASTOR_TOKEN_FILE": ""}
    return subprocess.run([sys.executable, "-m", "castor", *args], cwd=cwd, env=env, text=True, capture_output=True,
                          timeout=60)


def _one_line(result: subprocess.CompletedProcess[str], status: int, code: str) -> str:
    assert result.returncode == status, (result.returncode, result.stderr)
    assert "Traceback" not in result.stderr, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"castor: {code}: "), lines
    return lines[0]


@pytest.mark.timeout(60)
def test_a_token_file_that_does_not_exist_is_exit_2_invalid_config_and_nothing_connects(tmp_path):
    missing = tmp_path / "no-token"
    refused = _castor(tmp_path, "inspect", "--tcp", "127.0.0.1:1", "--token-file", str(missing), cwd=tmp_path)
    line = _one_line(refused, 2, "invalid_config")
    assert str(missing) in line and "does not exist" in line, line
    assert refused.stdout == "", refused.stdout


@pytest.mark.timeout(60)
def test_a_script_answers_file_that_does_not_load_is_exit_1_invalid_config_and_no_cast_starts(tmp_path):
    project = tmp_path / "project"
    (project / ".pi").mkdir(parents=True)
    (project / ".pi" / "pi-materia.json").write_text(json.dumps({"activeLoadout": "hello"}))
    (project / "broken.json").write_text("[not json")
    for script in ("missing.json", "broken.json"):
        refused = _castor(tmp_path, "cast", "hi", "--agent", f"script:{script}", "--quiet", cwd=project)
        line = _one_line(refused, 1, "invalid_config")
        assert script in line, line
    assert not (project / ".pi" / "pi-materia").exists() or not any((project / ".pi" / "pi-materia").iterdir())


@pytest.mark.timeout(60)
def test_a_workdir_other_users_could_plant_files_in_is_exit_2_forbidden_and_nothing_is_written(tmp_path):
    """Under a parent every user may write (not sticky), ``castor demo --workdir`` is refused
    before anything starts. It used to make the workdir first, and leave it behind."""
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)
    refused = _castor(tmp_path, "demo", "--workdir", str(shared / "work"), cwd=tmp_path)
    line = _one_line(refused, 2, "forbidden")
    assert "writable by other users" in line and str(shared) in line, line
    assert list(shared.iterdir()) == [], list(shared.iterdir())  # nothing written, not even the directory

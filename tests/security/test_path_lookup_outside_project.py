"""A bare program name never resolves to a file of the project's.

castor's own PATH may hold an empty entry, ``.`` or another relative entry, or the project's
directory. ``subprocess`` resolves those in the child, after it has changed into the project: an
untrusted project's planted ``git`` ran when the bundled loadout's vcs.detect asked for the
repository root, and its ``make`` ran for the user's own global ``["make", "check"]``. Only
absolute entries outside the project are searched now; a name found nowhere else is not_found.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from castor.adapters.materia.builtins import vcs_detect
from castor.adapters.materia.process_runner import UtilityCommand, UtilitySpawnError, run_command
from castor.messages.errors import ErrorCode


def _plant(directory: Path, name: str, marker: Path) -> None:
    program = directory / name
    program.write_text(f"#!/bin/sh\necho planted >> {marker}\necho /planted\n")
    program.chmod(program.stat().st_mode | stat.S_IEXEC)


@pytest.mark.timeout(30)
@pytest.mark.parametrize("entry", ["", ".", "bin", "PROJECT", "LINK"])
def test_a_planted_program_in_the_project_never_runs_for_a_bare_name(tmp_path, monkeypatch, entry):
    project = tmp_path / "proj"
    (project / "bin").mkdir(parents=True)
    (tmp_path / "link").symlink_to(project)
    marker = tmp_path / "PWNED"
    for where in (project, project / "bin"):
        for name in ("git", "make", "jj"):
            _plant(where, name, marker)
    planted = {"": "", ".": ".", "bin": "bin", "PROJECT": str(project), "LINK": str(tmp_path / "link")}[entry]
    path = os.pathsep.join([planted, "/usr/bin", "/bin"])
    monkeypatch.setenv("PATH", path)
    found = vcs_detect(project)  # runs `git rev-parse` when a git is found
    assert not marker.exists(), "the project's own git ran"
    assert found["root"] != "/planted"
    with pytest.raises(UtilitySpawnError) as missing:
        run_command(UtilityCommand(argv=["make-not-anywhere-else"], cwd=project, env={"PATH": path}))
    assert missing.value.code == ErrorCode.NOT_FOUND and "outside the project" in missing.value.message
    result = run_command(UtilityCommand(argv=["sh", "-c", 'echo "$0"'], cwd=project, env={"PATH": path}))
    assert result.ok and result.stdout.strip() == "sh", "argv[0] stays the command's own name"
    if (Path("/usr/bin/make").exists() or Path("/bin/make").exists()):
        run_command(UtilityCommand(argv=["make", "--version"], cwd=project, env={"PATH": path}))
    assert not marker.exists()


@pytest.mark.timeout(30)
def test_a_path_with_a_slash_still_runs_the_projects_own_program(tmp_path):
    project = tmp_path / "proj"
    (project / "bin").mkdir(parents=True)
    marker = tmp_path / "RAN"
    _plant(project / "bin", "tool", marker)
    assert run_command(UtilityCommand(argv=["bin/tool"], cwd=project, env={"PATH": "/usr/bin:/bin"})).ok
    assert marker.exists()

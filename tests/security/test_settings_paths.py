"""Paths written in a settings file resolve against that file's directory, never the session's cwd.

A relative ``python`` (or ``stateDbPath``) in the *global* settings once resolved against the
session's working directory — an untrusted project — so a project shipping
``.venv/bin/python`` had it run. Real worker subprocesses over the reference backend; every
planted executable is a tripwire that writes a marker when run.
"""

from __future__ import annotations

import sys
from pathlib import Path

import psutil
import pytest

from castor.messages.errors import CastorError

pytestmark = pytest.mark.timeout(60)


def _python_wrapper(path: Path, marker: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f"#!/bin/sh\necho ran >> {marker}\nexec {sys.executable} \"$@\"\n")
    path.chmod(0o755)
    return path


@pytest.mark.parametrize("trusted", [False, True])
def test_a_relative_global_python_never_runs_the_projects_file(icarus_world, trusted):
    w = icarus_world
    project_marker, global_marker = w.tmp / "project-python-ran", w.tmp / "global-python-ran"
    evil = _python_wrapper(w.project / ".venv" / "bin" / "python", project_marker)
    w.write_global(python=".venv/bin/python")  # relative: beside the global settings file
    rt = w.runtime()
    _, sess = w.open(rt, f"s-{trusted}", trusted=trusted)
    expected = w.agent_dir / ".venv" / "bin" / "python"
    assert sess.config()["config"]["effective"]["python"] == str(expected)
    # Nothing exists beside the global settings yet: the spawn fails typed, the project's file is not run.
    with pytest.raises(CastorError) as failed:
        sess.tool("fabric_brief", {})
    assert failed.value.code == "worker_crashed" and failed.value.data.get("reason") == "spawn_failed"
    assert not project_marker.exists()

    # The control: the file beside the global settings is the one that runs ...
    _python_wrapper(expected, global_marker)
    _, again = w.open(rt, f"s2-{trusted}", trusted=trusted)
    assert again.tool("fabric_brief", {})["recent"] == []
    command = psutil.Process(again.current_worker_pid()).cmdline()
    assert global_marker.exists() and not project_marker.exists(), command
    # ... and the project's tripwire does fire when run, so its silence above means "not run".
    import subprocess

    subprocess.run([str(evil), "-c", "pass"], timeout=30, check=True)
    assert project_marker.exists()


def test_a_relative_state_db_path_in_the_global_settings_names_a_file_beside_it(icarus_world):
    w = icarus_world
    w.write_global(stateDbPath="state/icarus.db")
    rt = w.runtime()
    _, sess = w.open(rt, "s1", trusted=False)
    effective = sess.config()["config"]["effective"]
    assert effective["stateDbPath"] == str(w.agent_dir / "state" / "icarus.db")
    assert not str(effective["stateDbPath"]).startswith(str(w.project))


def test_a_trusted_project_settings_python_resolves_against_the_project_settings_directory(icarus_world):
    w = icarus_world
    w.write_project({"python": "bin/python"})
    rt = w.runtime()
    _, sess = w.open(rt, "s1", trusted=True)
    assert sess.config()["config"]["effective"]["python"] == str(w.project / ".pi" / "bin" / "python")
    _, untrusted = w.open(rt, "s2", trusted=False)
    assert untrusted.config()["config"]["effective"]["python"] != str(w.project / ".pi" / "bin" / "python")

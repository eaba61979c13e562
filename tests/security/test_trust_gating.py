"""Trust gating: project files never choose what runs before the project is trusted.

Through the runtime's Icarus component with real worker subprocesses over the
reference backend. Every hostile file is a *tripwire*: if executed or imported
it writes a marker file. Each test also shows the tripwire works (a trusted
session, or a direct run), so a missing marker means "not run", not "broken".
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import psutil
import pytest

from castor.messages.errors import CastorError

from .conftest import REFERENCE_ICARUS

pytestmark = pytest.mark.timeout(40)


def _evil_python(path: Path, marker: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f"#!/bin/sh\necho ran > {marker}\nexec {sys.executable} \"$@\"\n")
    path.chmod(0o755)
    return path


def _tripwire_module(path: Path, marker: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f"open({str(marker)!r}, 'a').write({path.name!r} + '\\n')\nraise SystemExit(9)\n")


def test_an_untrusted_project_cannot_choose_the_python_or_the_package(icarus_world):
    w = icarus_world
    py_marker, pkg_marker = w.tmp / "project-python-ran", w.tmp / "project-package-imported"
    evil_python = _evil_python(w.project / "tools" / "python", py_marker)
    evil_pkg = w.project / "vendor" / "icarus"
    _tripwire_module(evil_pkg / "__init__.py", pkg_marker)
    w.write_project({"python": str(evil_python), "icarusDir": str(evil_pkg), "timeoutMs": 4321})
    rt = w.runtime()
    _, untrusted = w.open(rt, "untrusted", trusted=False)
    effective = untrusted.config()["config"]["effective"]
    assert effective["python"] == sys.executable and effective["icarusDir"] == str(REFERENCE_ICARUS)
    assert effective["timeoutMs"] != 4321  # the untrusted layer was not read at all
    written = untrusted.tool("fabric_write", {"type": "note", "summary": "gated sqlite note", "content": "c"})
    assert written["status"] == "written"
    injected = rt.dispatch_event("untrusted", "before_agent_start", {"prompt": "sqlite note"})
    assert "gated sqlite note" in injected["message"]["content"]
    assert w.calls("hooks.pre_llm_call"), "the reference backend (not the project's) served the call"
    assert not py_marker.exists() and not pkg_marker.exists()

    # the same project, trusted: its choices are honoured, so the tripwires above could have fired
    _, trusted = w.open(rt, "trusted", trusted=True)
    assert trusted.config()["config"]["effective"]["python"] == str(evil_python)
    with pytest.raises(CastorError):
        trusted.tool("fabric_brief", {})  # the tripwire package exits the worker
    assert py_marker.exists() and pkg_marker.exists()


def test_modules_planted_in_the_project_or_on_pythonpath_are_never_imported(icarus_world):
    w = icarus_world
    marker = w.tmp / "planted-imported"
    for name in ("json.py", "sitecustomize.py", "usercustomize.py", "sqlite3.py", "os.py", "icarus/__init__.py",
                 "icarus/hooks.py", "icarus/tools.py"):
        _tripwire_module(w.project / name, marker)
    # hostile inherited PYTHONPATH entries: the project itself, relative and empty entries
    w.env["PYTHONPATH"] = os.pathsep.join([str(w.project), ".", "", "icarus", str(w.project / "icarus")])
    rt = w.runtime()
    _, sess = w.open(rt, "s1", trusted=False)
    assert sess.tool("fabric_write", {"type": "note", "summary": "planted sqlite note", "content": "c"})["status"]
    injected = rt.dispatch_event("s1", "before_agent_start", {"prompt": "sqlite note"})
    assert "planted sqlite note" in injected["message"]["content"]
    assert sess.tool("fabric_brief", {})["recent"] == ["planted sqlite note"]
    assert not marker.exists(), marker.read_text()

    # the tripwires work: a plain interpreter started in the project imports them
    subprocess.run([sys.executable, "-c", "import json"], cwd=w.project, timeout=30, capture_output=True,
                   env={"PATH": os.environ.get("PATH", "/usr/bin:/bin")})
    assert marker.exists()


def test_a_bare_python_name_never_resolves_to_an_executable_in_the_project(icarus_world):
    w = icarus_world
    marker = w.tmp / "project-python3-ran"
    _evil_python(w.project / "python3", marker)
    _evil_python(w.project / "bin" / "python3", marker)
    w.write_global(python="python3")
    venv_bin = str(Path(sys.executable).parent)
    w.env["PATH"] = os.pathsep.join([str(w.project / "bin"), ".", "bin", str(w.project), venv_bin, "/usr/bin", "/bin"])
    rt = w.runtime()
    _, sess = w.open(rt, "s1", trusted=True)
    assert sess.tool("fabric_brief", {})["recent"] == []
    pid = sess.current_worker_pid()
    assert pid is not None
    command = psutil.Process(pid).cmdline()
    assert not Path(command[0]).resolve().is_relative_to(w.project.resolve()), command
    assert not marker.exists()
    # the tripwire works when run
    subprocess.run([str(w.project / "python3"), "-c", "pass"], timeout=30, check=True)
    assert marker.exists()

"""A storage fault's notice names the recast command of the surface the cast is driven from: a
CLI cast (``castor cast`` / ``castor recast``) says ``castor recast ID``, a harness cast
``/materia recast ID`` (docs/materia.md "Surfaces"; the notice used to name ``/materia recast``
in the CLI too)."""

from __future__ import annotations

from pathlib import Path

import pytest

from castor.actors.materia.api import materia_call
from castor.adapters.agents.scripted import ScriptedAgent, parse_script
from castor.adapters.stderr_ui import StderrUi
from castor.runtime import HarnessLink, SessionInfo
from tests.actors.materia.helpers import make_runtime, wait_for
from tests.security.test_disk_full import DiskFault

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
def runtime():
    rt = make_runtime()
    yield rt
    rt.shutdown(10.0)


def _notice_of_a_fault_mid_run(runtime, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, kind: str) -> tuple[str, str]:
    """Start a cast in a session of ``kind`` (``standalone``: the CLI's; ``endpoint``: a harness's),
    fill the disk before its first answer is saved; (cast id, the error notice)."""
    project = tmp_path / "project"
    project.mkdir()
    ui = StderrUi(printer=lambda _line: None)
    agent = ScriptedAgent(parse_script([{"text": "lost", "delay_ms": 400}]))
    runtime.open_session(SessionInfo(session_id="s1", cwd=str(project), trusted=True),
                         HarnessLink(agent=agent, session_log=None, ui=ui, kind=kind))
    fault = DiskFault(monkeypatch, project)
    cast_id = materia_call(runtime, "s1", "start", {"request": "x", "loadout": "hello"})["cast_id"]
    fault.on("ENOSPC")  # before the turn's answer: its transition cannot be saved
    told = wait_for(lambda: [m for level, m in ui.notifications if level == "error" and cast_id in m] or None,
                    timeout=30, what="the storage fault's notice")
    fault.off()
    return cast_id, told[0]


def test_a_cli_cast_that_meets_a_storage_fault_names_castor_recast(runtime, tmp_path, monkeypatch):
    cast_id, notice = _notice_of_a_fault_mid_run(runtime, tmp_path, monkeypatch, "standalone")
    assert "storage unavailable" in notice and "ENOSPC" in notice, notice
    assert f"then castor recast {cast_id}." in notice, notice
    assert "/materia" not in notice, notice


def test_a_harness_cast_that_meets_a_storage_fault_names_materia_recast(runtime, tmp_path, monkeypatch):
    cast_id, notice = _notice_of_a_fault_mid_run(runtime, tmp_path, monkeypatch, "endpoint")
    assert f"then /materia recast {cast_id}." in notice, notice
    assert "castor recast" not in notice, notice

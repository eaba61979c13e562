"""Config warnings reach the harness: in the ``cast.start`` result, as ``ui.notify`` and as the
cast's ``config_warning`` events, and in ``config.validate`` — over a real socket."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from .helpers import wait_for, write_project_config
from .test_endpoint import FakeHarness

REPO = Path(__file__).resolve().parents[3]  # the checkout: tests/actors/materia/<file>

GUARDED_TEXT = {"activeLoadout": "G", "materia": {"A": {"prompt": "A {{request}}", "tools": "none"},
                                                  "B": {"prompt": "B", "tools": "none"}},
                "loadouts": {"G": {"entry": "Socket-1", "sockets": {
                    "Socket-1": {"type": "agent", "materia": "A", "parse": "text",
                                 "edges": [{"when": "satisfied", "to": "Socket-2"}]},
                    "Socket-2": {"type": "agent", "materia": "B"}}}}}
WHERE = "/loadouts/G/sockets/Socket-1/edges/0/when"


@pytest.mark.timeout(60)
def test_a_config_pi_materia_runs_starts_with_its_warning_told_to_the_harness(served, project):
    write_project_config(project, GUARDED_TEXT)
    client = served()
    harness = FakeHarness(client, "pi-1", {"*": ["text, not json"]})
    client.call("session.open", {"session_id": "pi-1", "cwd": str(project), "trusted": True})
    started = client.call("cast.start", {"session_id": "pi-1", "cwd": str(project), "request": "go"})
    assert started["level"] == "warning"
    assert [(w["code"], w["path"], w["severity"]) for w in started["warnings"]] == [
        ("text-socket-guarded-edge", WHERE, "warning")]
    assert "text-socket-guarded-edge" in started["text"]
    done = wait_for(lambda: (v := client.call("cast.status", {"session_id": "pi-1", "cast_id": started["cast_id"]}))
                    ["status"] == "complete" and v, what="completion")
    assert done["status"] == "complete" and len(harness.turns) == 1  # ended at Socket-1, as pi-materia does
    wait_for(lambda: any("text-socket-guarded-edge" in str(n.get("text") or n.get("message") or n)
                         for n in harness.notes), what="the ui.notify warning")
    events = [json.loads(line) for line in (Path(done["run_dir"]) / "events.jsonl").read_text().splitlines()]
    warned = [e for e in events if e["type"] == "config_warning"]
    assert [(e["data"]["code"], e["data"]["path"]) for e in warned] == [("text-socket-guarded-edge", WHERE)]

    checked = client.call("config.validate", {"session_id": "pi-1", "path": ".pi/pi-materia.json"})
    assert checked["ok"] is True and checked["errors"] == [] and checked["level"] == "warning"
    assert len(checked["warnings"]) == 1 and "text-socket-guarded-edge" in checked["warnings"][0]


@pytest.mark.timeout(60)
def test_castor_validate_prints_warnings_and_still_exits_zero(tmp_path, project):
    write_project_config(project, GUARDED_TEXT)
    env = {**os.environ, "PYTHONPATH": str(REPO), "HOME": str(tmp_path / "home"),
           "PI_MATERIA_PROFILE_DIR": str(tmp_path / "profile"), "MATERIA_CONFIG": ""}
    result = subprocess.run([sys.executable, "-m", "castor", "validate", ".pi/pi-materia.json"], cwd=project,
                            env=env, text=True, capture_output=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert "valid" in result.stdout
    (line,) = [ln for ln in result.stderr.splitlines() if "[warning" in ln]
    assert line.startswith("[warning text-socket-guarded-edge] ") and f"#{WHERE}:" in line
    broken = json.loads(json.dumps(GUARDED_TEXT))
    broken["loadouts"]["G"]["sockets"]["Socket-2"]["materia"] = "Nope"
    write_project_config(project, broken)
    result = subprocess.run([sys.executable, "-m", "castor", "validate", ".pi/pi-materia.json"], cwd=project,
                            env=env, text=True, capture_output=True, timeout=60)
    assert result.returncode == 1 and "[unknown-materia]" in result.stderr


@pytest.mark.timeout(60)
def test_castor_grid_lists_the_warnings_of_the_loadout(tmp_path, project):
    write_project_config(project, GUARDED_TEXT)
    env = {**os.environ, "PYTHONPATH": str(REPO), "HOME": str(tmp_path / "home"),
           "PI_MATERIA_PROFILE_DIR": str(tmp_path / "profile"), "MATERIA_CONFIG": ""}
    result = subprocess.run([sys.executable, "-m", "castor", "grid"], cwd=project, env=env, text=True,
                            capture_output=True, timeout=60)
    assert result.returncode == 0, result.stderr
    tail = result.stdout.split("\nwarnings:\n", 1)[1]
    assert tail.startswith(f"  [text-socket-guarded-edge] {WHERE}: ")

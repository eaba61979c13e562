"""What a cast driven by ``python -m castor cast --agent script:FILE`` leaves in its run directory,
checked against pi-materia's run records: each test runs a fresh project and reads the files."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[2]


def cast(tmp_path: Path, sockets: dict[str, Any], answers: list[Any]) -> Path:
    """Run one cast of a loadout of ``sockets`` (materia ``A``: a text agent) and return its run directory."""
    root = tmp_path / "project"
    (root / ".pi").mkdir(parents=True)
    config = {"materia": {"A": {"prompt": "Do {{request}}", "tools": "none"}},
              "loadouts": {"L": {"entry": next(iter(sockets)), "sockets": sockets}}, "activeLoadout": "L"}
    (root / ".pi" / "pi-materia.json").write_text(json.dumps(config))
    (root / "answers.json").write_text(json.dumps(answers))
    env = {**os.environ, "PYTHONPATH": str(REPO), "CASTOR_AGENT": "", "HOME": str(tmp_path / "home"),
           "PI_MATERIA_PROFILE_DIR": str(tmp_path / "profile"), "MATERIA_CONFIG": ""}
    subprocess.run([sys.executable, "-m", "castor", "cast", "go", "--quiet", "--agent", "script:answers.json"],
                   cwd=root, env=env, text=True, capture_output=True, timeout=60)
    (run_dir,) = [p for p in (root / ".pi" / "pi-materia").iterdir() if p.is_dir()]
    return run_dir


def events(run_dir: Path, kind: str) -> list[dict[str, Any]]:
    rows = [json.loads(line) for line in (run_dir / "events.jsonl").read_text().splitlines()]
    return [row["data"] for row in rows if row["type"] == kind]


@pytest.mark.parametrize(("first", "entry_id"), [
    ({"type": "utility", "utility": "echo", "params": {"text": "x"}}, "utility:Socket-1:1"),
    ({"type": "agent", "materia": "A"}, None),  # the agent turn's own id: read from its socket_complete
])
def test_a_limit_hit_starting_the_next_socket_fails_the_cast_with_the_entry_that_led_there(
        tmp_path: Path, first: dict[str, Any], entry_id: str | None) -> None:
    """pi-materia fails the cast with the entry id of the output whose routing failed: a utility's
    ``utility:<id>:<visit>`` (the whole chain its completion starts), an agent turn's transcript id.
    The visit limit of the socket started next is such a failure, as the edge limit is."""
    socket = {**first, "limits": {"maxVisits": 1}, "edges": [{"when": "always", "to": "Socket-1"}]}
    run_dir = cast(tmp_path, {"Socket-1": socket}, ["one", "two"])

    (completed,) = events(run_dir, "socket_complete")
    expected = entry_id if entry_id is not None else completed["entryId"]
    (end,) = events(run_dir, "cast_end")
    assert end["ok"] is False
    assert end["error"] == "Materia socket visit limit exceeded for Socket-1 (2/1)."
    assert end["entryId"] == expected
    manifest = json.loads((run_dir / "manifest.json").read_text())["entries"]
    assert manifest[-1]["phase"] == "failed" and manifest[-1]["entryId"] == expected


def test_item_keys_name_artifacts_as_pi_materias_seg_names_them(tmp_path: Path) -> None:
    """``seg``: each run of characters outside ``[A-Za-z0-9._-]`` becomes ``-``, then leading and
    trailing ``-`` go; dots are kept (an item key is always a suffix after ``<visit>-``, never a
    path component of its own); nothing left is ``task``."""
    items = [{"id": "../x y"}, {"id": ".env"}, {"id": "@@"}, {"id": "v1.2 beta"}]
    sockets = {
        "Socket-1": {"type": "utility", "utility": "echo", "params": {"output": {"items": items}}, "parse": "json",
                     "assign": {"items": "$.items"}, "edges": [{"when": "always", "to": "Socket-2"}]},
        "Socket-2": {"type": "utility", "utility": "echo", "params": {"text": "x"}, "foreach": {"items": "state.items"},
                     "advance": {"cursor": "Socket-2Index", "items": "state.items"},
                     "edges": [{"when": "always", "to": "Socket-2"}]},
    }
    run_dir = cast(tmp_path, sockets, [])

    outputs = sorted(p.name for p in (run_dir / "sockets" / "Socket-2").glob("*.md"))
    assert outputs == ["1-..-x-y.md", "2-.env.md", "3-task.md", "4-v1.2-beta.md"]
    inputs = sorted(p.name for p in (run_dir / "sockets" / "Socket-2").glob("*.input.json"))
    assert inputs == ["1-..-x-y.input.json", "2-.env.input.json", "3-task.input.json", "4-v1.2-beta.input.json"]

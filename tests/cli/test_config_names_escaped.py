"""A name a project config chooses -- a loadout, a materia -- is printed by ``castor loadout``,
``castor cast`` and ``castor status`` with its control characters escaped, line breaks included:
a loadout named ``"a\\nFAKE LINE"`` printed a line of its own (a project config forging castor's
output), though an ESC in the same place was already shown escaped."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.timeout(180)

LOADOUT = "a\nFAKE LINE\x1b[31m"
MATERIA = "m\nFORGED MATERIA"  # socket ids are Socket-N; a materia's name is the config's choice


def _castor(tmp_path: Path, project: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(REPO), "CASTOR_AGENT": "", "HOME": str(tmp_path / "home"),
           "PI_MATERIA_PROFILE_DIR": str(tmp_path / "profile"), "MATERIA_CONFIG": ""}
    return subprocess.run([sys.executable, "-m", "castor", *args], cwd=project, env=env, text=True,
                          capture_output=True, timeout=120)


def _no_forged_line(result: subprocess.CompletedProcess[str]) -> None:
    assert result.returncode == 0, result.stderr
    for stream in (result.stdout, result.stderr):
        assert "\x1b" not in stream, stream
        for line in stream.splitlines():
            assert not line.startswith(("FAKE LINE", "FORGED MATERIA")), stream


def test_config_chosen_names_never_print_a_line_of_their_own(tmp_path: Path) -> None:
    project = tmp_path / "project"
    (project / ".pi").mkdir(parents=True)
    (project / ".pi" / "pi-materia.json").write_text(json.dumps({
        "activeLoadout": LOADOUT,
        "materia": {MATERIA: {"prompt": "Answer: {{request}}", "tools": "readOnly"}},
        "loadouts": {LOADOUT: {"entry": "Socket-1", "sockets": {"Socket-1": {"type": "agent", "materia": MATERIA}}}},
    }))
    (project / "answers.json").write_text(json.dumps(["hi"]))

    listed = _castor(tmp_path, project, "loadout")
    _no_forged_line(listed)
    assert "⌘ a\\nFAKE LINE\\x1b[31m (" in listed.stdout, listed.stdout

    cast = _castor(tmp_path, project, "cast", "x", "--quiet", "--agent", "script:answers.json")
    _no_forged_line(cast)
    assert "started (a\\nFAKE LINE\\x1b[31m): " in cast.stdout, cast.stdout

    status = _castor(tmp_path, project, "status", "latest")
    _no_forged_line(status)
    assert "loadout a\\nFAKE LINE\\x1b[31m" in status.stdout, status.stdout
    assert "socket Socket-1 (m\\nFORGED MATERIA)" in status.stdout, status.stdout


def test_a_loadout_chosen_by_name_is_echoed_escaped(tmp_path: Path) -> None:
    project = tmp_path / "project"
    (project / ".pi").mkdir(parents=True)
    (project / ".pi" / "pi-materia.json").write_text(json.dumps({
        "loadouts": {LOADOUT: {"entry": "Socket-1", "sockets": {"Socket-1": {"type": "agent", "materia": "greeter"}}}},
    }))
    chosen = _castor(tmp_path, project, "loadout", LOADOUT)
    _no_forged_line(chosen)
    assert "Active loadout: a\\nFAKE LINE\\x1b[31m (saved to " in chosen.stdout, chosen.stdout

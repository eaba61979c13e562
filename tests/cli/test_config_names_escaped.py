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


def test_validate_shows_each_finding_on_one_line_with_a_config_s_names_escaped(tmp_path: Path) -> None:
    """``castor validate`` printed its findings raw: a loadout named with a terminal escape set the
    user's window title (or cleared the screen), and a name with a line break forged a finding."""
    project = tmp_path / "project"
    project.mkdir()
    hostile = "y\x1b]0;pwned\x07\n[ok] FORGED"
    (project / "hostile.json").write_text(json.dumps({
        "activeLoadout": "x\x1b[2J",
        "loadouts": {hostile: {"entry": "A", "sockets": {"A": {"materia": "nope"}}}},
    }))
    checked = _castor(tmp_path, project, "validate", "hostile.json")
    for stream in (checked.stdout, checked.stderr):
        assert "\x1b" not in stream and "\x07" not in stream, stream
        assert not any(line.startswith("[ok] FORGED") for line in stream.splitlines()), stream
    assert 'y\\x1b]0;pwned\\x07\\n[ok] FORGED' in checked.stderr, checked.stderr

    odd = project / "a\nb \x1b[31m.json"
    odd.write_text("{}")
    valid = _castor(tmp_path, project, "validate", odd.name)
    assert valid.returncode == 0, valid.stderr
    assert valid.stdout == "a\\nb \\x1b[31m.json: valid\n", valid.stdout
    missing = _castor(tmp_path, project, "validate", "no\nsuch.json")
    assert missing.returncode == 1 and missing.stderr.count("\n") == 1, missing.stderr


def test_the_file_loadout_saved_to_is_shown_on_one_line(tmp_path: Path) -> None:
    project = tmp_path / "pro\nject"
    project.mkdir()
    chosen = _castor(tmp_path, project, "loadout", "hello")
    assert chosen.returncode == 0, chosen.stderr
    assert "(saved to " in chosen.stdout and "pro\\nject/.pi/pi-materia.json)" in chosen.stdout, chosen.stdout
    assert not any(line.startswith("ject") for line in chosen.stdout.splitlines()), chosen.stdout


def test_names_with_rich_markup_are_shown_as_written_in_the_live_progress_of_a_cast() -> None:
    """``castor cast`` on a terminal draws its progress with rich, which reads ``[...]`` in a table
    cell as markup: a loadout, socket or materia named ``[/]`` (a config's choice) or a work item
    titled so (the model's) ended the command with a MarkupError, and ``[link=...]`` or ``[red]``
    in one restyled the table. Such names are now shown as they are written."""
    import io

    from rich.console import Console

    from castor.cli.materia import _progress

    names = ("[/]", "[link=http://example.invalid]x[/link]", "[red]R")
    view = {"cast_id": "c1", "status": "active", "loadout": names[0], "current_socket": names[1],
            "current_materia": names[2], "item_label": names[0], "visits": {names[0]: 1}, "usage": {"tokens": 3}}
    out = io.StringIO()
    Console(file=out, force_terminal=True, width=200, color_system=None).print(_progress(view))
    for name in names:
        assert name in out.getvalue(), out.getvalue()

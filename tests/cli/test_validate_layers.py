"""``castor validate FILE`` checks the layers a cast in the directory would run, not FILE alone.

A cast (and ``castor grid``) layers the bundled default, the profile's ``materia.json``, the
project's ``.pi/pi-materia.json`` and the explicit file. ``castor validate`` layered FILE over the
bundled default only: a project whose loadout used a materia of the user's profile was refused
(``unknown-materia``) although every cast ran it, and a profile that refuses every cast
(``limits.maxSocketVisits: 0``) validated. Each test runs the CLI in a fresh directory with its
own profile, and checks ``validate`` against what ``grid`` (which resolves as a cast does) says.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

PROJECT_LOADOUT = {"activeLoadout": "Mine-Loadout",
                   "loadouts": {"Mine-Loadout": {"sockets": {"Socket-1": {"type": "agent", "materia": "Mine"}}}}}
PROFILE_MATERIA = {"materia": {"Mine": {"prompt": "Say hi.", "tools": "none"}}}


def _castor(project: Path, *args: str, profile: Path, materia_config: str = "") -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(REPO), "HOME": str(project.parent / "home"),
           "PI_MATERIA_PROFILE_DIR": str(profile), "MATERIA_CONFIG": materia_config}
    return subprocess.run([sys.executable, "-m", "castor", *args], cwd=project, env=env, text=True,
                          capture_output=True, timeout=60)


def _dirs(tmp_path: Path, *, profile: dict[str, object] | None, project: dict[str, object] | None) -> tuple[Path, Path]:
    profile_dir, project_dir = tmp_path / "profile", tmp_path / "project"
    profile_dir.mkdir()
    (project_dir / ".pi").mkdir(parents=True)
    if profile is not None:
        (profile_dir / "materia.json").write_text(json.dumps(profile))
    if project is not None:
        (project_dir / ".pi" / "pi-materia.json").write_text(json.dumps(project))
    return profile_dir, project_dir


@pytest.mark.timeout(120)
def test_a_project_loadout_using_a_materia_of_the_profile_validates_as_it_runs(tmp_path: Path) -> None:
    profile, project = _dirs(tmp_path, profile=PROFILE_MATERIA, project=PROJECT_LOADOUT)
    grid = _castor(project, "grid", profile=profile)
    assert grid.returncode == 0, grid.stderr
    checked = _castor(project, "validate", ".pi/pi-materia.json", profile=profile)
    assert checked.returncode == 0, checked.stderr
    assert "unknown-materia" not in checked.stderr and ".pi/pi-materia.json: valid" in checked.stdout


@pytest.mark.timeout(120)
def test_a_profile_every_cast_refuses_fails_validation_naming_the_profile_file(tmp_path: Path) -> None:
    profile, project = _dirs(tmp_path, profile={"limits": {"maxSocketVisits": 0}},
                             project={"activeLoadout": "hello"})
    grid = _castor(project, "grid", profile=profile)
    assert grid.returncode == 1 and "invalid-limits" in grid.stderr
    checked = _castor(project, "validate", ".pi/pi-materia.json", profile=profile)
    assert checked.returncode == 1, checked.stdout
    assert "[invalid-limits]" in checked.stderr and str(profile / "materia.json") in checked.stderr


@pytest.mark.timeout(120)
def test_another_file_validates_as_the_explicit_layer_over_profile_and_project(tmp_path: Path) -> None:
    """A file that is not the project's layer is checked as ``--config FILE`` runs it: above the
    profile and the project layer (here the project's materia is what its loadout uses)."""
    profile, project = _dirs(tmp_path, profile=None, project={"materia": PROFILE_MATERIA["materia"]})
    (project / "other.json").write_text(json.dumps(PROJECT_LOADOUT))
    grid = _castor(project, "grid", "--config", "other.json", profile=profile)
    assert grid.returncode == 0, grid.stderr
    checked = _castor(project, "validate", "other.json", profile=profile)
    assert checked.returncode == 0, checked.stderr
    # the flag beats $MATERIA_CONFIG in a cast; validate's FILE takes the flag's place
    elsewhere = tmp_path / "broken.json"
    elsewhere.write_text('{"limits": {"maxSocketVisits": 0}}')
    checked = _castor(project, "validate", "other.json", profile=profile, materia_config=str(elsewhere))
    assert checked.returncode == 0, checked.stderr


@pytest.mark.timeout(120)
def test_a_missing_project_layer_is_not_valid(tmp_path: Path) -> None:
    profile, project = _dirs(tmp_path, profile=None, project=None)
    checked = _castor(project, "validate", ".pi/pi-materia.json", profile=profile)
    assert checked.returncode == 1 and "[file-not-found]" in checked.stderr


@pytest.mark.timeout(120)
def test_a_relative_file_is_named_as_given(tmp_path: Path) -> None:
    profile, project = _dirs(tmp_path, profile=None, project=None)
    (project / "c.json").write_text('{"roles": {}}')
    checked = _castor(project, "validate", "c.json", profile=profile)
    assert checked.returncode == 1, checked.stderr
    assert checked.stderr.startswith('[obsolete-field] #/roles: obsolete field "roles" in c.json: '), checked.stderr
    assert str(project) not in checked.stderr


@pytest.mark.timeout(120)
def test_a_malformed_relative_file_is_named_once_as_given(tmp_path: Path) -> None:
    profile, project = _dirs(tmp_path, profile=None, project=None)
    (project / "c.json").write_text('{"activeLoadout": "hello",\n  "x": }')
    checked = _castor(project, "validate", "c.json", profile=profile)
    assert checked.returncode == 1 and checked.stderr.startswith("[invalid-json] malformed JSON in c.json at line 2")
    assert str(project) not in checked.stderr and checked.stderr.count("c.json") == 1


@pytest.mark.timeout(120)
@pytest.mark.parametrize("text", ['{"activeLoadout": "hello",\n}',
                                  '{"budget": {"maxTokens": 5, },\n "activeLoadout": "hello"}',
                                  '{"activeLoadout": "hello", "limits": {"maxSocketVisits": 3}, "x": [1, 2,\n\t]}'])
def test_a_trailing_comma_is_refused_as_pi_materia_refuses_it_and_named(tmp_path: Path, text: str) -> None:
    """JSON.parse refuses a comma before a closing bracket (a JSONC/JavaScript habit), so pi-materia
    does not load such a file; castor refuses it too, and says it is the comma (the parser's own words
    were "Expecting property name enclosed in double quotes" or "Expecting value")."""
    profile, project = _dirs(tmp_path, profile=None, project=None)
    (project / ".pi" / "pi-materia.json").write_text(text)
    checked = _castor(project, "validate", ".pi/pi-materia.json", profile=profile)
    assert checked.returncode == 1 and "[invalid-json]" in checked.stderr
    assert "JSON has no trailing commas" in checked.stderr, checked.stderr
    comma = text.rindex(",", 0, text.index("}" if text.count("]") == 0 else "]"))
    line = text.count("\n", 0, comma) + 1
    assert f"the comma at line {line} column {comma - (text.rfind(chr(10), 0, comma) + 1) + 1}" in checked.stderr


@pytest.mark.timeout(120)
@pytest.mark.parametrize("text", ['// mine\n{"activeLoadout": "hello"}', '{"activeLoadout": "hello" /* mine */}'])
def test_a_comment_is_refused_as_pi_materia_refuses_it_and_named(tmp_path: Path, text: str) -> None:
    """JSON.parse refuses a comment, so pi-materia does not load such a file; castor refuses it too,
    and says it is the comment (the parser's own words were "Expecting value")."""
    profile, project = _dirs(tmp_path, profile=None, project=None)
    (project / ".pi" / "pi-materia.json").write_text(text)
    checked = _castor(project, "validate", ".pi/pi-materia.json", profile=profile)
    assert checked.returncode == 1 and "[invalid-json]" in checked.stderr
    assert "JSON has no comments" in checked.stderr
    crlf = '{\r\n  "activeLoadout": "hello"\r\n}\r\n'  # line ends of either kind are whitespace to JSON
    (project / ".pi" / "pi-materia.json").write_text(crlf, newline="")
    assert _castor(project, "validate", ".pi/pi-materia.json", profile=profile).returncode == 0


@pytest.mark.timeout(120)
def test_the_profile_file_is_checked_in_its_own_place_below_the_project(tmp_path: Path) -> None:
    """The profile's materia.json is the user layer of every cast: validated, it stays below the
    project's layer. As the explicit layer it overrode the project's activeLoadout: a profile
    whose activeLoadout names a loadout only some projects have was refused in a project whose
    own activeLoadout every cast there runs."""
    profile, project = _dirs(tmp_path, profile={"activeLoadout": "Elsewhere-Only"},
                             project={"activeLoadout": "hello"})
    grid = _castor(project, "grid", profile=profile)
    assert grid.returncode == 0 and "loadout hello" in grid.stdout, grid.stderr
    checked = _castor(project, "validate", str(profile / "materia.json"), profile=profile)
    assert checked.returncode == 0, checked.stderr
    (profile / "materia.json").write_text('{"materia": {"Mine": {"prompt": "p", "tools": "all"}}}')
    checked = _castor(project, "validate", str(profile / "materia.json"), profile=profile)
    assert checked.returncode == 1 and f"[invalid-materia] {profile / 'materia.json'}#/materia/Mine/tools" \
        in checked.stderr, checked.stderr


@pytest.mark.timeout(120)
def test_cwd_chooses_the_project_whose_layers_validate_reads_as_grid_and_cast_take_it(tmp_path: Path) -> None:
    """``castor grid`` and ``castor cast`` take ``--cwd DIR`` (the project whose layers are read);
    ``castor validate`` had none, so a project elsewhere could only be checked from inside it. With
    ``--cwd DIR`` it reads DIR's layers, and a relative CONFIG_PATH from DIR, as ``castor cast --cwd
    DIR --config CONFIG_PATH`` does; the command's own directory plays no part."""
    profile, project = _dirs(tmp_path, profile=None, project={**PROJECT_LOADOUT, **PROFILE_MATERIA})
    (project / "c.json").write_text(json.dumps({"activeLoadout": "Mine-Loadout"}))
    elsewhere = tmp_path / "elsewhere"
    (elsewhere / ".pi").mkdir(parents=True)
    (elsewhere / "c.json").write_text('{"roles": {}}')  # a file of the same name here: never read
    grid = _castor(elsewhere, "grid", "--cwd", str(project), "--config", "c.json", profile=profile)
    assert grid.returncode == 0 and "Mine-Loadout" in grid.stdout, grid.stderr
    for path in ("c.json", ".pi/pi-materia.json"):
        checked = _castor(elsewhere, "validate", "--cwd", str(project), path, profile=profile)
        assert checked.returncode == 0 and checked.stdout.strip() == f"{path}: valid", checked.stderr
    unknown = _castor(elsewhere, "validate", "c.json", profile=profile)  # here: elsewhere's own c.json
    assert unknown.returncode == 1 and unknown.stderr.startswith("[obsolete-field] #/roles: "), unknown.stderr
    missing = _castor(elsewhere, "validate", "--cwd", str(tmp_path / "nowhere"), "c.json", profile=profile)
    assert missing.returncode == 1 and missing.stderr.startswith("castor: not_found: --cwd "), missing.stderr
    helped = _castor(elsewhere, "validate", "--help", profile=profile)
    assert "--cwd DIR" in helped.stdout, helped.stdout


def _pi_materia_default() -> str:
    """pi-materia's own default config, read at test time (never copied here)."""
    from tests.support.pi_materia import fixture_path

    return fixture_path("default.json").read_text(encoding="utf-8")


def _a_layer_naming_its_file_in_each_message(code: str, project: Path, outside: Path) -> str:
    """Write a config whose ``castor validate`` line has ``code`` (a problem whose message names
    the file); returns the CONFIG_PATH to validate."""
    real = _pi_materia_default()
    written = {
        "obsolete-field": lambda: real.replace("{", '{"roles": {}, "materiaDefinitions": {}, ', 1),
        "duplicate-key": lambda: real.replace("{", '{"artifactDir": ".pi/pi-materia", ', 1),
        "invalid-json": lambda: real[: len(real) // 2],
        "bom": lambda: "\ufeff" + real,
        "not-an-object": lambda: "[" + real + "]",
        "artifact-dir-outside-project": lambda: json.dumps({**json.loads(real), "artifactDir": "../elsewhere"}),
    }
    name = f"layer-{code}.json"
    if code == "read-error":
        (project / name).write_bytes(real.encode("utf-8").replace(b"{", b"{\"k\xff\": 1, ", 1))
    elif code == "path-escapes-project":
        (outside / name).write_text(real, encoding="utf-8")
        (project / ".pi" / "pi-materia.json").symlink_to(outside / name)
        return ".pi/pi-materia.json"
    elif code != "file-not-found":
        (project / name).write_text(written[code](), encoding="utf-8")
    return name


@pytest.mark.parametrize("code", ["obsolete-field", "duplicate-key", "invalid-json", "bom", "not-an-object",
                                  "artifact-dir-outside-project", "read-error", "path-escapes-project",
                                  "file-not-found"])
def test_every_validate_line_names_its_file_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                 capsys: pytest.CaptureFixture[str], code: str) -> None:
    """``duplicate-key`` and ``obsolete-field`` messages name the file they are about (so does a
    cast's ``config_warning`` notice, which shows no file else), and ``castor validate`` named it
    again before them: ``[warning duplicate-key] F#/artifactDir: key ... of F; ...``. Every line
    names the file once, over pi-materia's real default config broken one way at a time."""
    from castor.cli.materia import main

    profile, project = _dirs(tmp_path, profile=None, project=None)
    (tmp_path / "outside").mkdir()
    monkeypatch.setenv("PI_MATERIA_PROFILE_DIR", str(profile))
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.delenv("MATERIA_CONFIG", raising=False)
    config = _a_layer_naming_its_file_in_each_message(code, project, tmp_path / "outside")
    main(["validate", config, "--cwd", str(project)])
    lines = [line for line in capsys.readouterr().err.splitlines() if line.startswith("[")]
    expected = "invalid-json" if code == "bom" else code
    assert any(line.startswith((f"[{expected}]", f"[warning {expected}]")) for line in lines), lines
    named = Path(config).name
    assert all(line.count(named) == 1 for line in lines), lines
    if code == "path-escapes-project":  # where the link leads, not the same path under this process's cwd
        assert str(tmp_path / "outside" / "layer-path-escapes-project.json") in lines[0], lines

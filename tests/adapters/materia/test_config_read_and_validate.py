"""Reading a config layer and ``castor validate``: what pi-materia accepts and what a cast refuses.

A key written twice in one object of a config layer:

pi-materia reads a layer with ``JSON.parse``: the last value of a repeated key wins and the
earlier ones vanish without a word (two ``"Build"`` materia, two ``"sockets"`` in a loadout). castor
reads it the same way -- a config pi-materia loads still loads -- and says so: a ``duplicate-key``
warning at the repeated member, in ``castor validate``, in the resolved config (so the cast's
``config_warning`` events and the cast start result carry it) and nowhere else changed.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from castor.adapters.materia.config_loader import load_resolved, read_layer, validate_file
from tests.support.refused_reads import refuse_reads_in

REPO = Path(__file__).resolve().parents[3]

DUPLICATED = """{
  "activeLoadout": "Full-Auto",
  "materia": {
    "M": {"prompt": "first", "tools": "none"},
    "M": {"prompt": "second", "tools": "readOnly"}
  },
  "loadouts": {"T": {"entry": "Socket-1", "sockets": {"Socket-1": {"type": "agent", "materia": "M"}},
                     "entry": "Socket-1"}},
  "activeLoadout": "T"
}
"""


def _codes(issues):
    return [(i.code, i.path, i.severity) for i in issues]


@pytest.mark.timeout(30)
def test_a_repeated_key_keeps_the_last_value_and_is_a_warning_at_its_place(tmp_path: Path) -> None:
    path = tmp_path / "dup.json"
    path.write_text(DUPLICATED)
    data, issues = read_layer(path)
    assert data is not None and data["activeLoadout"] == "T" and data["materia"]["M"]["prompt"] == "second"
    assert sorted(_codes(issues)) == [("duplicate-key", "/activeLoadout", "warning"),
                                      ("duplicate-key", "/loadouts/T/entry", "warning"),
                                      ("duplicate-key", "/materia/M", "warning")]
    assert all(i.source == str(path) and "last" in i.message for i in issues)

    checked = validate_file(path)
    assert all(i.is_warning for i in checked)  # still valid, as in pi-materia
    assert ("duplicate-key", "/materia/M", "warning") in _codes(checked)


@pytest.mark.timeout(30)
def test_the_warning_reaches_the_resolved_config_a_cast_starts_from(tmp_path: Path) -> None:
    project = tmp_path / "project"
    (project / ".pi").mkdir(parents=True)
    (project / ".pi" / "pi-materia.json").write_text(DUPLICATED)
    env = {"PI_MATERIA_PROFILE_DIR": str(tmp_path / "profile")}
    resolved = load_resolved(project, env=env, home=tmp_path / "home")
    assert resolved.pipeline.loadout_name == "T"
    dup = [w for w in resolved.warnings if w.code == "duplicate-key"]
    assert [w.path for w in dup] == ["/activeLoadout", "/materia/M", "/loadouts/T/entry"]
    assert all(w.source == str(project / ".pi" / "pi-materia.json") for w in dup)


@pytest.mark.timeout(30)
def test_a_config_without_repeats_has_no_such_warning(tmp_path: Path) -> None:
    path = tmp_path / "ok.json"
    path.write_text('{"a": {"b": 1, "c": [{"b": 2}, {"b": 3}]}, "b": {"a": 1}}')
    data, issues = read_layer(path)
    assert issues == [] and data == {"a": {"b": 1, "c": [{"b": 2}, {"b": 3}]}, "b": {"a": 1}}


@pytest.mark.timeout(60)
def test_castor_validate_prints_it_and_exits_zero(tmp_path: Path) -> None:
    path = tmp_path / "dup.json"
    path.write_text(DUPLICATED)
    env = {**os.environ, "PYTHONPATH": str(REPO), "HOME": str(tmp_path / "home"),
           "PI_MATERIA_PROFILE_DIR": str(tmp_path / "profile"), "MATERIA_CONFIG": ""}
    result = subprocess.run([sys.executable, "-m", "castor", "validate", str(path)], env=env, text=True,
                            capture_output=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert f"[warning duplicate-key] #/materia/M: key \"M\" is written 2 times in one object of {path}; " in \
        result.stdout + result.stderr


# --------------------------------------------------------------------------- artifactDir

@pytest.mark.timeout(60)
@pytest.mark.parametrize("artifact_dir", ["../outside", "/tmp/castor-elsewhere", "a/../../b"])
def test_castor_validate_refuses_the_artifact_dir_a_cast_would_refuse(tmp_path: Path, artifact_dir: str) -> None:
    """``castor validate`` said "valid" for a config whose every cast is refused ``forbidden``
    (an ``artifactDir`` leading out of the project): it now reports the same refusal, exit 1."""
    project = tmp_path / "project"
    (project / ".pi").mkdir(parents=True)
    config = project / ".pi" / "pi-materia.json"
    config.write_text('{"activeLoadout": "hello", "artifactDir": "%s"}' % artifact_dir)
    env = {**os.environ, "PYTHONPATH": str(REPO), "HOME": str(tmp_path / "home"),
           "PI_MATERIA_PROFILE_DIR": str(tmp_path / "profile"), "MATERIA_CONFIG": ""}
    checked = subprocess.run([sys.executable, "-m", "castor", "validate", ".pi/pi-materia.json"], cwd=project,
                             env=env, text=True, capture_output=True, timeout=60)
    script = project / "a.json"
    script.write_text('["hi"]')
    cast = subprocess.run([sys.executable, "-m", "castor", "cast", "x", "--agent", f"script:{script}", "--quiet"],
                          cwd=project, env=env, text=True, capture_output=True, timeout=60)
    assert cast.returncode != 0 and "artifactDir must stay inside the project" in cast.stderr
    assert checked.returncode == 1, checked.stdout
    assert "[artifact-dir-outside-project] .pi/pi-materia.json#/artifactDir" in checked.stderr
    assert "artifactDir must stay inside the project" in checked.stderr


@pytest.mark.timeout(30)
def test_an_artifact_dir_inside_the_project_validates(tmp_path: Path) -> None:
    project = tmp_path / "project"
    (project / ".pi").mkdir(parents=True)
    config = project / ".pi" / "pi-materia.json"
    config.write_text('{"activeLoadout": "hello", "artifactDir": "runs/materia"}')
    assert validate_file(config, project=project) == []
    config.write_text('{"activeLoadout": "hello", "artifactDir": "%s"}' % (project / "abs" / "runs"))
    assert validate_file(config, project=project) == []
    config.write_text('{"activeLoadout": "hello", "artifactDir": "../x"}')
    assert validate_file(config) == []  # no project named: only what the file alone says
    assert [i.code for i in validate_file(config, project=project)] == ["artifact-dir-outside-project"]


@pytest.mark.timeout(30)
def test_a_byte_order_mark_is_named_in_the_refusal(tmp_path: Path) -> None:
    """A file saved with a UTF-8 BOM (some Windows editors) is refused, as ``JSON.parse`` refuses
    it in pi-materia -- with a message that says what is wrong, not "Expecting value"."""
    path = tmp_path / "bom.json"
    path.write_bytes(b'\xef\xbb\xbf{"activeLoadout": "hello"}')
    data, issues = read_layer(path)
    assert data is None and [i.code for i in issues] == ["invalid-json"]
    assert "byte order mark" in issues[0].message and str(path) in issues[0].message


@pytest.mark.timeout(60)
def test_castor_validate_refuses_a_project_config_linked_outside_the_project(tmp_path: Path) -> None:
    """Every cast refuses a project's ``.pi/pi-materia.json`` that is a link to a file elsewhere
    (``path-escapes-project``); ``castor validate`` said "valid". The same file given as
    ``--config`` (the explicit layer) is read by casts, and validates once the link is gone."""
    outside = tmp_path / "elsewhere.json"
    outside.write_text('{"activeLoadout": "hello"}')
    project = tmp_path / "project"
    (project / ".pi").mkdir(parents=True)
    (project / ".pi" / "pi-materia.json").symlink_to(outside)
    env = {**os.environ, "PYTHONPATH": str(REPO), "HOME": str(tmp_path / "home"),
           "PI_MATERIA_PROFILE_DIR": str(tmp_path / "profile"), "MATERIA_CONFIG": ""}
    checked = subprocess.run([sys.executable, "-m", "castor", "validate", ".pi/pi-materia.json"], cwd=project,
                             env=env, text=True, capture_output=True, timeout=60)
    assert checked.returncode == 1, checked.stdout
    assert "[path-escapes-project]" in checked.stderr and str(outside) in checked.stderr
    assert outside.read_text() == '{"activeLoadout": "hello"}'
    # validate checks the layers a cast runs: while the link is there every cast refuses it
    assert [i.code for i in validate_file(outside, project=project)] == ["path-escapes-project"]
    (project / ".pi" / "pi-materia.json").unlink()
    assert validate_file(outside, project=project) == []


@pytest.mark.parametrize("name", ["EMFILE", "ENFILE"])
def test_a_config_file_castor_has_no_descriptor_to_open_is_storage_unavailable_not_an_invalid_config(
        tmp_path, monkeypatch, name):
    """Out of file descriptors (``ulimit -n``), the project's ``pi-materia.json`` could not be
    opened and ``cast.start`` answered ``invalid_config`` ("read-error: cannot read config file …:
    Too many open files"), telling the user to fix a config that is fine. It is the process's
    shortage: ``storage_unavailable`` naming the errno and the file; the same load once descriptors
    are free reads the config."""
    from castor.adapters.materia import config_loader
    from castor.messages.errors import CastorError

    (tmp_path / ".pi").mkdir()
    (tmp_path / ".pi" / "pi-materia.json").write_text('{"activeLoadout": "hello"}')
    refusing = refuse_reads_in(monkeypatch, config_loader, name)
    with pytest.raises(CastorError) as refused:
        load_resolved(tmp_path, env={}, home=tmp_path / "home")
    assert refused.value.code == "storage_unavailable", refused.value.to_wire()
    assert refused.value.data["errno"] == name and refused.value.data["path"].endswith("pi-materia.json")
    refusing["on"] = False
    resolved = load_resolved(tmp_path, env={}, home=tmp_path / "home")
    assert resolved.config["activeLoadout"] == "hello" and any(layer.scope == "project" and layer.loaded
                                                              for layer in resolved.layers)

"""A config file as users get it wrong on disk: each is a typed issue (or a warning) that says
what is wrong in the user's terms, never a silent fallback to the bundled default."""

from __future__ import annotations

import json
import os
from pathlib import Path

from castor.adapters.materia.config_loader import PROJECT_CONFIG, load_resolved, read_layer, validate_file
from castor.domain.materia.config import warning

HELLO = {"activeLoadout": "hello"}


def _env(tmp_path: Path) -> dict[str, str]:
    return {"PI_MATERIA_PROFILE_DIR": str(tmp_path / "profile")}


def test_a_utf16_file_is_named_as_utf16(tmp_path: Path) -> None:
    path = tmp_path / "c.json"
    path.write_bytes(json.dumps(HELLO).encode("utf-16"))  # an editor's "Unicode": a BOM, then UTF-16
    data, (issue,) = read_layer(path)
    assert data is None and issue.code == "read-error"
    assert "it is UTF-16 text" in issue.message and "save it as UTF-8" in issue.message


def test_text_after_the_object_says_the_object_ended_before_it(tmp_path: Path) -> None:
    path = tmp_path / "c.json"
    path.write_text(json.dumps(HELLO, indent=2) + '\n{"activeLoadout": "plan"}\n')  # two objects pasted
    data, (issue,) = read_layer(path)
    assert data is None and issue.code == "invalid-json"
    assert "at line 4 column 1" in issue.message and "a file holds one object" in issue.message


def test_a_project_config_linked_to_nothing_is_said_not_silently_skipped(tmp_path: Path) -> None:
    """``.pi/pi-materia.json`` a link to a file that is gone: the cast ran on the bundled default
    without a word (the layer looked absent); it still runs so, as pi-materia runs it, and says so."""
    project = tmp_path / "p"
    (project / ".pi").mkdir(parents=True)
    os.symlink("../gone.json", project / PROJECT_CONFIG)
    resolved = load_resolved(project, env=_env(tmp_path))
    (said,) = [w for w in resolved.warnings if w.code == "dangling-config-link"]
    assert said.severity == "warning" and "../gone.json" in said.message and "does not exist" in said.message
    # asked about by name, it is missing, and the link is named
    (issue,) = validate_file(PROJECT_CONFIG, project=project, env=_env(tmp_path))
    assert issue.code == "file-not-found" and "a link to ../gone.json" in issue.message


def test_an_explicit_config_linked_to_nothing_names_the_link(tmp_path: Path) -> None:
    os.symlink("gone.json", tmp_path / "c.json")
    data, (issue,) = read_layer(tmp_path / "c.json")
    assert data is None and issue.code == "file-not-found" and "(a link to gone.json, which does not exist)" in \
        issue.message


def test_a_warning_about_no_field_is_shown_without_an_empty_pointer(tmp_path: Path) -> None:
    """A cast's notice showed the dangling link's warning as ``[dangling-config-link] : ...``."""
    project = tmp_path / "p"
    (project / ".pi").mkdir(parents=True)
    os.symlink("../gone.json", project / PROJECT_CONFIG)
    resolved = load_resolved(project, env=_env(tmp_path))
    (said,) = [w for w in resolved.warnings if w.code == "dangling-config-link"]
    assert said.pointed().startswith("[dangling-config-link] ") and " : " not in said.pointed()
    assert warning("unknown-field", "/limits/maxCost", "m").pointed() == "[unknown-field] /limits/maxCost: m"

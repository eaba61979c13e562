"""castor.adapters.materia.builtins: the built-ins (the output-source precedence is the engine's:
tests/domain/materia/test_engine.py; the pool is tests/actors/materia/test_utilities.py)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from castor.adapters.materia.builtins import UtilityError, ensure_ignored, run_builtin, vcs_detect
from castor.messages.errors import ErrorCode, Forbidden


def test_builtin_noop_and_echo(tmp_path):
    assert run_builtin("noop", None, cwd=tmp_path) == ""
    assert run_builtin("echo", {"text": "HELLO WORLD"}, cwd=tmp_path) == "HELLO WORLD"
    assert run_builtin("echo", {"message": "m"}, cwd=tmp_path) == "m"
    assert run_builtin("echo", {"text": {"a": [1]}}, cwd=tmp_path) == '{"a":[1]}'
    assert run_builtin("echo", {"output": "o", "text": "t"}, cwd=tmp_path) == "o"
    assert run_builtin("echo", {}, cwd=tmp_path) == ""


def test_an_unknown_alias_is_a_typed_invalid_config_error(tmp_path):
    with pytest.raises(UtilityError) as info:
        run_builtin("nope", {}, cwd=tmp_path)
    assert info.value.message == 'Unknown utility alias "nope".'
    assert info.value.code == ErrorCode.INVALID_CONFIG and info.value.data["reason"] == "unknown_alias"


def test_ensure_ignored_is_idempotent(tmp_path):
    (tmp_path / ".gitignore").write_text("# comment\nnode_modules/")  # no trailing newline
    first = ensure_ignored({"patterns": [".pi/pi-materia/", " dist/ "]}, tmp_path)
    assert first["added"] == [".pi/pi-materia/", "dist/"] and first["unchanged"] == []
    second = ensure_ignored({"patterns": [".pi/pi-materia/", "dist/"]}, tmp_path)
    assert second["added"] == [] and second["unchanged"] == [".pi/pi-materia/", "dist/"]
    text = (tmp_path / ".gitignore").read_text()
    assert text == "# comment\nnode_modules/\n.pi/pi-materia/\ndist/\n"
    assert json.loads(run_builtin("project.ensureIgnored", {"patterns": ["dist/"]}, cwd=tmp_path))["ok"] is True


def test_ensure_ignored_uses_vcs_root_and_creates_file(tmp_path):
    (tmp_path / ".git").mkdir()
    sub = tmp_path / "pkg" / "deep"
    sub.mkdir(parents=True)
    result = ensure_ignored({"patterns": ["build/"]}, sub)
    assert result["root"] == str(tmp_path.resolve())
    assert (tmp_path / ".gitignore").read_text() == "build/\n"
    custom = ensure_ignored({"patterns": ["x"], "file": ".ignore"}, sub)
    assert custom["file"] == str((tmp_path / ".ignore").resolve())


@pytest.mark.parametrize(
    "params",
    [{"patterns": []}, {"patterns": ["  "]}, {"patterns": "dist/"}, {}, {"patterns": ["a", 3]}],
)
def test_ensure_ignored_rejects_bad_patterns(tmp_path, params):
    with pytest.raises(UtilityError):
        ensure_ignored(params, tmp_path)
    assert list(tmp_path.iterdir()) == []


def test_ensure_ignored_refuses_paths_outside_the_project(tmp_path):
    project = tmp_path / "project"
    project.mkdir()
    with pytest.raises(Forbidden):
        ensure_ignored({"patterns": ["x"], "file": "../../etc-ignore"}, project)
    with pytest.raises(Forbidden):
        ensure_ignored({"patterns": ["x"], "root": ".."}, project)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["project"]


def test_vcs_detect_with_jj_marker(tmp_path):
    (tmp_path / ".jj").mkdir()
    result = vcs_detect(tmp_path)
    assert result["kind"] == "jj" and result["root"] == str(tmp_path.resolve())
    assert isinstance(result["available"]["jj"], bool) and isinstance(result["available"]["git"], bool)


def test_vcs_detect_git_marker_and_none(tmp_path, monkeypatch):
    repo = tmp_path / "repo"
    (repo / ".git").mkdir(parents=True)
    (repo / "src").mkdir()
    assert vcs_detect(repo / "src")["root"] == str(repo.resolve())
    plain = tmp_path / "plain"
    plain.mkdir()
    # Stop git (run for the command root) from finding a repository above tmp.
    monkeypatch.setenv("GIT_CEILING_DIRECTORIES", str(tmp_path))
    result = vcs_detect(plain)
    if not result["available"]["jj"]:
        assert result == {"kind": "none", "root": None, "available": result["available"]}


def test_ensure_ignored_never_plants_lines_in_a_file_that_is_not_an_ignore_file(tmp_path):
    """A home directory that is a dotfiles repository encloses the project: a project config must
    not append to ~/.bashrc through it, nor to .git/config (fsmonitor), a hook or .envrc."""
    home = tmp_path / "home"
    (home / ".git").mkdir(parents=True)
    (home / ".bashrc").write_text("# mine\n")
    project = home / "work" / "evil"
    project.mkdir(parents=True)
    for name in (".bashrc", ".git/config", ".git/hooks/pre-commit", "work/evil/.envrc", ".git/info/exclude-not"):
        with pytest.raises(Forbidden) as refused:
            ensure_ignored({"patterns": ["touch /tmp/pwned"], "file": name}, project)
        assert refused.value.data["reason"] == "not_an_ignore_file", name
    assert (home / ".bashrc").read_text() == "# mine\n"
    assert not (home / ".git" / "config").exists() and not (project / ".envrc").exists()
    nested = ensure_ignored({"patterns": ["dist/"], "file": "work/evil/.dockerignore"}, project)
    assert Path(nested["file"]).read_text() == "dist/\n"


def test_ensure_ignored_never_reads_or_writes_through_a_link(tmp_path):
    secret = tmp_path / "secret.txt"
    secret.write_text("TOP-SECRET\n")
    secret.chmod(0o600)
    project = tmp_path / "project"
    project.mkdir()
    (project / ".gitignore").symlink_to(secret)
    with pytest.raises(Forbidden) as refused:
        ensure_ignored({"patterns": ["dist/"]}, project)
    assert refused.value.data["reason"] == "symlink"
    assert (project / ".gitignore").is_symlink() and secret.read_text() == "TOP-SECRET\n"
    (project / ".gitignore").unlink()
    (project / ".gitignore").symlink_to(tmp_path / "not-there-yet")  # dangling: a write would create it
    with pytest.raises(Forbidden):
        ensure_ignored({"patterns": ["dist/"]}, project)
    assert not (tmp_path / "not-there-yet").exists()
    (project / ".gitignore").unlink()
    (project / ".gitignore").mkdir()
    with pytest.raises((Forbidden, OSError)):
        ensure_ignored({"patterns": ["dist/"]}, project)


def test_ensure_ignored_keeps_the_files_own_mode(tmp_path):
    (tmp_path / ".gitignore").write_text("a/\n")
    (tmp_path / ".gitignore").chmod(0o600)
    ensure_ignored({"patterns": ["b/"]}, tmp_path)
    assert (tmp_path / ".gitignore").read_text() == "a/\nb/\n"
    assert (tmp_path / ".gitignore").stat().st_mode & 0o777 == 0o600


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to give a directory to another user")
def test_a_vcs_marker_another_user_planted_is_not_a_root(tmp_path):
    """Another local user makes /tmp/.git (and links /tmp/.gitignore to a private file): a project
    under /tmp must not take /tmp as its repository and copy the file out."""
    shared = tmp_path / "shared"
    (shared / ".git").mkdir(parents=True)
    os.chown(shared / ".git", 54321, 54321)
    project = shared / "project"
    project.mkdir()
    result = ensure_ignored({"patterns": ["dist/"]}, project)
    assert result["root"] == str(project.resolve())
    assert (project / ".gitignore").read_text() == "dist/\n" and not (shared / ".gitignore").exists()

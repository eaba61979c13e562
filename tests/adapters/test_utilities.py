"""castor.adapters.materia.utilities: §7.1 precedence and §7.2 built-ins."""

from __future__ import annotations

import json
import sys

import pytest

from castor.adapters.materia.utilities import (
    UtilityError,
    UtilitySpec,
    ensure_ignored,
    produce_utility_output,
    run_builtin,
    vcs_detect,
)
from castor.adapters.materia.utility_runner import UtilityPool
from castor.messages.errors import ErrorCode, Forbidden


@pytest.fixture
def pool():
    p = UtilityPool(2, max_queue=4)
    yield p
    p.close()


def test_builtin_noop_and_echo(tmp_path):
    assert run_builtin("noop", None, cwd=tmp_path) == ""
    assert run_builtin("echo", {"text": "HELLO WORLD"}, cwd=tmp_path) == "HELLO WORLD"
    assert run_builtin("echo", {"message": "m"}, cwd=tmp_path) == "m"
    assert run_builtin("echo", {"text": {"a": [1]}}, cwd=tmp_path) == '{"a":[1]}'
    assert run_builtin("echo", {"output": "o", "text": "t"}, cwd=tmp_path) == "o"
    assert run_builtin("echo", {}, cwd=tmp_path) == ""


def test_precedence_command_then_params_output_then_builtin_then_error(tmp_path, pool):
    input_obj = {"castId": "c", "socketId": "Socket-1", "params": {}, "state": {}, "item": None}
    cmd = [sys.executable, "-c", "import sys, json; print(json.load(sys.stdin)['socketId'])"]
    out = produce_utility_output(
        UtilitySpec(utility="echo", command=cmd, params={"output": "ignored"}),
        socket_id="Socket-1", input_obj=input_obj, cwd=tmp_path, pool=pool,
    )
    assert (out.source, out.output, out.command.exit_code) == ("command", "Socket-1\n", 0)
    out = produce_utility_output(
        UtilitySpec(utility="whatever-unknown", params={"output": {"k": 1}}),
        socket_id="Socket-1", input_obj=input_obj, cwd=tmp_path, pool=pool,
    )
    assert (out.source, out.output, out.command) == ("params.output", '{"k":1}', None)
    out = produce_utility_output(
        UtilitySpec(utility="echo", params={"text": "HELLO WORLD"}),
        socket_id="Socket-1", input_obj=input_obj, cwd=tmp_path, pool=pool,
    )
    assert (out.source, out.output) == ("builtin", "HELLO WORLD")
    with pytest.raises(UtilityError) as info:
        produce_utility_output(UtilitySpec(utility="nope"), socket_id="Socket-4", input_obj=input_obj,
                               cwd=tmp_path, pool=pool)
    assert info.value.message == 'Unknown utility alias "nope" for socket "Socket-4".'
    assert info.value.code == ErrorCode.INVALID_CONFIG and info.value.data["reason"] == "unknown_alias"


def test_command_timeout_from_spec_is_applied(tmp_path, pool):
    out = produce_utility_output(
        UtilitySpec(command=[sys.executable, "-c", "import time; time.sleep(5)"], timeout_ms=50),
        socket_id="Socket-1", input_obj={}, cwd=tmp_path, pool=pool,
    )
    assert out.command.timed_out and out.command.timeout_ms == 50


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


def test_run_utility_socket_writes_command_artifacts_and_failure(tmp_path, pool):
    from castor.adapters.materia.artifacts import CastArtifacts
    from castor.adapters.materia.utilities import run_utility_socket

    cast = CastArtifacts(tmp_path / "art", "c1").create()
    code = "import sys; sys.stdout.write('o' * (1048576 + 100)); sys.stderr.write('exact err'); sys.exit(7)"
    run = run_utility_socket(
        cast, UtilitySpec(command=[sys.executable, "-c", code]), socket_id="Socket-1", visit=2,
        input_obj={"castId": "c1"}, cwd=tmp_path, pool=pool, item_key="WI-1",
    )
    assert run.source == "command" and len(run.output) == 1048576
    assert "exited with code 7" in run.failure and "exact err" in run.failure
    assert str(run.artifacts.stdout) in run.failure
    assert run.artifacts.stderr.read_text() == "exact err"
    assert run.artifacts.stderr_rel == "sockets/Socket-1/2-WI-1.command.stderr.txt"
    meta = json.loads(run.artifacts.meta.read_text())
    assert (meta["stdoutTruncated"], meta["stderrTruncated"]) == (True, False)
    assert run.command_event["code"] == 7 and run.command_event["timedOut"] is False
    ok = run_utility_socket(
        cast, UtilitySpec(utility="echo", params={"text": "HELLO WORLD"}), socket_id="Socket-2", visit=1,
        input_obj={}, cwd=tmp_path, pool=pool,
    )
    assert (ok.output, ok.failure, ok.artifacts) == ("HELLO WORLD", None, None)
    assert not (cast.run_dir / "sockets" / "Socket-2").exists()

"""``--json`` output is one valid JSON document on stdout whatever happens: a command that fails
(exit 1) or a flag refused (exit 2) prints ``{"error": {"code", "message"}}`` there, besides its
one line on stderr; without ``--json``, stdout stays empty on failure."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.timeout(90)

CASTOR = [sys.executable, "-m", "castor"]
ROOT = Path(__file__).resolve().parents[2]  # this checkout's castor, whatever the directory it runs in


def _run(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, HOME=str(tmp_path / "home"), PYTHONPATH=str(ROOT))
    env.pop("MATERIA_CONFIG", None)
    return subprocess.run([*CASTOR, *args], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60)


@pytest.mark.parametrize(("args", "status", "code"), [
    (("inspect", "--socket", "{tmp}/nothing.sock", "--json"), 1, "not_found"),
    (("inspect", "--socket", "{tmp}/nothing.sock", "mailbox", "--json"), 2, "invalid_params"),
    (("inspect", "--socket", "{tmp}/nothing.sock", "--sort", "worst", "--json"), 2, "invalid_params"),
    (("status", "nosuch", "--json"), 1, "not_found"),
    (("status", "latest", "--json"), 1, "not_found"),
    (("casts", "--cwd", "{tmp}/missing\u00e9 dir", "--json"), 1, "not_found"),
])
def test_a_failure_with_json_is_a_json_error_on_stdout(tmp_path, args, status, code):
    done = _run(tmp_path, *(a.replace("{tmp}", str(tmp_path)) for a in args))
    assert done.returncode == status, done.stderr
    error = json.loads(done.stdout)["error"]
    assert error["code"] == code and error["message"]
    assert done.stderr == f"castor: {code}: {error['message']}\n"  # the same error, both ways


def test_a_failure_without_json_leaves_stdout_empty(tmp_path):
    done = _run(tmp_path, "inspect", "--socket", str(tmp_path / "nothing.sock"))
    assert done.returncode == 1 and done.stdout == ""
    assert done.stderr.startswith("castor: not_found: ")


def test_status_latest_among_only_damaged_casts_says_they_are_unreadable_not_that_there_are_none(tmp_path):
    """A project whose only cast has a torn ``state.json``: ``castor casts`` lists it as unreadable,
    and ``castor status latest`` said "No pi-materia casts under …", which is not the truth."""
    run_dir = tmp_path / ".pi" / "pi-materia" / "2026-01-02T03-04-05-678Z"
    run_dir.mkdir(parents=True)
    (run_dir / "state.json").write_text('{"castId": "2026-01-02T03-04-05-678Z", "act')
    listed = _run(tmp_path, "casts", "--json")
    assert [row["status"] for row in json.loads(listed.stdout)] == ["unreadable"]
    done = _run(tmp_path, "status", "latest")
    assert done.returncode == 1 and done.stderr.count("\n") == 1
    assert "No readable pi-materia casts" in done.stderr and "1 unreadable" in done.stderr, done.stderr
    assert "2026-01-02T03-04-05-678Z" in done.stderr and "castor casts" in done.stderr

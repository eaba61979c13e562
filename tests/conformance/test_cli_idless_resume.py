"""pi-materia's id-less ``/materia recast`` / ``/materia revive`` from the command line: ``castor
recast`` and ``castor revive`` with no CAST_ID take the newest cast they can resume (recast: failed,
aborted, interrupted or orphaned; revive: exhausted same-socket recovery), never merely the newest
cast, and say pi-materia's sentence when there is none. Each test drives ``python -m castor`` in a
fresh project with a scripted agent."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]

ONE_SOCKET = {"materia": {"A": {"prompt": "Do {{request}}", "tools": "none"}},
              "loadouts": {"L": {"entry": "Socket-1", "sockets": {"Socket-1": {"type": "agent", "materia": "A"}}}},
              "activeLoadout": "L"}


def castor(tmp_path: Path, *args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(REPO), "CASTOR_AGENT": "", "HOME": str(tmp_path / "home"),
           "PI_MATERIA_PROFILE_DIR": str(tmp_path / "profile"), "MATERIA_CONFIG": ""}
    return subprocess.run([sys.executable, "-m", "castor", *args], cwd=cwd, env=env, text=True,
                          capture_output=True, timeout=60)


def project(tmp_path: Path) -> Path:
    root = tmp_path / "project"
    (root / ".pi").mkdir(parents=True)
    (root / ".pi" / "pi-materia.json").write_text(json.dumps(ONE_SOCKET))
    return root


def answers(root: Path, name: str, turns: list[Any]) -> str:
    (root / name).write_text(json.dumps(turns))
    return f"script:{name}"


def run_dirs(root: Path) -> list[Path]:
    return sorted(p for p in (root / ".pi" / "pi-materia").iterdir() if p.is_dir())


def event_types(run_dir: Path) -> list[str]:
    return [json.loads(line)["type"] for line in (run_dir / "events.jsonl").read_text().splitlines()]


def state(run_dir: Path) -> dict[str, Any]:
    return json.loads((run_dir / "state.json").read_text())["state"]


def test_idless_recast_resumes_the_newest_failed_or_aborted_cast_not_a_newer_complete_one(tmp_path: Path) -> None:
    root = project(tmp_path)
    failed = castor(tmp_path, "cast", "one", "--quiet", "--agent",
                    answers(root, "a1.json", [{"error": "provider auth failed", "stop_reason": "error"}]), cwd=root)
    assert failed.returncode == 1
    waiting = castor(tmp_path, "cast", "two", "--quiet", "--agent",
                     answers(root, "a2.json", [{"error": "WebSocket error", "stop_reason": "error"}]), cwd=root)
    assert waiting.returncode == 1
    aborted_dir = run_dirs(root)[-1]
    assert castor(tmp_path, "abort", aborted_dir.name, cwd=root).returncode == 0
    complete = castor(tmp_path, "cast", "three", "--quiet", "--agent", answers(root, "a3.json", ["fine"]), cwd=root)
    assert complete.returncode == 0, complete.stderr
    failed_dir, _, complete_dir = run_dirs(root)

    result = castor(tmp_path, "recast", "--quiet", "--agent", answers(root, "a4.json", ["resumed"]), cwd=root)

    assert result.returncode == 0, result.stderr
    assert f'pi-materia cast {aborted_dir.name} recast from socket "Socket-1".' in result.stdout
    assert "cast_recast" in event_types(aborted_dir)
    assert state(aborted_dir)["phase"] == "complete"
    assert "cast_recast" not in event_types(failed_dir) and "cast_recast" not in event_types(complete_dir)


def test_idless_recast_and_revive_with_nothing_to_resume_say_so(tmp_path: Path) -> None:
    root = project(tmp_path)
    done = castor(tmp_path, "cast", "one", "--quiet", "--agent", answers(root, "a1.json", ["fine"]), cwd=root)
    assert done.returncode == 0, done.stderr
    failed = castor(tmp_path, "cast", "two", "--quiet", "--agent",
                    answers(root, "a2.json", [{"error": "provider auth failed", "stop_reason": "error"}]), cwd=root)
    assert failed.returncode == 1

    revive = castor(tmp_path, "revive", "--quiet", "--agent", "script:a1.json", cwd=root)
    assert revive.returncode == 1
    assert "No failed pi-materia casts exhausted by same-socket recovery are available to revive" in revive.stderr
    assert "castor recast" in revive.stderr
    assert "Traceback" not in revive.stderr

    other = tmp_path / "other"
    other.mkdir()
    (other / ".pi").mkdir()
    (other / ".pi" / "pi-materia.json").write_text(json.dumps(ONE_SOCKET))
    recast = castor(tmp_path, "recast", "--quiet", "--agent", "script:a1.json", cwd=other)
    assert recast.returncode == 1
    assert "No failed or aborted pi-materia casts are available to recast." in recast.stderr
    assert "Traceback" not in recast.stderr


def test_idless_revive_takes_the_newest_exhausted_cast(tmp_path: Path) -> None:
    root = project(tmp_path)
    overflow = {"error": "context window exceeded", "stop_reason": "error"}
    exhausted = castor(tmp_path, "cast", "one", "--quiet", "--agent",
                       answers(root, "a1.json", [overflow, overflow]), cwd=root)
    assert exhausted.returncode == 1
    exhausted_dir = run_dirs(root)[-1]
    plain = castor(tmp_path, "cast", "two", "--quiet", "--agent",
                   answers(root, "a2.json", [{"error": "provider auth failed", "stop_reason": "error"}]), cwd=root)
    assert plain.returncode == 1

    result = castor(tmp_path, "revive", "--quiet", "--agent", answers(root, "a3.json", ["fine"]), cwd=root)

    assert result.returncode == 0, result.stderr
    types = event_types(exhausted_dir)
    assert types.index("cast_revive") < types.index("cast_recast")
    assert state(exhausted_dir)["phase"] == "complete"


def test_the_materia_config_flag_names_the_explicit_layer_and_beats_the_environment(tmp_path: Path) -> None:
    """pi-materia's ``--materia-config PATH`` is castor's ``--config PATH``: the explicit layer, chosen
    over ``MATERIA_CONFIG`` (whose file is then not read at all)."""
    root = project(tmp_path)
    flagged = dict(ONE_SOCKET, activeLoadout="F",
                   loadouts={"F": {"entry": "Socket-1", "sockets": {"Socket-1": {"type": "agent", "materia": "A"}}}})
    (root / "flag.json").write_text(json.dumps(flagged))
    env = {**os.environ, "PYTHONPATH": str(REPO), "CASTOR_AGENT": "", "HOME": str(tmp_path / "home"),
           "PI_MATERIA_PROFILE_DIR": str(tmp_path / "profile"), "MATERIA_CONFIG": str(root / "missing.json")}
    answers(root, "a1.json", ["done"])

    result = subprocess.run([sys.executable, "-m", "castor", "cast", "go", "--quiet", "--agent", "script:a1.json",
                             "--materia-config", "flag.json"], cwd=root, env=env, text=True, capture_output=True,
                            timeout=60)

    assert result.returncode == 0, result.stderr
    (run_dir,) = run_dirs(root)
    start = json.loads((run_dir / "events.jsonl").read_text().splitlines()[0])["data"]
    assert start["loadout"] == "F"
    assert start["configSource"].endswith(str(root / "flag.json"))
    grid = subprocess.run([sys.executable, "-m", "castor", "grid", "--materia-config", "flag.json"], cwd=root,
                          env=env, text=True, capture_output=True, timeout=60)
    assert grid.returncode == 0 and "loadout F" in grid.stdout, grid.stderr


def test_idless_status_abort_and_continue_act_on_the_newest_cast_still_going(tmp_path: Path) -> None:
    """As pi-materia's id-less ``/materia status|continue|abort`` load the active cast before the
    newest one: a cast left waiting on a transient failure behind a newer complete cast."""
    root = project(tmp_path)
    waiting = castor(tmp_path, "cast", "one", "--quiet", "--agent",
                     answers(root, "a1.json", [{"error": "WebSocket error", "stop_reason": "error"}]), cwd=root)
    assert waiting.returncode == 1
    waiting_dir = run_dirs(root)[-1]
    done = castor(tmp_path, "cast", "two", "--quiet", "--agent", answers(root, "a2.json", ["fine"]), cwd=root)
    assert done.returncode == 0, done.stderr

    status = castor(tmp_path, "status", cwd=root)
    assert status.returncode == 0, status.stderr
    assert status.stdout.startswith(f"cast {waiting_dir.name} ")

    resumed = castor(tmp_path, "continue", "--quiet", "--agent", answers(root, "a3.json", ["again"]), cwd=root)
    assert resumed.returncode == 0, resumed.stderr
    assert state(waiting_dir)["phase"] == "complete" and state(waiting_dir)["last_output"] == "again"

    nothing = castor(tmp_path, "abort", cwd=root)
    assert nothing.returncode == 1
    assert "No active pi-materia cast to abort." in nothing.stderr


def test_idless_abort_ends_the_cast_still_going(tmp_path: Path) -> None:
    root = project(tmp_path)
    waiting = castor(tmp_path, "cast", "one", "--quiet", "--agent",
                     answers(root, "a1.json", [{"error": "WebSocket error", "stop_reason": "error"}]), cwd=root)
    assert waiting.returncode == 1
    (waiting_dir,) = run_dirs(root)

    aborted = castor(tmp_path, "abort", cwd=root)

    assert aborted.returncode == 0, aborted.stderr
    assert state(waiting_dir)["failed_reason"] == "aborted by user"
    empty = tmp_path / "empty"
    empty.mkdir()
    for verb in ("status", "continue"):
        result = castor(tmp_path, verb, cwd=empty)
        assert result.returncode == 1 and "No pi-materia cast state in this session." in result.stderr

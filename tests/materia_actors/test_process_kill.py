"""A runtime PROCESS killed with SIGKILL mid-cast; a new process lists the cast and recasts it."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from .helpers import event_types, wait_for

REPO = Path(__file__).resolve().parents[2]


def _castor(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(REPO), "CASTOR_AGENT": ""}
    return subprocess.run([sys.executable, "-m", "castor", *args], cwd=cwd, env=env, text=True,
                          capture_output=True, timeout=40)


@pytest.mark.timeout(60)
def test_sigkilled_runtime_cast_is_listed_and_recast_to_completion(project, tmp_path):
    slow = tmp_path / "slow.json"
    slow.write_text(json.dumps([{"text": "never delivered", "delay_ms": 60_000}]))
    fast = tmp_path / "fast.json"
    fast.write_text(json.dumps(["answered after the crash"]))
    env = {**os.environ, "PYTHONPATH": str(REPO), "CASTOR_AGENT": ""}
    proc = subprocess.Popen([sys.executable, "-m", "castor", "cast", "survive a crash", "--loadout", "hello",
                             "--agent", f"script:{slow}", "--cwd", str(project), "--quiet"],
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        root = project / ".pi" / "pi-materia"

        def waiting_state() -> Path | None:
            for state in root.glob("*/state.json"):
                doc = json.loads(state.read_text())
                if (doc["state"].get("pending") or {}).get("kind") == "agent_turn":
                    return state.parent
            return None

        run_dir = wait_for(waiting_state, timeout=20, what="the cast to wait on its agent turn")
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(10)
    assert proc.returncode == -signal.SIGKILL
    cast_id = run_dir.name

    listed = _castor("casts", "--cwd", str(project), cwd=tmp_path)
    assert listed.returncode == 0, listed.stderr
    assert cast_id in listed.stdout and "orphaned" in listed.stdout and "RECAST TARGET" in listed.stdout
    status = _castor("status", cast_id, "--cwd", str(project), "--json", cwd=tmp_path)
    assert json.loads(status.stdout)["status"] == "orphaned"

    recast = _castor("recast", cast_id, "--cwd", str(project), "--agent", f"script:{fast}", "--quiet", cwd=tmp_path)
    assert recast.returncode == 0, recast.stderr
    assert "complete" in recast.stdout
    assert (run_dir / "sockets" / "Socket-1" / "1.md").read_text() == "answered after the crash"
    types = event_types(run_dir)
    assert types.count("cast_start") == 1 and "cast_recast" in types and types[-1] == "cast_end"
    doc = json.loads((run_dir / "state.json").read_text())
    assert doc["state"]["phase"] == "complete" and doc["incarnation"] >= 2

    again = _castor("recast", cast_id, "--cwd", str(project), "--agent", f"script:{fast}", cwd=tmp_path)
    assert again.returncode != 0 and "complete" in again.stderr and len(again.stderr.strip().splitlines()) == 1

"""A runtime PROCESS killed with SIGKILL mid-cast; a new process lists the cast and recasts it."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from .helpers import event_types, events, wait_for

REPO = Path(__file__).resolve().parents[3]  # the checkout: tests/actors/materia/<file>


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


@pytest.mark.timeout(90)
def test_a_command_left_running_by_a_sigkilled_runtime_is_killed_before_recast_runs_it_again(project, tmp_path):
    """kill -9 orphans the utility's tree (reparented to init, no deadline any more); the recast
    in a new process must kill it from its record instead of running a second copy beside it."""
    from tests.support.processes import process_gone
    from tests.support.waiting import poll_until

    pids = tmp_path / "pids"
    script, answers, records = _kill_9_a_cast_mid_command(project, tmp_path, tmp_path / "cmd.sh", f"echo $$ >> {pids}",
                                                          [], lambda: pids.exists() and pids.read_text().split())
    first = int(pids.read_text().split()[0])
    assert not process_gone(first)  # orphaned, still running: what the recast must deal with
    cast_id = records[0].parent.parent.name
    recast = _castor("recast", cast_id, "--cwd", str(project), "--agent", f"script:{answers}", "--quiet",
                     cwd=tmp_path)
    assert recast.returncode == 0, recast.stderr
    assert poll_until(lambda: process_gone(first), timeout=10), "the old command is still running"
    assert len(pids.read_text().split()) == 2  # ran again once, after the old copy was gone
    assert not list((project / ".pi" / "pi-materia").glob("*/.commands/*.json"))  # no record left


@pytest.mark.timeout(90)
def test_a_command_killed_mid_run_with_its_runtime_runs_again_and_the_recast_says_so(project, tmp_path):
    """A utility command still running when its runtime was killed ``-9`` never ended: no outcome,
    so the recast runs it again from the start (no socket says a command may not run twice, and
    pi-materia's recast re-runs it). It used to do so silently: the user saw the cast go on, not
    that a half-run command -- a deploy, a migration -- was starting over. Now the recast's
    output names it (a warning on the CLI's stderr, in a harness the same toast) and the cast's
    log records ``utility_interrupted``; a command that did not start is not named."""
    from tests.support.waiting import poll_until

    runs = tmp_path / "runs"
    script, answers, records = _kill_9_a_cast_mid_command(project, tmp_path, tmp_path / "deploy.sh",
                                                          f"echo started >> {runs}", ["--prod"],
                                                          lambda: runs.exists() and runs.read_text().split())
    run_dir = records[0].parent.parent
    visit_id = json.loads(records[0].read_text())["visit_id"]
    recast = _castor("recast", run_dir.name, "--cwd", str(project), "--agent", f"script:{answers}", "--quiet",
                     cwd=tmp_path)
    assert recast.returncode == 0, recast.stderr
    assert poll_until(lambda: runs.read_text().split() == ["started", "started"], timeout=10)  # it ran again
    said = [line for line in recast.stderr.splitlines() if "interrupted" in line]
    assert said == [f'[warning] Utility command for socket "Socket-1" was interrupted before it ended (its runtime '
                    f'stopped) and runs again from the start: "{script}" "--prod"'], recast.stderr
    logged = events(run_dir)
    [interrupted] = [e for e in logged if e["type"] == "utility_interrupted"]
    assert interrupted["data"] == {"socket": "Socket-1", "visitId": visit_id, "visit": 1,
                                   "command": [str(script), "--prod"], "cause": "its runtime stopped"}
    types = [e["type"] for e in logged]
    assert types.index("utility_interrupted") < types.index("cast_recast") and types.count("utility_interrupted") == 1
    assert json.loads((run_dir / "state.json").read_text())["state"]["phase"] == "complete"


@pytest.mark.timeout(30)
def test_the_cli_note_is_on_disk_before_the_casts_first_save(runtime_factory, project, monkeypatch):
    """So a CLI killed right after `start` still leaves its script agent with the cast
    (`castor recast` without --agent)."""
    from castor.actors.materia.api import materia_call
    from castor.adapters.materia.state_store import CastStateStore

    from .helpers import open_session, wait_status

    seen = []
    real_save = CastStateStore.save_encoded

    def save_encoded(self, cast_id, state_json, **kw):
        seen.append((self.artifact_root / cast_id / "cli.json").is_file())
        return real_save(self, cast_id, state_json, **kw)

    monkeypatch.setattr(CastStateStore, "save_encoded", save_encoded)
    rt = runtime_factory()
    open_session(rt, "s1", project, ["hi"])
    started = materia_call(rt, "s1", "start", {"request": "x", "loadout": "hello",
                                                "cli_note": {"agent": "script:/abs/answers.json"}})
    wait_status(rt, "s1", started["cast_id"])
    assert seen and all(seen)
    assert json.loads((Path(started["run_dir"]) / "cli.json").read_text()) == {"agent": "script:/abs/answers.json"}


def _kill_9_a_cast_mid_command(project: Path, tmp_path: Path, script: Path, first_line: str, args: list[str],
                               started: Callable[[], object]) -> tuple[Path, Path, list[Path]]:
    """A ``castor cast`` of one utility socket whose command (``script``, with ``args``) runs
    ``first_line``, then sleeps the first time and answers ``{}`` at once the next; the CLI killed
    ``-9`` once ``started()`` holds and the command's record is written (mid-command: started, not
    ended). Returns the script, the script agent's answers file and the command records."""
    script.write_text(f"#!/bin/sh\n{first_line}\nif [ -f {tmp_path}/again ]; then echo '{{}}'; exit 0; fi\n"
                      f"touch {tmp_path}/again\nsleep 300\n")
    script.chmod(0o755)
    (project / ".pi").mkdir()
    (project / ".pi" / "pi-materia.json").write_text(json.dumps({"activeLoadout": "U", "loadouts": {"U": {
        "entry": "Socket-1", "sockets": {"Socket-1": {"type": "utility", "command": [str(script), *args],
                                                      "timeoutMs": 600_000, "parse": "json"}}}}}))
    answers = tmp_path / "a.json"
    answers.write_text(json.dumps(["unused"]))
    env = {**os.environ, "PYTHONPATH": str(REPO), "CASTOR_AGENT": ""}
    proc = subprocess.Popen([sys.executable, "-m", "castor", "cast", "x", "--agent", f"script:{answers}",
                             "--cwd", str(project), "--quiet"], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        wait_for(started, timeout=30, what="the command to start")
        records = wait_for(lambda: list((project / ".pi" / "pi-materia").glob("*/.commands/*.json")), timeout=10,
                           what="the running command's record")
    finally:
        os.kill(proc.pid, signal.SIGKILL)  # mid-command: it has started and not ended
        proc.wait(10)
    return script, answers, records

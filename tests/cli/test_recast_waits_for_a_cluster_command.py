"""A cast whose utility command a cast host started on a Ray cluster, and whose host was then lost
(killed, or taken for lost) before it saw the command end: the command may still run on another
machine until its lease lapses, where the records' kill (``/proc`` of this machine) cannot reach
it. The serving process holds the cast's commands on the cast's new host until then, but ``castor
recast`` run by another process (another machine's, or a serve of its own) ran the command again at
once, beside that copy. The command's record now says how long it may run on
(``clusterFenceS``), and any runtime taking the cast up holds the cast's commands that long.

Two runtimes share the project: a ``castor cast`` killed ``-9`` mid-command leaves the run directory
as a lost cast host leaves it (the record of a command never seen to end); its record is given the
fence a cast host writes, its process killed (it stands for the copy out of reach), and ``castor
recast`` runs in a new process as a user types it."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.cli.interrupted_cast import castor_cli
from tests.support.waiting import wait_for

REPO = Path(__file__).resolve().parents[2]
FENCE_S = 4.0


@pytest.mark.timeout(120)
def test_a_recast_elsewhere_holds_the_command_a_lost_cast_host_may_still_run(tmp_path):
    project = tmp_path / "project"
    (project / ".pi").mkdir(parents=True)
    runs, hold = project / "runs.txt", project / "hold"
    command = f"date +%s.%N >> '{runs}'; if [ -e '{hold}' ]; then sleep 60; fi; echo built"
    config = {"activeLoadout": "U", "loadouts": {"U": {"entry": "Socket-1", "sockets": {
        "Socket-1": {"type": "utility", "command": ["sh", "-c", command],
                     "edges": [{"when": "always", "to": "Socket-2"}]},
        "Socket-2": {"type": "agent", "materia": "greeter"}}}}}
    (project / ".pi" / "pi-materia.json").write_text(json.dumps(config))
    (project / "answers.json").write_text(json.dumps(["hi"]))
    (project / "slow.json").write_text(json.dumps([{"text": "never", "delay_ms": 60_000}]))
    hold.touch()  # the first run outlives its runtime
    env = {**os.environ, "PYTHONPATH": str(REPO), "CASTOR_AGENT": "", "HOME": str(tmp_path / "home"),
           "PI_MATERIA_PROFILE_DIR": str(tmp_path / "profile"), "MATERIA_CONFIG": ""}
    proc = subprocess.Popen([sys.executable, "-m", "castor", "cast", "go", "--agent", "script:slow.json", "--quiet"],
                            cwd=project, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        wait_for(lambda: runs.exists() and runs.read_text().strip(), 60, "the command to start")
        [record] = wait_for(lambda: list(project.glob(".pi/pi-materia/*/.commands/*.json")), 10, "its record")
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(30)
    visit = json.loads(record.read_text())["visit_id"]
    for pid in subprocess.run(["pgrep", "-f", str(hold)], capture_output=True, text=True).stdout.split():
        os.kill(int(pid), signal.SIGKILL)  # the copy on the cluster: out of this machine's reach
    hold.unlink()
    record.write_text(json.dumps({"visit_id": visit, "clusterFenceS": FENCE_S}))  # as a cast host records it
    run_dir = record.parent.parent
    done = castor_cli(tmp_path, "recast", run_dir.name, "--agent", "script:answers.json", "--quiet", cwd=project,
                      timeout=90)
    assert done.returncode == 0, done.stderr
    started = [float(t) for t in runs.read_text().split()]
    assert len(started) == 2, started
    events = [json.loads(line) for line in (run_dir / "events.jsonl").read_text().splitlines()]
    recast_at = next(e["ts"] for e in events if e["type"] == "cast_recast") / 1000
    assert started[1] - recast_at >= FENCE_S - 0.2, (started, recast_at)  # not before the lost copy's lease lapsed
    assert "may still run" in done.stderr, done.stderr  # said, in the runtime's log

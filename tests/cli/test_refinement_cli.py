"""A multi-turn socket in the CLI: there is no user to refine with, so ``castor cast`` finalizes it
and runs the cast to the end; what it prints never leaves the user told to do what it already did."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from .test_abort_continue import castor, project, run_dirs

PLAN = json.dumps({"tasks": [{"id": "t1", "title": "x"}]})


@pytest.mark.timeout(120)
def test_a_refinement_pause_in_the_cli_is_finalized_by_the_command_and_says_so(tmp_path: Path) -> None:
    config = {"activeLoadout": "consult", "loadouts": {"consult": {"entry": "Socket-1", "sockets": {
        "Socket-1": {"type": "agent", "materia": "interactivePlanner", "edges": [{"when": "always", "to": "Socket-2"}]},
        "Socket-2": {"type": "agent", "materia": "greeter"}}}}}
    root = project(tmp_path, [PLAN, PLAN, "done", "done"], config)
    done = castor(tmp_path, "cast", "plan it", "--agent", "script:answers.json", cwd=root, timeout=100)
    assert done.returncode == 0, done.stderr
    lines = done.stderr.splitlines()
    asked = next(i for i, line in enumerate(lines) if "is waiting for your reply" in line)
    finalized = next(i for i, line in enumerate(lines) if "no user in the CLI to refine with" in line)
    assert asked < finalized  # the engine's notice first, then what this command does about it
    assert "no castor continue needed" in lines[finalized] and "Socket-1" in lines[finalized]
    assert "complete" in lines[-1]
    (run,) = run_dirs(root)
    events = [json.loads(line)["type"] for line in (run / "events.jsonl").read_text().splitlines()]
    assert events.index("socket_refinement") < events.index("socket_complete") and events[-1] == "cast_end"
    listed = castor(tmp_path, "status", run.name, "--json", cwd=root)
    assert listed.returncode == 0 and json.loads(listed.stdout)["status"] == "complete", listed.stdout

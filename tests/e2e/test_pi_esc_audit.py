"""Esc as a user meets it in the real Pi, audited from the outside: after each stop the footer says
what the cast waits for, ``castor status`` (the CLI, in another process) agrees, no process of the
stopped work is left running, the next prompt is answered, and nothing runs twice.

Real Pi in RPC mode (an RPC ``abort`` is the client's Esc) with the real runtime and the FAKE model.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import psutil
import pytest

from tests.support.waiting import poll_until

from .conftest import python_env, read_jsonl
from .test_pi_cancellation import (
    CALL_TIMEOUT_MS,
    STALL_S,
    error_toasts,
    events,
    requests_with,
    run_dir,
    settled_after,
    status,
    up,
    wait_cast_end,
    wait_request,
)

pytestmark = [pytest.mark.pi, pytest.mark.timeout(120)]

PLAN = json.dumps({"workItems": [{"id": "w1", "title": "ITEM-ONE"}, {"id": "w2", "title": "ITEM-TWO"}]})


def loop_project(tmp_path: Path) -> Path:
    """A planner, then a builder socket looped over the planner's work items."""
    root = tmp_path / "project"
    (root / ".pi").mkdir(parents=True)
    config: dict[str, Any] = {
        "artifactDir": ".pi/pi-materia", "activeLoadout": "Loop",
        "limits": {"maxSocketVisits": 9, "maxEdgeTraversals": 9},
        "materia": {
            "Planner": {"prompt": "PLANNER-MATERIA: plan the work items.", "tools": "none", "generator": True},
            "Builder": {"prompt": "BUILDER-MATERIA: build the current work item.", "tools": "none"},
        },
        "loadouts": {"Loop": {
            "entry": "Socket-1",
            "sockets": {
                "Socket-1": {"type": "agent", "materia": "Planner", "parse": "json",
                             "assign": {"workItems": "$.workItems"}, "edges": [{"when": "always", "to": "Socket-2"}]},
                "Socket-2": {"type": "agent", "materia": "Builder", "edges": [{"when": "always", "to": "Socket-2"}]},
            },
            "loops": {"items": {"label": "Build each work item", "sockets": ["Socket-2"],
                                "consumes": {"from": "Socket-1", "output": "workItems"},
                                "exit": {"from": "Socket-2", "when": "always", "to": "end"}}},
        }},
    }
    (root / ".pi" / "pi-materia.json").write_text(json.dumps(config))
    return root


def castor_status(root: Path) -> dict[str, Any]:
    """``castor status --json`` for the project's newest cast, from another process."""
    out = subprocess.run([sys.executable, "-m", "castor", "status", "--cwd", str(root), "--json"],
                         capture_output=True, text=True, timeout=30, env={**os.environ, **python_env()})
    assert out.returncode == 0, (out.stdout, out.stderr)
    return json.loads(out.stdout)


def castor_processes(pi_pid: int) -> list[psutil.Process]:
    return [p for p in psutil.Process(pi_pid).children(recursive=True) if p.is_running()]


def builder_requests_for(fake_llm, title: str) -> int:
    return sum(1 for r in requests_with(fake_llm, "BUILDER-MATERIA") if title in json.dumps(r["messages"][-1]))


def test_esc_in_a_loop_sockets_turn_then_a_prompt_at_once(start_pi, castor_command, fake_llm, tmp_path):
    """Esc while the looped builder works on the first item, and the user's next prompt sent at
    once: the prompt is answered, the cast waits interrupted at that socket and item (footer and
    ``castor status`` say so), and ``/materia continue`` runs that item again, once, then the next."""
    root = loop_project(tmp_path)
    pi = start_pi(castor_command, cwd=root, settings={"defaultProjectTrust": "always"}, timeout_ms=CALL_TIMEOUT_MS)
    up(pi)
    fake_llm.reply_text(PLAN, when="PLANNER-MATERIA")
    fake_llm.reply_text("BUILT never sent", when="BUILDER-MATERIA", delay=STALL_S)
    start = pi.command("/materia cast build two things")
    run = run_dir(root)
    wait_request(fake_llm, "BUILDER-MATERIA")
    processes_mid_turn = {p.pid for p in castor_processes(pi.proc.pid)}
    esc = pi.mark()
    pi.request({"type": "abort"})
    user = pi.prompt("USER-NEXT what changed")
    assert settled_after(pi, esc)["aborted"] is True
    assert any("USER-NEXT" in json.dumps(r["messages"][-1]) for r in fake_llm.log()), "the next prompt was answered"
    pi.wait_ui("setStatus", lambda e: str(e.get("statusText", "")).startswith(
        "materia: interrupted at Socket-2"), start=esc, timeout=5)
    assert poll_until(lambda: status(run) == "interrupted" or any(e["type"] == "turn_interrupted" for e in events(run)),
                      timeout=5)
    (interrupted,) = [e for e in events(run) if e["type"] == "turn_interrupted"]
    assert interrupted["data"]["socket"] == "Socket-2" and interrupted["data"].get("itemKey") == "w1", interrupted
    # No process of the stopped turn is left: what runs under Pi is what ran before the Esc.
    assert {p.pid for p in castor_processes(pi.proc.pid)} <= processes_mid_turn
    told = castor_status(root)
    assert run.name in json.dumps(told), told
    assert "Socket-2" in json.dumps(told) and "interrupted" in json.dumps(told), told
    assert error_toasts(pi, start) == []

    fake_llm.reply_text("BUILT-ONE", when="BUILDER-MATERIA")
    fake_llm.reply_text("BUILT-TWO", when="BUILDER-MATERIA")
    resumed = pi.command("/materia continue")
    done = wait_cast_end(pi, run)
    assert done[-1]["data"]["ok"] is True, done[-1]
    assert builder_requests_for(fake_llm, "ITEM-ONE") == 2, "the interrupted item runs again, once"
    assert builder_requests_for(fake_llm, "ITEM-TWO") == 1
    assert sum("USER-NEXT" in json.dumps(r["messages"][-1]) for r in fake_llm.log()) == 1, "the user's prompt ran once"
    assert error_toasts(pi, resumed) == [] and user >= 0
    assert "complete" in json.dumps(castor_status(root)), castor_status(root)


def test_esc_twice_during_a_retrieval_then_a_prompt_at_once(start_pi, castor_command, fake_llm, tmp_path):
    """Two RPC aborts in quick succession while castor answers a prompt's before_agent_start (a
    memory retrieval of 5 s), then the user's next prompt at once: the first prompt never reaches
    the model, the second is answered once (its retrieval queues behind the first's, in the same
    worker: it waits for it at most 2 s, then goes without memory context), and no extra process is
    left under Pi."""
    from .test_pi_castor_e2e import icarus_settings

    call_log = tmp_path / "icarus-calls.jsonl"
    controls = json.dumps({"hooks.pre_llm_call": {"sleep_ms": 5_000}})
    pi = start_pi(castor_command, settings=icarus_settings(tmp_path), timeout_ms=CALL_TIMEOUT_MS,
                  env={"ICARUS_REF_CALL_LOG": str(call_log), "ICARUS_REF_CONTROLS": controls})
    up(pi)

    def retrievals(phase: str) -> list[dict[str, Any]]:
        return [c for c in read_jsonl(call_log) if c["call"] == "hooks.pre_llm_call" and c["phase"] == phase]

    assert poll_until(lambda: any(c["call"] == "hooks.on_session_start" for c in read_jsonl(call_log)), timeout=30)
    before = {p.pid for p in castor_processes(pi.proc.pid)}
    begin = pi.mark()
    pi.send({"type": "prompt", "message": "FIRST-PROMPT about the zebra herd"})
    assert poll_until(lambda: retrievals("start"), timeout=15), "the retrieval never started"
    pi.request({"type": "abort"}, timeout=5)
    pi.request({"type": "abort"}, timeout=5)
    assert settled_after(pi, begin)["aborted"] is True
    pi.prompt("SECOND-PROMPT what now", timeout=30)
    last = [json.dumps(r["messages"][-1]) for r in fake_llm.log()]
    assert sum("SECOND-PROMPT" in m for m in last) == 1, last
    assert not any("FIRST-PROMPT" in m for m in last), "the stopped prompt reached the model"
    assert poll_until(lambda: len(retrievals("end")) == 2, timeout=15), "each prompt's retrieval ran once"
    assert len(retrievals("start")) == 2, retrievals("start")
    # Worker processes come and go with castor's pool; none is left beyond what ran before.
    assert poll_until(lambda: len(castor_processes(pi.proc.pid)) <= len(before), timeout=5), \
        [p.cmdline() for p in castor_processes(pi.proc.pid)]
    assert error_toasts(pi, begin) == []


def test_esc_while_a_utility_command_runs_then_a_prompt_at_once(start_pi, castor_command, fake_llm, tmp_path,
                                                               request):
    """An RPC abort (Esc) while a utility socket's command runs, and the user's next prompt at once:
    the prompt is answered while the command runs on (as the notice says), ``castor status`` says
    the cast still runs at that socket, and once the command ends the cast goes on: the command ran
    once, the next socket's turn once."""
    from .test_pi_cancel_moments import write_loadout

    root = tmp_path / "project"
    request.addfinalizer(lambda: (root / "go").touch())  # a failed test leaves no command waiting
    utility = {"type": "utility", "timeoutMs": 120000, "edges": [{"when": "always", "to": "Socket-2"}],
               "command": ["sh", "-c", "echo ran >> runs.log; while [ ! -e go ]; do sleep 0.1; done; echo UTIL-DONE"]}
    write_loadout(root, utility)
    pi = start_pi(castor_command, cwd=root, settings={"defaultProjectTrust": "always"}, timeout_ms=CALL_TIMEOUT_MS)
    up(pi)
    begin = pi.command("/materia cast build the thing")
    run = run_dir(root)
    assert poll_until(lambda: (root / "runs.log").exists(), timeout=20), "the utility never ran"
    esc = pi.mark()
    pi.request({"type": "abort"})
    pi.prompt("USER-DURING-UTILITY hello")
    pi.wait_ui("notify", lambda e: "does not stop Socket-1's command" in str(e.get("message")), start=esc, timeout=10)
    assert any("USER-DURING-UTILITY" in json.dumps(r["messages"][-1]) for r in fake_llm.log())
    told = json.dumps(castor_status(root))
    assert run.name in told and "Socket-1" in told and status(run) == "active", told
    fake_llm.reply_text("REVIEWED-OK", when="REVIEWER-MATERIA")
    (root / "go").touch()
    done = wait_cast_end(pi, run)
    assert done[-1]["data"]["ok"] is True, done[-1]
    assert (root / "runs.log").read_text() == "ran\n", "the utility's command ran once"
    assert len(requests_with(fake_llm, "REVIEWER-MATERIA")) == 1
    assert error_toasts(pi, begin) == []

"""``castor abort ID`` typed in another terminal, in another directory, while Pi runs the cast.

The cast's runtime is Pi's own ``castor serve``; the ``castor abort`` process cannot reach it, so it
leaves the request in the cast's run directory and waits for the holder to take it. Driven here as
a user meets it: ``castor status ID --cwd PROJECT`` names the abort to type, the abort says the cast
aborted within its wait, Pi shows the cast aborted, no further model request is made, and
``/materia recast`` in Pi resumes the cast to its end.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import psutil
import pytest

from castor.cli.materia import ABORT_LOCK, ABORT_WAIT_S
from tests.support.held_outcome import held_castor
from tests.support.waiting import poll_until

from .conftest import python_env, read_jsonl
from .pi_rpc import PiRpc
from .test_pi_castor_e2e import PLAN, fail_fast_on_error, project_with_loadout, up, wait_event

pytestmark = [pytest.mark.pi, pytest.mark.timeout(90)]

STALL_S = 30.0  # the builder's model call answers this late: only an abort ends it in time

BUILD = {
    "artifactDir": ".pi/pi-materia",
    "activeLoadout": "Plan-Build",
    "limits": {"maxSocketVisits": 5, "maxEdgeTraversals": 5},
    "materia": {
        "Planner": {"prompt": "PLANNER-MATERIA: produce a plan for the request as a JSON handoff.", "tools": "none"},
        "Builder": {"prompt": "BUILDER-MATERIA: build the result from the plan.", "tools": "none"},
    },
    "loadouts": {"Plan-Build": {"entry": "Socket-1", "sockets": {
        "Socket-1": {"type": "agent", "materia": "Planner", "parse": "json", "assign": {"plan": "$.summary"},
                     "edges": [{"when": "always", "to": "Socket-2"}]},
        "Socket-2": {"type": "agent", "materia": "Builder", "parse": "text",
                     "edges": [{"when": "always", "to": "end"}]},
    }}},
}


def castor_cli(*args: str, cwd: Path, timeout: float = 30.0) -> subprocess.CompletedProcess[str]:
    """``castor ARGS`` as a user types it in another terminal: its own process, its own directory."""
    env = {**os.environ, **python_env(), "HOME": str(cwd / "home")}
    return subprocess.run([sys.executable, "-m", "castor", *args], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=timeout)


def builder_requests(fake_llm: Any) -> list[dict[str, Any]]:
    return [r for r in fake_llm.log() if "BUILDER-MATERIA" in json.dumps(r["messages"])]


def a_cast_whose_builder_stalls(pi: PiRpc, fake_llm: Any, project: Path) -> tuple[int, Path]:
    """``/materia cast`` in Pi, returned once the builder's model call is under way (and stalls)."""
    fake_llm.reply_text(PLAN, when="PLANNER-MATERIA")
    fake_llm.reply_text("LATE-BUILD", when="BUILDER-MATERIA", delay=STALL_S)
    up(pi)
    start = pi.command("/materia cast build the thing")
    run_dir, _events, _ = wait_event(pi, project, lambda e: e.get("type") == "cast_start", start=start,
                                     what="cast_start")
    assert poll_until(lambda: bool(builder_requests(fake_llm)), timeout=20), f"no builder call; Pi: {pi.tail()}"
    fail_fast_on_error(pi, start)
    return start, run_dir


def test_castor_abort_from_another_terminal_stops_the_cast_pi_runs(start_pi, castor_command, fake_llm, tmp_path):
    project = project_with_loadout(tmp_path, BUILD)
    pi = start_pi(castor_command, cwd=project, settings={"defaultProjectTrust": "always"})
    start, run_dir = a_cast_whose_builder_stalls(pi, fake_llm, project)
    cast_id = run_dir.name
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()

    status = castor_cli("status", cast_id, "--cwd", str(project), cwd=elsewhere)
    said = status.stdout + status.stderr
    assert status.returncode == 0, said
    abort_line = f"castor abort {cast_id} --cwd {project}"
    assert abort_line in said, said

    requests_before = len(fake_llm.log())
    at = pi.mark()
    aborted = castor_cli(*abort_line.split()[1:], cwd=elsewhere)
    answered = time.time()
    told = aborted.stdout + aborted.stderr
    assert aborted.returncode == 0, told
    assert "aborted" in told and "already" not in told, told
    # It answered within its wait, counted from when the abort began -- it makes the cast's abort
    # lock as it does, just before it leaves its request -- not from the interpreter's start, which
    # on a loaded machine takes seconds of its own (at a load of 15 the whole command took over 6 s).
    took = answered - (run_dir / ABORT_LOCK).stat().st_mtime
    assert took < ABORT_WAIT_S + 1.0, f"the abort answered {took:.1f} s after it began"
    # The recast it names must work as typed: a cast Pi ran remembers no agent for the CLI, so the
    # line says what a CLI recast needs, and that /materia recast in Pi resumes it.
    assert "needs --agent" in told and "/materia recast" in told, told

    note = pi.wait_ui("notify", lambda e: "aborted" in str(e.get("message", "")) and cast_id in str(e.get("message")),
                      start=at, timeout=10)
    assert str(note["message"]).startswith("pi-materia cast"), note
    # Pi's user did not abort it: the note says it came from outside and how to go on here, as
    # castor status and the abort itself say
    assert "from outside this session (castor abort)" in note["message"], note
    assert note["message"].endswith(f"Recast it with /materia recast {cast_id}."), note
    pi.wait_for(lambda e: e.get("type") == "agent_settled", start=at, timeout=10)
    state = json.loads((run_dir / "state.json").read_text())["state"]
    assert (state["active"], state["aborted"], state["failed_reason"]) == (False, True, "aborted by user"), state
    again = castor_cli("status", cast_id, "--cwd", str(project), cwd=elsewhere)
    assert "aborted" in again.stdout + again.stderr, again
    # Nothing keeps running: no further model request, Pi idle.
    time.sleep(1.0)  # a run that was not stopped would ask again well within this
    assert len(fake_llm.log()) == requests_before
    assert pi.request({"type": "get_state"})["data"]["isStreaming"] is False
    assert not (run_dir / "abort.request").exists()

    fake_llm.reply_text("WRITTEN-BUILD", when="BUILDER-MATERIA")
    recast = pi.command("/materia recast")
    _run, events, _ = wait_event(pi, project, lambda e: e.get("type") == "cast_end" and e["data"].get("ok") is True,
                                 start=recast, what="the recast's cast_end")
    types = [e["type"] for e in events]
    assert "cast_recast" in types and types[-1] == "cast_end", types
    errors = [e.get("message") for e in pi.ui("notify", start=start) if e.get("notifyType") == "error"]
    assert errors == [], errors
    assert [e["type"] for e in read_jsonl(run_dir / "events.jsonl")][-1] == "cast_end"


#: Pi's ``castor serve --stdio`` with a utility's outcome held before it is saved (see held_castor).
HELD_SERVE = held_castor("serve", "--stdio")


def deploy_then_build(runs: Path) -> dict[str, Any]:
    """A utility socket whose command appends a line to ``runs`` (its side effect), then the builder."""
    return {
        "artifactDir": ".pi/pi-materia",
        "activeLoadout": "Deploy-Build",
        "materia": {"Builder": {"prompt": "BUILDER-MATERIA: build the result from the deploy.", "tools": "none"}},
        "loadouts": {"Deploy-Build": {"entry": "Socket-1", "sockets": {
            "Socket-1": {"type": "utility", "command": ["sh", "-c", f"echo run >> '{runs}'; echo deployed"],
                         "edges": [{"when": "always", "to": "Socket-2"}]},
            "Socket-2": {"type": "agent", "materia": "Builder", "parse": "text",
                         "edges": [{"when": "always", "to": "end"}]},
        }}},
    }


def test_a_command_that_ended_before_pis_castor_was_killed_9_runs_once_across_the_recast(
    start_pi, castor_command, fake_llm, tmp_path
):
    runs = tmp_path / "runs.txt"
    project = project_with_loadout(tmp_path, deploy_then_build(runs))
    held = tmp_path / "held"
    pi = start_pi([sys.executable, "-c", HELD_SERVE], cwd=project, settings={"defaultProjectTrust": "always"},
                  env={"HELD": str(held)})
    up(pi)
    pi.command("/materia cast deploy it")
    assert poll_until(held.exists, timeout=30), f"the command never ended; Pi: {pi.tail()}"
    assert runs.read_text().splitlines() == ["run"]
    [runtime] = [p for p in psutil.Process(pi.proc.pid).children(recursive=True) if "-c" in p.cmdline()
                 and "HELD" in " ".join(p.cmdline())]
    runtime.send_signal(signal.SIGKILL)
    runtime.wait(10)
    [run_dir] = [p for p in (project / ".pi" / "pi-materia").iterdir() if p.is_dir()]
    saved = json.loads((run_dir / "state.json").read_text())["state"]
    assert saved["pending"]["kind"] == "utility" and saved["active"] is True  # its outcome was never saved
    pi.close()

    fake_llm.reply_text("WRITTEN-BUILD", when="BUILDER-MATERIA")
    again = start_pi(castor_command, cwd=project, settings={"defaultProjectTrust": "always"})
    up(again)
    recast = again.command("/materia recast")
    _run, events, _ = wait_event(again, project, lambda e: e.get("type") == "cast_end" and e["data"].get("ok") is True,
                                 start=recast, what="the recast's cast_end", timeout=40)
    assert runs.read_text().splitlines() == ["run"]  # exactly once: the recast took its recorded outcome
    ended = json.loads((run_dir / "state.json").read_text())["state"]
    assert ended["active"] is False and ended["phase"] == "complete", ended
    assert (run_dir / "sockets" / "Socket-1" / "1.md").read_text().strip() == "deployed"
    assert builder_requests(fake_llm), "the builder never ran"
    errors = [e.get("message") for e in again.ui("notify", start=recast) if e.get("notifyType") == "error"]
    assert errors == [], errors


def test_castor_abort_from_another_terminal_stops_the_cast_pis_terminal_ui_runs(start_tty, castor_command, fake_llm,
                                                                                tmp_path):
    project = project_with_loadout(tmp_path, BUILD)
    fake_llm.reply_text(PLAN, when="PLANNER-MATERIA")
    fake_llm.reply_text("LATE-BUILD", when="BUILDER-MATERIA", delay=STALL_S)
    pi = start_tty(castor_command, settings={"defaultProjectTrust": "always"})
    assert poll_until(lambda: "castor: up" in pi.screen_tail(200_000), timeout=30), pi.screen_tail()
    pi.type("/materia cast build the thing")
    assert poll_until(lambda: bool(builder_requests(fake_llm)), timeout=30), f"no builder call: {pi.screen_tail()!r}"
    [run_dir] = [p for p in (project / ".pi" / "pi-materia").iterdir() if p.is_dir()]
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    status = castor_cli("status", run_dir.name, "--cwd", str(project), cwd=elsewhere)
    abort_line = f"castor abort {run_dir.name} --cwd {project}"
    assert abort_line in status.stdout + status.stderr, status

    requests_before = len(fake_llm.log())
    aborted = castor_cli(*abort_line.split()[1:], cwd=elsewhere)
    assert aborted.returncode == 0 and "aborted" in aborted.stdout, aborted
    shown = f"pi-materia cast {run_dir.name} aborted"
    assert poll_until(lambda: shown in pi.screen_tail(200_000), timeout=10), pi.screen_tail()
    state = json.loads((run_dir / "state.json").read_text())["state"]
    assert (state["active"], state["aborted"]) == (False, True), state
    time.sleep(1.0)  # a run that was not stopped would ask again well within this
    assert len(fake_llm.log()) == requests_before

    fake_llm.reply_text("WRITTEN-BUILD", when="BUILDER-MATERIA")
    pi.type("/materia recast ")  # the trailing space closes Pi's completion list

    def completed() -> bool:
        ends = [e for e in read_jsonl(run_dir / "events.jsonl") if e["type"] == "cast_end"]
        return bool(ends) and ends[-1]["data"].get("ok") is True

    assert poll_until(completed, timeout=30), pi.screen_tail()


def test_castor_abort_of_a_cast_whose_pi_is_gone_names_what_its_recast_needs(start_pi, castor_command, fake_llm,
                                                                             tmp_path):
    """Pi (and its runtime) gone mid-cast, the cast held by no runtime: ``castor abort`` ends it
    itself, and the recast it names says what it needs (no agent is remembered for a cast Pi ran)."""
    project = project_with_loadout(tmp_path, BUILD)
    pi = start_pi(castor_command, cwd=project, settings={"defaultProjectTrust": "always"})
    _start, run_dir = a_cast_whose_builder_stalls(pi, fake_llm, project)
    os.killpg(pi.proc.pid, signal.SIGKILL)
    pi.proc.wait(10)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    aborted = castor_cli("abort", run_dir.name, "--cwd", str(project), cwd=elsewhere)
    told = aborted.stdout + aborted.stderr
    assert aborted.returncode == 0 and f"pi-materia cast {run_dir.name} aborted" in told, told
    assert "needs --agent" in told and "/materia recast" in told, told
    state = json.loads((run_dir / "state.json").read_text())["state"]
    assert (state["active"], state["aborted"]) == (False, True), state


def _cmdline(process: psutil.Process) -> list[str]:
    """``process``'s command line; empty for one that has ended (a zombie, gone)."""
    try:
        return process.cmdline()
    except psutil.Error:
        return []


def test_a_command_still_running_when_pis_castor_was_killed_9_runs_again_and_pi_says_so(
    start_pi, castor_command, fake_llm, tmp_path
):
    """The command had started and not ended when Pi's ``castor serve`` was killed ``-9``: a new
    Pi session's ``/materia recast`` runs it again from the start (after killing the old run) and
    Pi shows a warning naming the socket and the command; the cast completes."""
    runs = tmp_path / "runs.txt"
    again_mark = tmp_path / "again"
    config = deploy_then_build(runs)
    config["loadouts"]["Deploy-Build"]["sockets"]["Socket-1"]["command"] = [
        "sh", "-c", f"echo run >> '{runs}'; if [ -f '{again_mark}' ]; then echo deployed; exit 0; fi; "
                    f"touch '{again_mark}'; sleep 300"]
    config["loadouts"]["Deploy-Build"]["sockets"]["Socket-1"]["timeoutMs"] = 600_000
    project = project_with_loadout(tmp_path, config)
    pi = start_pi(castor_command, cwd=project, settings={"defaultProjectTrust": "always"})
    up(pi)
    pi.command("/materia cast deploy it")
    assert poll_until(again_mark.exists, timeout=30), f"the command never started; Pi: {pi.tail()}"
    [runtime] = [p for p in psutil.Process(pi.proc.pid).children(recursive=True)
                 if _cmdline(p)[1:4] == ["-m", "castor", "serve"]]  # castor_serve.py execs it
    runtime.send_signal(signal.SIGKILL)  # mid-command: started, not ended
    runtime.wait(10)
    [run_dir] = [p for p in (project / ".pi" / "pi-materia").iterdir() if p.is_dir()]
    pi.close()

    fake_llm.reply_text("WRITTEN-BUILD", when="BUILDER-MATERIA")
    again = start_pi(castor_command, cwd=project, settings={"defaultProjectTrust": "always"})
    up(again)
    recast = again.command("/materia recast")
    wait_event(again, project, lambda e: e.get("type") == "cast_end" and e["data"].get("ok") is True,
               start=recast, what="the recast's cast_end", timeout=40)
    assert runs.read_text().splitlines() == ["run", "run"]  # it ran again, from the start
    warned = [e.get("message") for e in again.ui("notify", start=recast)
              if "was interrupted before it ended" in str(e.get("message"))]
    assert warned == ['Utility command for socket "Socket-1" was interrupted before it ended (its runtime stopped) '
                      'and runs again from the start: "sh" "-c" ' + json.dumps(config["loadouts"]["Deploy-Build"]
                                                                              ["sockets"]["Socket-1"]["command"][2])
                      ], again.ui("notify", start=recast)
    ended = json.loads((run_dir / "state.json").read_text())["state"]
    assert ended["active"] is False and ended["phase"] == "complete", ended


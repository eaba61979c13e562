"""Cancelling a cast under real Pi at the moments the other cancellation tests do not reach.

Real Pi in RPC mode with the extension, the real castor runtime and the FAKE model (see
test_pi_cancellation.py for the shared shape). Each test stops the cast at one moment -- while a
tool call runs, while a utility socket's command runs, twice in a row, after the cast ended, with
Pi killed outright -- and checks what a user sees: the stopped turn is never a socket's output,
the cast ends or pauses as documented and can go on, the footer is right, no process is left
behind, and the next prompt is answered at once.
"""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path
from typing import Any

import pytest

from tests.support.waiting import poll_until, wait_for

from .conftest import read_jsonl
from .pi_rpc import PiRpc
from .pi_tty import ESC
from .test_pi_cancellation import (
    CALL_TIMEOUT_MS,
    STALL_S,
    completes,
    continue_completes_the_review,
    error_toasts,
    esc_mid_stream,
    events,
    requests_with,
    run_dir,
    settled_after,
    status,
    up,
    wait_cast_end,
    wait_request,
)
from .test_pi_castor_e2e import icarus_settings

pytestmark = [pytest.mark.pi, pytest.mark.timeout(120)]


def write_loadout(root: Path, entry: dict[str, Any]) -> Path:
    doc = {
        "artifactDir": ".pi/pi-materia",
        "activeLoadout": "L",
        "limits": {"maxSocketVisits": 5, "maxEdgeTraversals": 5},
        "materia": {
            "Builder": {"prompt": "BUILDER-MATERIA: build what the request asks for.", "tools": "coding"},
            "Reviewer": {"prompt": "REVIEWER-MATERIA: review the build.", "tools": "none"},
        },
        "loadouts": {"L": {"entry": "Socket-1", "sockets": {
            "Socket-1": entry,
            "Socket-2": {"type": "agent", "materia": "Reviewer", "parse": "text",
                         "edges": [{"when": "always", "to": "end"}]},
        }}},
    }
    (root / ".pi").mkdir(parents=True, exist_ok=True)
    (root / ".pi" / "pi-materia.json").write_text(json.dumps(doc))
    return root


BUILDER = {"type": "agent", "materia": "Builder", "parse": "text", "edges": [{"when": "always", "to": "Socket-2"}]}


def processes_with(marker: str) -> list[int]:
    """Pids of live processes whose command line holds ``marker`` (read from /proc)."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                cmdline = f.read().replace(b"\0", b" ").decode(errors="replace")
            with open(f"/proc/{entry}/stat") as f:
                state = f.read().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if marker in cmdline and state != "Z" and "pytest" not in cmdline:
            found.append(int(entry))
    return found


def children_of(pid: int) -> list[int]:
    """Pids of the live processes whose parent is ``pid``."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid and fields[0] != "Z":
            found.append(int(entry))
    return found


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def start(start_pi, castor_command, root: Path) -> PiRpc:
    pi = start_pi(castor_command, cwd=root, settings={"defaultProjectTrust": "always"}, timeout_ms=CALL_TIMEOUT_MS)
    up(pi)
    return pi


def footer(pi: PiRpc, start: int = 0) -> dict[str, str | None]:
    """The materia footer entries as the last setStatus left them."""
    out: dict[str, str | None] = {}
    for e in pi.ui("setStatus", start=start):
        key = str(e.get("statusKey"))
        if key.startswith("materia"):
            out[key] = e.get("statusText")
    return out


def next_prompt_answered(pi: PiRpc, fake_llm) -> None:
    fake_llm.reply_text("PLAIN-ANSWER", when="USER-AFTER")
    t0 = time.monotonic()
    pi.prompt("USER-AFTER hello", timeout=20)
    assert requests_with(fake_llm, "USER-AFTER"), "the next prompt reached no model"
    assert time.monotonic() - t0 < 10


def test_esc_while_a_tool_call_runs_stops_the_tool_and_continue_completes(start_pi, castor_command, fake_llm,
                                                                          tmp_path):
    root = write_loadout(tmp_path / "project", BUILDER)
    pi = start(start_pi, castor_command, root)
    fake_llm.reply_tool_call("bash", {"command": "sleep 41.5 && echo TOOL-DONE"}, when="BUILDER-MATERIA")
    begin = pi.command("/materia cast build the thing")
    run = run_dir(root)
    assert poll_until(lambda: processes_with("sleep 41.5"), timeout=20), f"the tool never ran: {pi.tail()}"
    esc = pi.mark()
    pi.request({"type": "abort"})
    assert settled_after(pi, esc)["aborted"] is True
    assert poll_until(lambda: not processes_with("sleep 41.5"), timeout=5), "the tool's process outlived the Esc"
    assert poll_until(lambda: any(e["type"] == "turn_interrupted" for e in events(run)), timeout=5), \
        [e["type"] for e in events(run)]
    assert completes(run) == [] and status(run) == "active"
    assert requests_with(fake_llm, "REVIEWER-MATERIA") == []
    pi.wait_ui("setStatus", lambda e: str(e.get("statusText", "")).startswith("materia: interrupted at Socket-1"),
               start=esc, timeout=5)
    assert error_toasts(pi, begin) == []
    fake_llm.reply_text("BUILT-AFTER-TOOL", when="BUILDER-MATERIA")
    fake_llm.reply_text("REVIEWED-OK", when="REVIEWER-MATERIA")
    cont = pi.command("/materia continue")
    done = wait_cast_end(pi, run)
    assert done[-1]["data"]["ok"] is True, done[-1]
    assert completes(run) == ["Socket-1", "Socket-2"]
    assert error_toasts(pi, cont) == []


def test_materia_abort_while_a_utility_socket_runs_kills_its_command(start_pi, castor_command, fake_llm, tmp_path):
    utility = {"type": "utility", "command": ["sh", "-c", "sleep 42.25; echo UTIL-DONE"], "timeoutMs": 120000,
               "edges": [{"when": "always", "to": "Socket-2"}]}
    root = write_loadout(tmp_path / "project", utility)
    pi = start(start_pi, castor_command, root)
    begin = pi.command("/materia cast build the thing")
    run = run_dir(root)
    assert poll_until(lambda: processes_with("sleep 42.25"), timeout=20), "the utility never ran"
    # Esc (Pi's abort) while no run streams does nothing to the cast: the utility keeps running,
    # and the user is told so and what stops it (it used to say nothing), once per command.
    esc = pi.mark()
    pi.request({"type": "abort"})
    said = pi.wait_ui("notify", lambda e: "does not stop" in str(e.get("message")), start=esc, timeout=10)
    assert str(said["message"]).startswith("castor: abort does not stop Socket-1's command (a utility socket)"), said
    assert "/materia abort stops the cast" in str(said["message"]), said
    pi.request({"type": "abort"})
    # The status command's answer comes after the second abort's question on castor's connection.
    pi.wait_ui("notify", lambda e: "Socket-1" in str(e.get("message")), start=pi.command("/materia status"), timeout=10)
    assert len([e for e in pi.ui("notify", start=esc) if "does not stop" in str(e.get("message"))]) == 1
    assert processes_with("sleep 42.25") and status(run) == "active"
    t0 = time.monotonic()
    cmd = pi.command("/materia abort")
    assert poll_until(lambda: status(run) == "aborted", timeout=5), status(run)
    assert time.monotonic() - t0 < 2.0
    pi.wait_ui("notify", lambda e: "aborted" in str(e.get("message")), start=cmd, timeout=5)
    assert poll_until(lambda: not processes_with("sleep 42.25"), timeout=5), "the utility's command outlived the abort"
    assert poll_until(lambda: any(e["type"] == "cast_end" for e in events(run)), timeout=5)
    assert requests_with(fake_llm, "REVIEWER-MATERIA") == []
    assert error_toasts(pi, begin) == []
    assert poll_until(lambda: all(v in (None, "") for v in footer(pi).values()), timeout=5), footer(pi)
    next_prompt_answered(pi, fake_llm)


def test_abort_twice_quickly_mid_turn_then_continue(start_pi, castor_command, fake_llm, tmp_path):
    root = write_loadout(tmp_path / "project", BUILDER)
    pi = start(start_pi, castor_command, root)
    fake_llm.reply_text("BUILT never sent", when="BUILDER-MATERIA", delay=STALL_S)
    begin = pi.command("/materia cast build the thing")
    run = run_dir(root)
    wait_request(fake_llm, "BUILDER-MATERIA")
    esc = pi.mark()
    pi.send({"type": "abort"})
    pi.send({"type": "abort"})
    assert settled_after(pi, esc)["aborted"] is True
    assert poll_until(lambda: any(e["type"] == "turn_interrupted" for e in events(run)), timeout=5)
    assert completes(run) == []
    fake_llm.reply_text("BUILT-OK", when="BUILDER-MATERIA")
    fake_llm.reply_text("REVIEWED-OK", when="REVIEWER-MATERIA")
    pi.command("/materia continue")
    done = wait_cast_end(pi, run)
    assert done[-1]["data"]["ok"] is True
    assert error_toasts(pi, begin) == []


def test_materia_abort_twice_and_after_the_end(start_pi, castor_command, fake_llm, tmp_path):
    root = write_loadout(tmp_path / "project", BUILDER)
    pi = start(start_pi, castor_command, root)
    fake_llm.reply_text("BUILT never sent", when="BUILDER-MATERIA", delay=STALL_S)
    begin = pi.command("/materia cast build the thing")
    run = run_dir(root)
    wait_request(fake_llm, "BUILDER-MATERIA")
    first = pi.mark()
    pi.send({"type": "prompt", "message": "/materia abort"})
    pi.send({"type": "prompt", "message": "/materia abort"})
    assert poll_until(lambda: status(run) == "aborted", timeout=5)
    assert poll_until(lambda: len(pi.ui("notify", start=first)) >= 2, timeout=5), pi.tail()
    notes = [str(e.get("message")) for e in pi.ui("notify", start=first)]
    assert error_toasts(pi, begin) == [], notes
    assert any("aborted" in n for n in notes), notes
    # After the end: nothing to abort is a notice, Esc is harmless, and Pi answers at once.
    after = pi.command("/materia abort")
    note = pi.wait_ui("notify", start=after, timeout=5)
    assert note.get("notifyType") == "info" and "already aborted" in str(note.get("message")), note
    pi.request({"type": "abort"})
    next_prompt_answered(pi, fake_llm)
    assert error_toasts(pi, begin) == []
    # the footer is cleared by a setStatus on Pi's UI channel, not with the status on disk: waited for
    assert poll_until(lambda: all(v in (None, "") for v in footer(pi).values()), timeout=15), footer(pi)


@pytest.mark.parametrize("moment", ["turn", "utility"])
def test_pi_killed_mid_cast_leaves_no_process_behind(start_pi, castor_command, fake_llm, tmp_path, moment):
    if moment == "turn":
        root = write_loadout(tmp_path / "project", BUILDER)
        fake_llm.reply_text("BUILT never sent", when="BUILDER-MATERIA", delay=STALL_S)
    else:
        root = write_loadout(tmp_path / "project", {
            "type": "utility", "command": ["sh", "-c", "sleep 43.75; echo UTIL-DONE"], "timeoutMs": 120000,
            "edges": [{"when": "always", "to": "Socket-2"}]})
    pi = start(start_pi, castor_command, root)
    pi.command("/materia cast build the thing")
    run = run_dir(root)
    if moment == "turn":
        wait_request(fake_llm, "BUILDER-MATERIA")
    else:
        assert poll_until(lambda: processes_with("sleep 43.75"), timeout=20)
    castor_pids = children_of(pi.proc.pid)
    assert castor_pids, "Pi runs castor as its child"
    os.kill(pi.proc.pid, signal.SIGKILL)
    pi.proc.wait(10)
    assert poll_until(lambda: not any(alive(p) for p in castor_pids), timeout=10), "castor outlived Pi"
    assert poll_until(lambda: not processes_with("sleep 43.75"), timeout=10), "the utility outlived Pi and castor"
    assert completes(run) == []



def pi_whose_memory_retrievals_take_20_s(start_pi, castor_command, tmp_path):
    """Pi with castor up and Icarus' session started, each memory retrieval (``hooks.pre_llm_call``)
    taking 20 s; with it, the retrievals that reached a phase (``start``/``end``) so far."""
    call_log = tmp_path / "icarus-calls.jsonl"
    controls = json.dumps({"hooks.pre_llm_call": {"sleep_ms": 20_000}})
    pi = start_pi(castor_command, settings=icarus_settings(tmp_path), timeout_ms=CALL_TIMEOUT_MS,
                  env={"ICARUS_REF_CALL_LOG": str(call_log), "ICARUS_REF_CONTROLS": controls})
    up(pi)

    def retrievals(phase: str) -> list[dict[str, Any]]:
        return [c for c in read_jsonl(call_log) if c["call"] == "hooks.pre_llm_call" and c["phase"] == phase]

    wait_for(lambda: any(c["call"] == "hooks.on_session_start" for c in read_jsonl(call_log)), timeout=30,
             what="Icarus' session start")
    return pi, retrievals


def test_rpc_abort_during_a_slow_retrieval_ends_the_run_at_once(start_pi, castor_command, fake_llm, tmp_path):
    """An RPC client's abort (its Esc) while castor answers a prompt's before_agent_start (a memory
    retrieval of 20 s): Pi's abort waited for the hook, the hook for the retrieval. The wait now
    ends at the abort: the run stops before its first model request, and the next prompt runs."""
    pi, retrievals = pi_whose_memory_retrievals_take_20_s(start_pi, castor_command, tmp_path)
    begin = pi.mark()
    pi.send({"type": "prompt", "message": "tell me about the zebra herd"})
    wait_for(lambda: retrievals("start"), timeout=15, what="the retrieval running")
    t0 = time.monotonic()
    pi.request({"type": "abort"}, timeout=30)
    settled = settled_after(pi, begin)
    took = time.monotonic() - t0
    assert took < 3.0, f"the abort took {took:.1f} s (the retrieval takes 20 s)"
    assert settled["aborted"] is True
    assert not fake_llm.log(), "the aborted run made a model request"
    note = pi.wait_ui("notify", lambda e: "stopped waiting" in str(e.get("message")), start=begin, timeout=5)
    assert "abort" in str(note.get("message")), note
    assert not retrievals("end"), "the retrieval cannot have ended yet"


def test_esc_during_a_slow_fabric_tool_call_ends_the_run_at_once_and_the_write_stands(start_pi, castor_command,
                                                                                      fake_llm, tmp_path):
    """An abort (the RPC client's Esc) while a Fabric tool castor runs is slow (the memory backend
    takes 8 s to write): the tool's wait ends at once and the run stops; castor's call runs on, so
    the write lands; the next prompt is answered once the worker is free."""
    call_log = tmp_path / "icarus-calls.jsonl"
    controls = json.dumps({"tools.fabric_write": {"sleep_ms": 8000}})
    pi = start_pi(castor_command, settings=icarus_settings(tmp_path), timeout_ms=CALL_TIMEOUT_MS,
                  env={"ICARUS_REF_CALL_LOG": str(call_log), "ICARUS_REF_CONTROLS": controls})
    up(pi)

    def writes(phase: str) -> list[dict[str, Any]]:
        return [c for c in read_jsonl(call_log) if c["call"] == "tools.fabric_write" and c["phase"] == phase]

    fake_llm.reply_tool_call("fabric_write", {"type": "note", "summary": "SLOW-WRITE", "content": "kept"})
    begin = pi.mark()
    pi.send({"type": "prompt", "message": "save a note"})
    wait_for(lambda: writes("start"), timeout=20, what="the tool call reaching the backend")
    t0 = time.monotonic()
    pi.request({"type": "abort"}, timeout=30)
    settled = settled_after(pi, begin)
    assert time.monotonic() - t0 < 3.0
    assert settled["aborted"] is True
    assert len(fake_llm.log()) == 1, "nothing after the tool call reached the model"
    assert error_toasts(pi, begin) == []
    wait_for(lambda: writes("end"), timeout=15, what="the write running to its end")
    fake_llm.reply_text("PLAIN-ANSWER", when="USER-AFTER")
    pi.prompt("USER-AFTER hello", timeout=30)
    assert requests_with(fake_llm, "USER-AFTER")


def test_esc_while_the_next_sockets_turn_waits_behind_the_users_run_interrupts_the_cast(start_pi, castor_command,
                                                                                        fake_llm, tmp_path):
    """A utility socket ends while the user's own prompt streams: castor asks for the next socket's
    turn, which Pi queues behind that run. The user aborts their run; the queued turn never runs.
    castor was never told and waited for it for ever (footer 'materia: Reviewer (Socket-2)', continue
    refused 'already awaiting'). Now the cast is interrupted at that socket and continue completes it."""
    root = tmp_path / "project"
    gate = root / "go"
    write_loadout(root, {"type": "utility", "command": ["sh", "-c", f"while [ ! -e {gate} ]; do sleep 0.05; done"],
                         "timeoutMs": 60000, "edges": [{"when": "always", "to": "Socket-2"}]})
    pi = start(start_pi, castor_command, root)
    begin = pi.command("/materia cast build the thing")
    run = run_dir(root)
    fake_llm.reply_text("USER-ANSWER never sent", when="USER-BUSY", delay=STALL_S)
    pi.send({"type": "prompt", "message": "USER-BUSY what is going on"})
    wait_request(fake_llm, "USER-BUSY")
    gate.touch()  # the utility ends: castor asks for Socket-2's turn while the user's run streams
    assert poll_until(lambda: "queued as a follow-up" in pi.stderr(), timeout=15), pi.stderr()[-2000:]
    esc = pi.mark()
    pi.request({"type": "abort"})
    settled_after(pi, esc)
    assert poll_until(lambda: any(e["type"] == "turn_interrupted" for e in events(run)), timeout=5), \
        [e["type"] for e in events(run)]
    assert status(run) == "active" and completes(run) == ["Socket-1"]
    assert requests_with(fake_llm, "REVIEWER-MATERIA") == []
    pi.wait_ui("setStatus", lambda e: str(e.get("statusText", "")).startswith("materia: interrupted at Socket-2"),
               start=esc, timeout=5)
    assert error_toasts(pi, begin) == []
    continue_completes_the_review(pi, run, fake_llm)


def test_pi_terminated_mid_turn_leaves_the_cast_resumable_not_interrupted(start_pi, castor_command, fake_llm,
                                                                          tmp_path):
    """SIGTERM (a process manager's stop) mid-turn: Pi aborts the run and shuts the session down.
    That abort is not the user's Esc: the cast is not interrupted but left as the harness left it
    (orphaned, resumable), and nothing of castor's stays behind."""
    root = write_loadout(tmp_path / "project", BUILDER)
    pi = start(start_pi, castor_command, root)
    fake_llm.reply_text("BUILT never sent", when="BUILDER-MATERIA", delay=STALL_S)
    pi.command("/materia cast build the thing")
    run = run_dir(root)
    wait_request(fake_llm, "BUILDER-MATERIA")
    castor_pids = children_of(pi.proc.pid)
    t0 = time.monotonic()
    pi.proc.send_signal(signal.SIGTERM)
    pi.proc.wait(15)
    assert time.monotonic() - t0 < 6
    assert poll_until(lambda: not any(alive(p) for p in castor_pids), timeout=10), "castor outlived Pi"
    assert not any(e["type"] == "turn_interrupted" for e in events(run)), [e["type"] for e in events(run)]
    assert status(run) == "active" and completes(run) == []


def cast_in_the_terminal_behind_a_gate(start_tty, castor_command, root: Path, gate: str,
                                       marker: str = "") -> tuple[Any, Path]:
    """The interactive Pi, castor up, and a cast started whose Socket-1 is a utility command that
    runs until the file ``gate`` (in the project) exists; ``marker`` tags the command's line."""
    command = f"while [ ! -e {gate} ]; do sleep 0.05; done" + (f" # {marker}" if marker else "")
    write_loadout(root, {"type": "utility", "command": ["sh", "-c", command],
                         "timeoutMs": 60000, "edges": [{"when": "always", "to": "Socket-2"}]})
    pi = start_tty(castor_command, settings={"defaultProjectTrust": "always"})
    wait_for(lambda: "castor: up" in pi.screen_tail(100_000), timeout=30,
             what=f"castor up; Pi drew: {pi.screen_tail()!r}")
    pi.type("/materia cast build the thing")
    return pi, run_dir(root)

def test_esc_in_the_terminal_while_the_next_sockets_turn_waits_behind_the_users_run(start_tty, castor_command,
                                                                                    fake_llm, tmp_path):
    """The same in Pi's terminal UI, whose Esc also drops Pi's follow-up queue: the cast is
    interrupted at Socket-2 (the footer says so) and /materia continue completes it."""
    root = tmp_path / "project"
    gate = root / "go"
    pi, run = cast_in_the_terminal_behind_a_gate(start_tty, castor_command, root, "go")
    fake_llm.reply_text("USER-ANSWER never sent", when="USER-BUSY", delay=STALL_S)
    pi.type("USER-BUSY what is going on")
    wait_request(fake_llm, "USER-BUSY")
    gate.touch()
    # castor's footer for the turn comes just before the turn itself: once drawn, Pi holds the turn.
    wait_for(lambda: "materia: Reviewer (Socket-2)" in pi.screen_tail(100_000), timeout=15,
             what=f"Socket-2's turn asked for; Pi drew: {pi.screen_tail()!r}")
    pi.press(ESC)
    assert poll_until(lambda: any(e["type"] == "turn_interrupted" for e in events(run)), timeout=5), \
        [e["type"] for e in events(run)]
    wait_for(lambda: "interrupted at Socket-2" in pi.screen_tail(100_000), timeout=5,
             what=f"the footer saying so; Pi drew: {pi.screen_tail()!r}")
    assert requests_with(fake_llm, "REVIEWER-MATERIA") == []
    fake_llm.reply_text("REVIEWED-OK", when="REVIEWER-MATERIA")
    pi.type("/materia continue ")  # the trailing space closes Pi's completion list
    wait_for(lambda: any(e["type"] == "cast_end" for e in events(run)), timeout=20,
             what=f"the cast's end; Pi drew: {pi.screen_tail()!r}")
    done = events(run)
    assert done[-1]["data"]["ok"] is True, done[-1]
    assert len(requests_with(fake_llm, "REVIEWER-MATERIA")) == 1


def test_esc_in_the_terminal_while_a_utility_command_runs_says_what_stops_it(start_tty, castor_command, fake_llm,
                                                                             tmp_path, request):
    """An Esc in Pi's terminal while a utility socket's command runs finds no run to stop: it said
    nothing and the command ran on. The command still runs on (as pi-materia's), and the user is
    told so and what stops it; /materia abort does, and /materia recast runs the command again."""
    root = tmp_path / "project"
    gate = root / "go-utility"  # relative in the command (it runs in the project): no "pytest" in its line
    marker = f"utility-{os.getpid()}-{time.monotonic_ns()}"  # this test's command alone
    request.addfinalizer(gate.touch)  # a failed test's kill -9 of Pi and castor leaves the command: it ends
    pi, run = cast_in_the_terminal_behind_a_gate(start_tty, castor_command, root, "go-utility", marker)
    wait_for(lambda: processes_with(marker), timeout=20, what="the utility's command")
    wait_for(lambda: "materia: utility (Socket-1)" in pi.screen_tail(100_000), timeout=10,
             what=f"the footer naming the utility; Pi drew: {pi.screen_tail()!r}")
    pi.press(ESC)
    wait_for(lambda: "does not stop Socket-1's command" in pi.screen_tail(100_000), timeout=10,
             what=f"the notice; Pi drew: {pi.screen_tail()!r}")
    assert processes_with(marker) and status(run) == "active"
    pi.type("/materia abort ")  # the trailing space closes Pi's completion list
    wait_for(lambda: status(run) == "aborted" and not processes_with(marker), timeout=10,
             what=f"the abort; Pi drew: {pi.screen_tail()!r}")
    pi.type(f"/materia recast {run.name} ")  # named: a bare "recast " opens the list of ids, which takes the Enter
    wait_for(lambda: processes_with(marker), timeout=20, what=f"the command run again; Pi drew: {pi.screen_tail()!r}")
    fake_llm.reply_text("REVIEWED-OK", when="REVIEWER-MATERIA")
    gate.touch()
    ends = lambda: [e["data"] for e in events(run) if e["type"] == "cast_end"]  # noqa: E731
    wait_for(lambda: len(ends()) == 2, timeout=20, what=f"the recast's end; Pi drew: {pi.screen_tail()!r}")
    assert ends()[0].get("aborted") is True and ends()[1]["ok"] is True, ends()


def test_castor_terminated_while_a_utility_command_runs_ends_it_and_continue_runs_it_again(
        start_pi, castor_command, fake_llm, tmp_path):
    """SIGTERM to the castor Pi runs (a process manager's stop) while a utility socket's command
    runs: the runtime shuts down and ends the command's tree, the cast stays resumable (active,
    nothing of the command kept), and the next ``/materia continue`` -- which starts castor again --
    runs the command again and the cast to its end: the same outcome as Ctrl-C to ``castor cast``."""
    utility = {"type": "utility", "timeoutMs": 120000, "edges": [{"when": "always", "to": "Socket-2"}],
               "command": ["sh", "-c", "if [ -e ran ]; then echo UTIL-DONE; else touch ran; sleep 44.25; fi"]}
    root = write_loadout(tmp_path / "project", utility)
    pi = start(start_pi, castor_command, root)
    fake_llm.reply_text("REVIEWED", when="REVIEWER-MATERIA")
    pi.command("/materia cast build the thing")
    run = run_dir(root)
    try:
        assert poll_until(lambda: processes_with("sleep 44.25"), timeout=20), "the utility never ran"
        castor_pids = children_of(pi.proc.pid)
        assert castor_pids, "Pi runs castor as its child"
        for pid in castor_pids:
            os.kill(pid, signal.SIGTERM)
        assert poll_until(lambda: not any(alive(p) for p in castor_pids), timeout=15), "castor outlived its SIGTERM"
        # The extension SIGKILLed castor the moment castor closed its end, before its shutdown had
        # ended the command: a build went on with no owner, and the continue below ran it again beside it.
        assert poll_until(lambda: not processes_with("sleep 44.25"), timeout=10), "the command outlived castor"
    finally:
        for pid in processes_with("sleep 44.25"):  # what a failure leaves is not left to the next test
            os.kill(pid, signal.SIGKILL)
    assert status(run) == "active" and completes(run) == []
    assert not (run / "sockets" / "Socket-1" / "1.md").exists()
    pi.command("/materia continue")
    ended = wait_cast_end(pi, run, timeout=40)
    assert ended[-1]["data"]["ok"] is True, ended[-1]
    assert completes(run) == ["Socket-1", "Socket-2"], completes(run)
    assert requests_with(fake_llm, "REVIEWER-MATERIA")


def test_esc_mid_stream_after_a_tool_call_step_counts_the_step_and_marks_the_stopped_messages_share(
        start_pi, castor_command, fake_llm, tmp_path):
    """The builder calls a tool (that step reports its usage: 15 tokens), then its answer streams and
    the user presses Esc before the provider says what the answer used (an OpenAI-style stream reports
    usage at its end). The step's tokens count; the turn is marked as not all reported (unreported
    tokens, said in the totals), never as if the step were the whole turn."""
    root = write_loadout(tmp_path / "project", BUILDER)
    pi = start(start_pi, castor_command, root)
    fake_llm.reply_tool_call("bash", {"command": "echo STEP-DONE"}, when="BUILDER-MATERIA")
    fake_llm.reply_text("BUILT-HALF and the rest never sent", when="BUILDER-MATERIA", pause=STALL_S)
    begin = pi.command("/materia cast build the thing")
    run = run_dir(root)
    wait_request(fake_llm, "BUILDER-MATERIA", n=2)
    stopped = esc_mid_stream(pi, run, begin, timeout=15)
    assert stopped.get("unreported") == ["tokens"] and stopped["tokens"]["total"] == 15, stopped
    assert stopped["costEstimated"] is True
    fake_llm.reply_text("BUILT-AFTER-ESC", when="BUILDER-MATERIA")
    fake_llm.reply_text("REVIEWED-OK", when="REVIEWER-MATERIA")
    pi.command("/materia continue")
    done = wait_cast_end(pi, run)
    assert done[-1]["data"]["ok"] is True, done[-1]
    end = pi.wait_ui("notify", lambda e: "pi-materia cast complete" in str(e.get("message")), start=begin, timeout=5)
    assert "1 turn stopped before its last message reported usage" in str(end.get("message")), end

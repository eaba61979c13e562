"""Esc at the moments the other real-Pi cancellation tests leave out, checked from the outside:
during a proactive compaction Pi runs for castor before a socket's turn, and during the window in
which castor restarts a cast actor that crashed; and a second ``castor.client`` on the endpoint Pi
uses (a ``castor serve --socket --allow-faults``): refused Pi's session and cast, or injecting the
faults whose recovery Pi must tell the user about (a utility slot dying under its command, castor
giving up on Pi's session).

Real Pi in RPC mode (an RPC ``abort`` is the client's Esc) with the real runtime and the FAKE model.
After each stop: the next prompt is answered, the cast's saved state and ``castor status`` (the
CLI, another process) say what it waits for, the cast's event log has the stop, and no process of
the stopped work is left under Pi.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from castor.client import Client
from castor.messages.errors import CastorError
from tests.support.waiting import poll_until, wait_for

from .conftest import python_env
from .test_pi_cancel_moments import processes_with, write_loadout
from .test_pi_cancellation import (
    CALL_TIMEOUT_MS,
    error_toasts,
    events,
    loadout,
    requests_with,
    run_dir,
    settled_after,
    up,
    wait_request,
)
from .test_pi_castor_e2e import PLAN, TWO_SOCKETS
from .test_pi_endpoint import short_socket_path
from .test_pi_esc_audit import castor_processes, castor_status

pytestmark = [pytest.mark.pi, pytest.mark.timeout(120)]

SUMMARY_STALL_S = 20.0  # the compaction's summary call answers this late: only the Esc ends it in time


def proactive_project(tmp_path: Path) -> Path:
    """The planner/writer loadout with a 0 % proactive threshold: Pi compacts before every turn."""
    root = tmp_path / "project"
    (root / ".pi").mkdir(parents=True)
    config: dict[str, Any] = {**TWO_SOCKETS, "compaction": {"proactiveThresholdPercent": 0}}
    (root / ".pi" / "pi-materia.json").write_text(json.dumps(config))
    return root


def socket_state(run: Path) -> str | None:
    """The cast's saved ``socketState`` (``interrupted`` while it waits for a continue)."""
    try:
        state = json.loads((run / "state.json").read_text())["state"]
        return state.get("socket_state", state.get("socketState"))
    except (OSError, ValueError, KeyError):
        return None  # not written yet, or mid-replace


def summary_requests(fake_llm) -> int:
    return sum("context checkpoint summary" in json.dumps(r["messages"]) for r in fake_llm.log())


def test_esc_during_a_proactive_compaction_interrupts_the_cast_and_a_prompt_runs_at_once(
        start_pi, castor_command, fake_llm, tmp_path):
    """Pi compacts its session for castor before Socket-1's turn (the 0 % threshold) and the user
    presses Esc while the summary call runs: the turn is never sent, the cast waits interrupted at
    Socket-1 (saved state, footer, ``castor status``, ``turn_interrupted{compaction_cancelled}`` in
    its events), the user's next prompt is answered at once, and ``/materia continue`` completes it."""
    root = proactive_project(tmp_path)
    settings = {"defaultProjectTrust": "always", "compaction": {"enabled": False, "keepRecentTokens": 1}}
    pi = start_pi(castor_command, cwd=root, settings=settings, timeout_ms=CALL_TIMEOUT_MS)
    up(pi)
    pi.prompt("EARLIER-CHAT about the weather, long enough to be worth a summary")
    pi.prompt("MORE-CHAT about the forecast for the weekend")
    fake_llm.reply_text("CHECKPOINT-SUMMARY never sent", when="context checkpoint summary", delay=SUMMARY_STALL_S)
    begin = pi.command("/materia cast build the thing")
    run = run_dir(root)
    assert poll_until(lambda: summary_requests(fake_llm) >= 1, timeout=20), "the summary call never reached the model"
    processes_mid_compaction = {p.pid for p in castor_processes(pi.proc.pid)}
    esc = pi.mark()
    pi.request({"type": "abort"})
    pi.prompt("USER-NEXT after the compaction's Esc", timeout=10)
    assert any("USER-NEXT" in json.dumps(r["messages"][-1]) for r in fake_llm.log()), "the next prompt was answered"
    assert poll_until(lambda: any(e["type"] == "turn_interrupted" for e in events(run)), timeout=10), \
        [e["type"] for e in events(run)]
    (interrupted,) = [e for e in events(run) if e["type"] == "turn_interrupted"]
    assert interrupted["data"]["reason"] == "compaction_cancelled", interrupted
    types = [e["type"] for e in events(run)]
    assert "proactive_compaction_cancelled" in types and "cast_end" not in types, types
    assert not any("PLANNER-MATERIA" in json.dumps(r["messages"]) and "context checkpoint summary"
                   not in json.dumps(r["messages"]) for r in fake_llm.log()), "the stopped socket's turn was sent"
    assert socket_state(run) == "interrupted"
    pi.wait_ui("setStatus", lambda e: str(e.get("statusText", "")).startswith("materia: interrupted at Socket-1"),
               start=esc, timeout=5)
    told = json.dumps(castor_status(root))
    assert run.name in told and "interrupted" in told and "Socket-1" in told, told
    assert {p.pid for p in castor_processes(pi.proc.pid)} <= processes_mid_compaction
    assert error_toasts(pi, begin) == []

    fake_llm.reply_text("CHECKPOINT-SUMMARY: weather chat.", when="context checkpoint summary")
    fake_llm.reply_text("CHECKPOINT-SUMMARY: weather chat.", when="context checkpoint summary")
    fake_llm.reply_text(PLAN, when="PLANNER-MATERIA")
    fake_llm.reply_text("WRITTEN-RESULT", when="WRITER-MATERIA")
    resumed = pi.command("/materia continue")
    assert poll_until(lambda: any(e["type"] == "cast_end" for e in events(run)), timeout=40), \
        [e["type"] for e in events(run)]
    assert events(run)[-1]["data"]["ok"] is True, events(run)[-1]
    assert error_toasts(pi, resumed) == []
    assert settled_after(pi, esc) is not None


@pytest.fixture
def shared_castor(tmp_path: Path) -> Iterator[Path]:
    """A ``castor serve --socket --allow-faults`` Pi connects to (``--castor-endpoint``), so a second
    client can reach the runtime Pi uses; the server is stopped after the test."""
    sock = short_socket_path(tmp_path, "castor.sock")
    server = subprocess.Popen([sys.executable, "-m", "castor", "serve", "--socket", str(sock), "--allow-faults"],
                              env={**os.environ, **python_env()}, stdout=subprocess.DEVNULL,
                              stderr=(tmp_path / "serve.err").open("w"), start_new_session=True)
    try:
        assert poll_until(lambda: sock.exists(), timeout=30), "castor serve --socket never listened"
        yield sock
    finally:
        server.terminate()
        server.wait(timeout=10)
        sock.unlink(missing_ok=True)


def second_client(sock: Path) -> Client:
    client = Client.connect_unix(str(sock))
    client.call("runtime.hello", {"client": "second-client", "protocol": 1})
    return client


def pi_on_the_shared_castor(start_pi: Any, root: Path, sock: Path) -> Any:
    """A real Pi in ``root`` (trusted) on the shared castor, up and answering."""
    pi = start_pi(None, cwd=root, settings={"defaultProjectTrust": "always"}, timeout_ms=CALL_TIMEOUT_MS,
                  extra_args=["--castor-endpoint", f"unix:{sock}"])
    up(pi)
    return pi


def cast_actor_path(client: Client, cast_id: str) -> str:
    actors = client.call("ops.actors", {"prefix": "/root/session"})["actors"]
    return next(a["path"] for a in actors if a["path"].endswith(f"/cast/{cast_id}"))


def test_a_cast_actor_restarted_under_a_running_turn_tells_the_user_and_esc_still_stops_it(
        start_pi, fake_llm, tmp_path, shared_castor):
    """castor restarts a cast's actor that crashed (a second client injects the crash) while Pi runs
    its builder turn, and the user presses Esc at once: Pi's run ends, the restarted cast sends the
    turn again (castor warns, naming the crash, that the turn runs again and how to stop it) -- and
    the extension stops that re-sent turn before its first model request, since the Esc was pressed
    for it (it used to stop only the old run, and the re-sent turn ran: the user had to press Esc
    again). The cast is interrupted (saved state, ``castor status``, event log); the next prompt is
    answered and ``/materia continue`` completes the cast."""
    root = tmp_path / "project"
    (root / ".pi").mkdir(parents=True)
    (root / ".pi" / "pi-materia.json").write_text(json.dumps(loadout("text")))
    pi = pi_on_the_shared_castor(start_pi, root, shared_castor)
    fake_llm.reply_text("BUILT never sent", when="BUILDER-MATERIA", delay=SUMMARY_STALL_S)
    begin = pi.command("/materia cast build it")
    run = run_dir(root)
    wait_request(fake_llm, "BUILDER-MATERIA")
    with second_client(shared_castor) as client:
        killed = pi.mark()
        client.call("ops.fault", {"kind": "kill", "path": cast_actor_path(client, run.name)})
        pi.request({"type": "abort"})
        told = pi.wait_ui("notify", lambda e: "restarted" in str(e.get("message")), start=killed, timeout=10)
        assert told["notifyType"] == "warning", told
        assert "Builder (Socket-1)" in told["message"] and "runs again" in told["message"], told
        assert "/materia abort" in told["message"], told
        stopped = pi.wait_ui("notify", lambda e: "sent its turn again" in str(e.get("message")), start=killed,
                             timeout=10)
        assert "/materia continue" in stopped["message"], stopped
        assert poll_until(lambda: any(e["type"] == "turn_interrupted" for e in events(run)), timeout=10), \
            [e["type"] for e in events(run)]
        assert len(requests_with(fake_llm, "BUILDER-MATERIA")) == 1, "the re-sent turn reached the model"
        assert socket_state(run) == "interrupted"
        types = [e["type"] for e in events(run)]
        assert types.count("cast_recast") == 1 and types[-1] == "turn_interrupted", types
        (recast,) = [e for e in events(run) if e["type"] == "cast_recast"]
        assert "crashed" in recast["data"]["previousFailure"], recast
        shown = json.dumps(castor_status(root))
        assert run.name in shown and "interrupted" in shown, shown
        pi.prompt("USER-NEXT after the restart", timeout=20)
        assert any("USER-NEXT" in json.dumps(r["messages"][-1]) for r in fake_llm.log())
    fake_llm.reply_text("BUILT-AT-LAST", when="BUILDER-MATERIA")
    fake_llm.reply_text("REVIEWED-OK", when="REVIEWER-MATERIA")
    resumed = pi.command("/materia continue")
    assert poll_until(lambda: any(e["type"] == "cast_end" for e in events(run)), timeout=30), \
        [e["type"] for e in events(run)]
    assert events(run)[-1]["data"]["ok"] is True, events(run)[-1]
    assert error_toasts(pi, begin) == [] and resumed > begin


def refused(client: Client, method: str, params: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    """The typed refusal ``method`` gets: its code and data (a call that succeeds fails the test)."""
    with pytest.raises(CastorError) as caught:
        client.call(method, params, timeout=10)
    return caught.value.code, dict(caught.value.data or {})


def test_a_second_client_on_pis_endpoint_is_refused_pis_session_and_cast_with_typed_errors(
        start_pi, fake_llm, tmp_path, shared_castor):
    """Another ``castor.client`` on the endpoint Pi uses, while Pi's cast waits for its model: every
    method naming Pi's session is ``forbidden`` (not opened on that connection), opening Pi's session
    id is ``conflict``; from a session of its own in the same project, aborting, continuing or
    recasting Pi's cast is ``conflict{held_elsewhere}`` and ending Pi's turn ``not_found``. Pi's cast
    is untouched: still waiting for its turn, and Pi's own ``/materia abort`` ends it."""
    root = tmp_path / "project"
    (root / ".pi").mkdir(parents=True)
    (root / ".pi" / "pi-materia.json").write_text(json.dumps(loadout("text")))
    pi = pi_on_the_shared_castor(start_pi, root, shared_castor)
    fake_llm.reply_text("BUILT never sent", when="BUILDER-MATERIA", delay=SUMMARY_STALL_S)
    pi.command("/materia cast build it")
    run = run_dir(root)
    wait_request(fake_llm, "BUILDER-MATERIA")
    with second_client(shared_castor) as client:
        pis = cast_actor_path(client, run.name).split("/")[3]
        turn = f"{run.name}:Socket-1:1:1"
        for method, params in [("cast.abort", {"cast_id": run.name}), ("cast.status", {}), ("cast.continue", {}),
                               ("cast.recast", {}), ("session.close", {}),
                               ("agent.turn_ended", {"turn_id": turn, "text": "NOT-PIS"}),
                               ("harness.event", {"event": "agent_end", "data": {}})]:
            assert refused(client, method, {"session_id": pis, **params})[0] == "forbidden", method
        assert refused(client, "session.open", {"session_id": pis, "cwd": str(root)})[0] == "conflict"
        client.call("session.open", {"session_id": "second-client", "cwd": str(root)})
        mine = {"session_id": "second-client", "cast_id": run.name}
        for method in ("cast.abort", "cast.continue", "cast.recast"):
            assert refused(client, method, mine) == ("conflict", {"reason": "held_elsewhere", "cast_id": run.name})
        assert client.call("cast.status", mine)["elsewhere"] is True
        assert refused(client, "agent.turn_ended", {"session_id": "second-client", "turn_id": turn,
                                                    "text": "NOT-PIS"})[0] == "not_found"
    assert socket_state(run) == "awaiting_agent_response"
    assert [e["type"] for e in events(run)] == ["cast_start", "socket_start", "materia_model_settings"]
    shown = pi.command("/materia status")
    assert "[active]" in pi.wait_ui("notify", start=shown, timeout=10)["message"]
    stopped = pi.command("/materia abort")
    assert "aborted" in pi.wait_ui("notify", start=stopped, timeout=10)["message"]
    assert poll_until(lambda: any(e["type"] == "cast_end" for e in events(run)), timeout=10)
    assert "aborted" in json.dumps(castor_status(root))


def test_a_utility_command_whose_slot_died_mid_run_runs_again_and_pi_says_so(start_pi, fake_llm, tmp_path,
                                                                              shared_castor):
    """The utility slot running a cast's command dies (a second client kills it) while the command
    runs: the command dies with it and the cast runs it again from the start -- and says so, as it
    does when the cast's own actor or its runtime died (``utility_interrupted`` and the warning
    naming the command), since a half-run command starting over must not go unnoticed. Pi's
    ``/materia abort`` then stops the cast and leaves no process of the command behind."""
    root = tmp_path / "project"
    command = "echo ran >> runs.log; sleep 44.25; echo UTIL-DONE"
    write_loadout(root, {"type": "utility", "command": ["sh", "-c", command], "timeoutMs": 120000,
                         "edges": [{"when": "always", "to": "Socket-2"}]})
    pi = pi_on_the_shared_castor(start_pi, root, shared_castor)
    begin = pi.command("/materia cast build it")
    run = run_dir(root)
    assert poll_until(lambda: processes_with("sleep 44.25"), timeout=20), "the command never ran"
    with second_client(shared_castor) as client:
        def slot_running_it() -> str | None:
            # The slot says what it runs just after it spawned the command: the process may be seen first.
            slots = client.call("ops.actors", {"prefix": "/root/utility/"})["actors"]
            found = [s["path"] for s in slots if run.name in json.dumps(s.get("activity"))]
            assert len(found) <= 1, found
            return found[0] if found else None

        slot = wait_for(slot_running_it, timeout=10, what="the utility slot to say it runs the cast's command")
        client.call("ops.fault", {"kind": "kill", "path": slot})
    told = pi.wait_ui("notify", lambda e: "runs again from the start" in str(e.get("message")), start=begin, timeout=15)
    assert told["notifyType"] == "warning" and "sleep 44.25" in told["message"], told
    assert poll_until(lambda: (root / "runs.log").read_text() == "ran\nran\n", timeout=15)
    (interrupted,) = [e for e in events(run) if e["type"] == "utility_interrupted"]
    assert interrupted["data"]["socket"] == "Socket-1", interrupted
    stopped = pi.command("/materia abort")
    assert "aborted" in pi.wait_ui("notify", start=stopped, timeout=10)["message"]
    assert poll_until(lambda: not processes_with("sleep 44.25"), timeout=10), "the command outlived the abort"
    assert "aborted" in json.dumps(castor_status(root))


def test_a_session_castor_gave_up_on_is_opened_again_and_pi_says_what_became_of_its_cast(start_pi, fake_llm,
                                                                                        tmp_path, shared_castor):
    """castor gives up on Pi's session while its cast's turn runs (its supervisor crashed: a second
    client kills it), and the user then types ``/materia status``: before, every call answered
    ``no open session '<id>'`` (shown as an info, as if nothing were wrong) and nothing reopened it.
    Now the extension opens the session again, warns once that castor lost it and that the cast it
    ran is left for ``/materia recast``, and answers the command; the recast completes the cast."""
    root = tmp_path / "project"
    (root / ".pi").mkdir(parents=True)
    (root / ".pi" / "pi-materia.json").write_text(json.dumps(loadout("text")))
    pi = pi_on_the_shared_castor(start_pi, root, shared_castor)
    fake_llm.reply_text("BUILT never sent", when="BUILDER-MATERIA", delay=SUMMARY_STALL_S)
    begin = pi.command("/materia cast build it")
    run = run_dir(root)
    wait_request(fake_llm, "BUILDER-MATERIA")
    with second_client(shared_castor) as client:
        session = cast_actor_path(client, run.name).rsplit("/cast/", 1)[0]
        client.call("ops.fault", {"kind": "kill", "path": session})
        assert poll_until(lambda: not any(a["path"] == session for a in
                                          client.call("ops.actors", {"prefix": "/root/session"})["actors"]), timeout=10)
    settled_after(pi, begin)
    asked = pi.command("/materia status")
    lost = pi.wait_ui("notify", lambda e: "lost this session" in str(e.get("message")), start=begin, timeout=15)
    assert lost["notifyType"] == "warning" and "/materia recast" in lost["message"], lost
    shown = pi.wait_ui("notify", lambda e: run.name in str(e.get("message")), start=asked, timeout=15)
    assert "orphaned" in shown["message"] and "no open session" not in shown["message"], shown
    fake_llm.reply_text("BUILT-AT-LAST", when="BUILDER-MATERIA")
    fake_llm.reply_text("REVIEWED-OK", when="REVIEWER-MATERIA")
    pi.command(f"/materia recast {run.name}")
    assert poll_until(lambda: any(e["type"] == "cast_end" for e in events(run)), timeout=40), \
        [e["type"] for e in events(run)]
    assert events(run)[-1]["data"]["ok"] is True, events(run)[-1]
    assert len([e for e in pi.ui("notify", start=begin) if "lost this session" in str(e.get("message"))]) == 1

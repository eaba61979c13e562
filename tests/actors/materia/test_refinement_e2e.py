"""Multi-turn refinement driven by the harness, end to end (spec §5.7, §5.14 continue, §11 items 48-51).

A real :class:`Server` and a real :class:`Client`. The client plays the Pi extension
(integrations/pi/src/index.ts + turns.ts) with the same event order and payloads:

castor turn  (``agent.run_turn`` notification)
    ``harness.event before_agent_start {message_type:"custom", turn_id}`` → ``agent_end
    {turn_id, messages}`` → ``agent.turn_ended`` (at settlement) → ``harness.event agent_settled``
user turn    (the user typed a message; no castor turn is bound)
    ``harness.event before_agent_start {prompt, message_type:"user", turn_id:null}`` →
    ``context`` → ``agent_end {turn_id:null, messages}`` → ``agent_settled`` (no ``agent.turn_ended``)

The LLM is the only fake: the harness answers each turn with scripted text.
"""

from __future__ import annotations

import json
import queue
import threading
from pathlib import Path
from typing import Any

import pytest

from castor.client import Client
from castor.endpoint.app import build_dispatcher
from castor.endpoint.server import Server

from .helpers import events, make_runtime, plan_json, wait_for, write_project_config

SID = "pi-refine"
BASE_SYSTEM_PROMPT = "You are Pi."

CONFIG = {
    "activeLoadout": "Refine",
    "materia": {
        "Planner": {"prompt": "PLANNER-INSTRUCTIONS", "tools": "readOnly", "multiTurn": True,
                    "model": "test-provider/planner-model", "thinking": "high"},
        "Writer": {"prompt": "WRITER-INSTRUCTIONS", "tools": "none"},
    },
    "loadouts": {"Refine": {"entry": "Socket-1", "sockets": {
        "Socket-1": {"type": "agent", "materia": "Planner", "parse": "json", "assign": {"plan": "$.summary"},
                     "edges": [{"when": "always", "to": "Socket-2"}]},
        "Socket-2": {"type": "agent", "materia": "Writer"},
    }}},
}


class PiLikeHarness:
    """The Pi extension's side of the wire, with a scripted LLM.

    Castor turns are queued by the ``agent.run_turn`` notification and run by :meth:`run_castor_turn`
    on the test thread, so every step happens in the order the test states.
    """

    def __init__(self, client: Client) -> None:
        self.client = client
        self.run_turns: queue.Queue[dict[str, Any]] = queue.Queue()
        self.entries: list[dict[str, Any]] = []
        self.notes: list[dict[str, Any]] = []
        self.event_results: list[tuple[str, dict[str, Any]]] = []
        self.contexts: list[dict[str, Any]] = []
        self._lock = threading.Lock()
        client.on_notification("agent.run_turn", self.run_turns.put)
        client.on_request("session.append_entry", self._append)
        client.on_notification("ui.notify", self.notes.append)
        client.on_notification("ui.status", lambda _p: None)
        client.on_notification("message.send", lambda _p: None)

    def _append(self, params: dict[str, Any]) -> dict[str, Any]:
        with self._lock:
            self.entries.append(params)
            return {"ok": True, "entry_id": f"entry-{len(self.entries)}"}

    def event(self, event: str, data: dict[str, Any]) -> dict[str, Any]:
        result = self.client.call("harness.event", {"session_id": SID, "event": event, "data": data})
        self.event_results.append((event, result))
        return result

    def next_turn(self) -> dict[str, Any]:
        return self.run_turns.get(timeout=10)

    def run_castor_turn(self, turn: dict[str, Any], reply: str, *, entry_id: str) -> None:
        """What Pi does for one ``agent.run_turn``: a custom run bound by ``details.castor_turn_id``."""
        turn_id = turn["turn_id"]
        self.event("before_agent_start", {"prompt": None, "message_type": "custom", "custom_type": "castor-turn",
                                          "turn_id": turn_id, "system_prompt": BASE_SYSTEM_PROMPT, "images": 0})
        self.event("context", {"turn_id": turn_id, "messages": [{"role": "custom", "content": turn["prompt"]}]})
        self.event("agent_end", {"turn_id": turn_id, "messages": [
            {"role": "custom", "text": turn["prompt"], "custom_type": "castor-turn"},
            {"role": "assistant", "text": reply, "stop_reason": "stop", "error": None}]})
        self.client.call("agent.turn_ended", {
            "session_id": SID, "turn_id": turn_id, "text": reply, "stop_reason": "stop", "error": None,
            "usage": {"input": 10, "output": 5, "cache_read": 0, "cache_write": 0, "total_tokens": 15, "cost": None},
            "aborted": False, "entry_id": entry_id})
        self.event("agent_settled", {"aborted": False, "turn_id": turn_id})

    def run_user_turn(self, prompt: str, reply: str, *, history: list[dict[str, Any]] | None = None) -> dict[str, Any]:
        """What Pi does when the user types ``prompt``: no castor turn is bound (turn_id null).

        ``history`` is the transcript before the new message (Pi's message objects); the ``context``
        result is kept in :attr:`contexts`.
        """
        started = self.begin_user_turn(prompt, history=history)
        self.end_user_turn(prompt, reply)
        self.settle_user_run()
        return started

    def begin_user_turn(self, prompt: str, *, history: list[dict[str, Any]] | None = None) -> dict[str, Any]:
        """The start of the user's run: ``before_agent_start`` (a user message), then one ``context``."""
        started = self.event("before_agent_start", {"prompt": prompt, "message_type": "user", "custom_type": None,
                                                    "turn_id": None, "system_prompt": BASE_SYSTEM_PROMPT,
                                                    "images": 0})
        transcript = [*(history or []), {"role": "user", "content": [{"type": "text", "text": prompt}]}]
        self.contexts.append(self.event("context", {"turn_id": None, "messages": transcript}))
        return started

    def end_user_turn(self, prompt: str, reply: str, *, stop_reason: str = "stop",
                      error: str | None = None) -> dict[str, Any]:
        """The user's run's ``agent_end`` (Pi's ``summarizeMessage`` of each message)."""
        return self.event("agent_end", {"turn_id": None, "messages": [
            {"role": "user", "text": prompt},
            {"role": "assistant", "text": reply, "stop_reason": stop_reason, "error": error}]})

    def settle_user_run(self, *, aborted: bool = False) -> dict[str, Any]:
        """Pi 1.x's ``agent_settled`` after the user's run (always after its ``agent_end``)."""
        return self.event("agent_settled", {"aborted": aborted, "turn_id": None})


@pytest.fixture
def harness(tmp_path, project):
    runtime = make_runtime()
    server = Server(build_dispatcher(runtime), unix_path=str(tmp_path / "castor.sock")).start()
    client = Client.connect_unix(str(tmp_path / "castor.sock"), default_timeout=15)
    pi = PiLikeHarness(client)
    client.call("runtime.hello", {"client": "pi-like-test"})
    client.call("session.open", {"session_id": SID, "cwd": str(project), "trusted": True,
                                 "flags": {"harness": "pi", "has_agent_settled": True}})
    yield pi
    client.close()
    server.stop()
    runtime.shutdown(10)


def _status(pi: PiLikeHarness, cast_id: str) -> dict[str, Any]:
    return pi.client.call("cast.status", {"session_id": SID, "cast_id": cast_id})


def _wait_status(pi: PiLikeHarness, cast_id: str, status: str) -> dict[str, Any]:
    return wait_for(lambda: (v := _status(pi, cast_id))["status"] == status and v, what=f"cast {status}")


def _types(run_dir: Path) -> list[str]:
    return [e["type"] for e in events(run_dir)]


@pytest.mark.timeout(20)
def test_user_message_refines_a_paused_socket_and_continue_finalizes(harness, project):
    pi = harness
    write_project_config(project, CONFIG)
    cast_id = pi.client.call("cast.start", {"session_id": SID, "cwd": str(project), "request": "plan the db"})[
        "cast_id"
    ]

    # 1. The first turn is castor's own (refinement mode: guidance, no JSON contract).
    first = pi.next_turn()
    assert "PLANNER-INSTRUCTIONS" in first["prompt"] and first["isolate"] is True
    assert "Return only JSON" not in first["prompt"]
    pi.run_castor_turn(first, "Draft 1: which database?", entry_id="pi-entry-1")
    paused = _wait_status(pi, cast_id, "awaiting_refinement")
    assert paused["paused"] is True and paused["current_socket"] == "Socket-1" and paused["pending"] is None
    run_dir = Path(paused["run_dir"])
    first_draft = [e["data"] for e in events(run_dir) if e["type"] == "socket_refinement"]
    assert [d["refinementTurn"] for d in first_draft] == [1]
    assert first_draft[0]["artifact"].startswith("sockets/Socket-1/1.refinement-1-")
    assert (run_dir / first_draft[0]["artifact"]).read_text() == "Draft 1: which database?"

    # 2. The user answers. Pi runs the turn itself; castor records it as refinement 2 and stays paused.
    history = [
        {"role": "user", "content": [{"type": "text", "text": "EARLIER-CHAT about something else"}]},
        {"role": "assistant", "content": [{"type": "text", "text": "EARLIER-REPLY"}]},
        {"role": "custom", "customType": "castor-turn", "content": first["prompt"], "display": False,
         "details": {"castor_turn_id": first["turn_id"]}},
        {"role": "assistant", "content": [{"type": "text", "text": "Draft 1: which database?"}]},
    ]
    started = pi.run_user_turn("use postgres please", "Draft 2: postgres it is.", history=history)
    # The user's turn carries the materia's instructions and the refinement guidance (spec §5.1 / §5.7.3).
    appended = started.get("system_prompt_append") or ""
    assert "Materia active materia (Socket-1)" in appended and "PLANNER-INSTRUCTIONS" in appended
    assert "/materia continue" in appended
    # ...and the materia's model, thinking and tool scope, re-applied for that turn (spec §5.7 step 3),
    # encoded exactly as for castor's own turns.
    planner_settings = {"model": {"provider": "test-provider", "id": "planner-model"}, "thinking": "high",
                        "tools": ["read", "grep", "find", "ls"]}
    assert {k: first[k] for k in planner_settings} == planner_settings
    assert started.get("turn_settings") == planner_settings
    # The turn's transcript is cut to the isolated context (spec §5.4): one synthetic message, then the
    # socket's prompt and everything after it; the earlier chat is gone.
    cut = pi.contexts[-1]["messages"]
    assert "Materia isolated context." in cut[0]["content"][0]["text"] and cut[0]["role"] == "user"
    cut_text = cut[0]["content"][0]["text"]
    assert "Mode: multi-turn refinement (awaiting_agent_response)" in cut_text and "plan the db" in cut_text
    assert cut[1:] == history[2:] + [{"role": "user", "content": [{"type": "text", "text": "use postgres please"}]}]
    assert "EARLIER-CHAT" not in json.dumps(cut)
    second = wait_for(lambda: [e for e in events(run_dir) if e["type"] == "socket_refinement"
                               and e["data"]["refinementTurn"] == 2], what="refinement 2 recorded")[0]["data"]
    assert second["socket"] == "Socket-1" and second["artifact"].startswith("sockets/Socket-1/1.refinement-2-")
    assert (run_dir / second["artifact"]).read_text() == "Draft 2: postgres it is."
    view = _wait_status(pi, cast_id, "awaiting_refinement")
    assert view["paused"] is True and view["pending"] is None and "user_turn_visit_id" not in view
    assert pi.run_turns.empty(), "a user-driven refinement turn must not send agent.run_turn"
    refinement_ctx = [e["data"] for e in events(run_dir) if e["type"] == "context_refinement"]
    assert len(refinement_ctx) == 1 and refinement_ctx[0]["refinementTurn"] == 2
    assert (run_dir / refinement_ctx[0]["artifact"]).is_file()
    manifest = json.loads((run_dir / "manifest.json").read_text())["entries"]
    assert [e.get("refinementTurn") for e in manifest if e.get("kind") == "socket_refinement"] == [1, 2]
    assert "socket_complete" not in _types(run_dir)
    assert not (run_dir / "sockets" / "Socket-1" / "1.json").exists()

    # 3. /materia continue is the only finalizer: castor sends the finalization turn.
    cont = pi.client.call("cast.continue", {"session_id": SID, "cwd": str(project)})
    assert cont["cast_id"] == cast_id and cont["pending"]["mode"] == "finalization"
    final = pi.next_turn()
    assert "Command-triggered finalization" in final["prompt"] and "Return only JSON" in final["prompt"]
    pi.run_castor_turn(final, plan_json("a"), entry_id="pi-entry-3")

    # 4. The cast proceeds to Socket-2 and completes.
    writer = pi.next_turn()
    assert "WRITER-INSTRUCTIONS" in writer["prompt"]
    pi.run_castor_turn(writer, "written", entry_id="pi-entry-4")
    done = _wait_status(pi, cast_id, "complete")
    assert done["active"] is False

    evs = events(run_dir)
    completes = [e["data"] for e in evs if e["type"] == "socket_complete"]
    assert [c["socket"] for c in completes] == ["Socket-1", "Socket-2"]
    assert completes[1].get("entryId") == "pi-entry-4"  # the harness's transcript id, not castor's turn id
    assert completes[0]["finalizedRefinement"] is True and completes[0]["refinementTurn"] == 2
    assert completes[0]["parsed"] is True
    end = [e["data"] for e in evs if e["type"] == "cast_end"]
    assert len(end) == 1 and end[0]["ok"] is True
    assert evs[-1]["type"] == "cast_end"
    output = [e for e in json.loads((run_dir / "manifest.json").read_text())["entries"]
              if e.get("kind") == "socket_output" and e.get("socket") == "Socket-1"]
    assert len(output) == 1 and output[0]["finalized"] is True and output[0]["refinementTurn"] == 2
    assert output[0]["artifact"] == "sockets/Socket-1/1.md"
    assert json.loads((run_dir / "sockets" / "Socket-1" / "1.json").read_text())["workItems"][0]["id"] == "a"
    # The only refinement turns are the two drafts; nothing else was recorded as one.
    assert [e["data"]["refinementTurn"] for e in evs if e["type"] == "socket_refinement"] == [1, 2]


@pytest.mark.timeout(20)
def test_user_messages_while_no_cast_is_paused_touch_no_cast(harness, project):
    pi = harness
    write_project_config(project, CONFIG)

    # No cast at all: the events are ambient, answered with nothing to inject.
    started = pi.run_user_turn("hello there", "hi")
    assert started == {}
    assert not (project / ".pi" / "pi-materia").exists() or not any(
        p.is_dir() for p in (project / ".pi" / "pi-materia").iterdir())

    cast_id = pi.client.call("cast.start", {"session_id": SID, "cwd": str(project), "request": "plan"})["cast_id"]
    first = pi.next_turn()
    run_dir = Path(_status(pi, cast_id)["run_dir"])

    # The cast is awaiting castor's own turn (not paused): a user message changes nothing.
    before = _types(run_dir)
    assert pi.run_user_turn("what's up?", "nothing") == {}
    view = _status(pi, cast_id)
    assert view["status"] == "active" and view["pending"]["visit_id"] and _types(run_dir) == before
    assert view["pending"]["mode"] == "refinement"  # still castor's first turn

    # That turn still completes normally afterwards (its answer was not consumed by the user's turn).
    pi.run_castor_turn(first, "Draft 1", entry_id="pi-entry-1")
    _wait_status(pi, cast_id, "awaiting_refinement")
    assert [e["data"]["refinementTurn"] for e in events(run_dir) if e["type"] == "socket_refinement"] == [1]

    # Aborted: no longer paused, so a user message is again ignored.
    pi.client.call("cast.abort", {"session_id": SID, "cast_id": cast_id})
    before = _types(run_dir)
    assert pi.run_user_turn("finalize please", "ok") == {}
    assert _types(run_dir) == before and _status(pi, cast_id)["status"] == "aborted"
    assert pi.run_turns.empty()
    # None of those user runs had a refinement turn pending: their transcripts were left alone.
    assert len(pi.contexts) == 3 and all(c == {} for c in pi.contexts)


@pytest.mark.timeout(20)
def test_only_the_pending_user_turn_has_its_transcript_cut(harness, project):
    """The isolated context applies while the user-driven turn runs, not to castor's own turns
    (the harness isolates those) and not to user runs after the refinement turn was answered."""
    pi = harness
    write_project_config(project, CONFIG)
    pi.client.call("cast.start", {"session_id": SID, "cwd": str(project), "request": "plan"})
    first = pi.next_turn()
    prompt_msg = {"role": "custom", "customType": "castor-turn", "content": first["prompt"]}
    castor_ctx = pi.event("context", {"turn_id": first["turn_id"], "messages": [prompt_msg]})
    assert castor_ctx == {}
    pi.run_castor_turn(first, "Draft 1", entry_id="pi-entry-1")
    wait_for(lambda: pi.client.call("cast.status", {"session_id": SID})["status"] == "awaiting_refinement",
             what="paused")
    pi.run_user_turn("more detail", "Draft 2", history=[prompt_msg])
    assert pi.contexts[-1]["messages"][1:] == [prompt_msg, {"role": "user", "content": [
        {"type": "text", "text": "more detail"}]}]
    # The refinement turn was answered (agent_end reached the cast before this event: both went through
    # the SessionActor, in order): the next user run's context is not touched, even though the cast is
    # still paused — only a new before_agent_start starts (and cuts) a new turn.
    after = pi.event("context", {"turn_id": None, "messages": [prompt_msg]})
    assert after == {}


@pytest.mark.timeout(30)
@pytest.mark.parametrize("words", ["ready to continue", "finalize", "looks good, proceed"])
def test_c49_a_user_message_that_says_finalize_only_refines_the_paused_socket(harness, project, words):
    """Natural language never finalizes (only ``/materia continue`` does): the user's turn, even one
    whose message and reply both say so, is recorded as refinement 2 and the socket stays paused."""
    pi = harness
    write_project_config(project, CONFIG)
    cast_id = pi.client.call("cast.start", {"session_id": SID, "cwd": str(project), "request": "plan"})["cast_id"]
    pi.run_castor_turn(pi.next_turn(), "Draft 1", entry_id="pi-entry-1")
    run_dir = Path(_wait_status(pi, cast_id, "awaiting_refinement")["run_dir"])
    pi.run_user_turn(words, f"OK, {words}: {plan_json('a')}")
    wait_for(lambda: [e for e in events(run_dir) if e["type"] == "socket_refinement"
                      and e["data"]["refinementTurn"] == 2], what="refinement 2 recorded")
    view = _wait_status(pi, cast_id, "awaiting_refinement")
    assert view["paused"] is True and view["pending"] is None
    state = json.loads((run_dir / "state.json").read_text())["state"]
    assert state["multi_turn_finalizing"] is not True and state["socket_state"] == "awaiting_user_refinement"
    assert "socket_complete" not in _types(run_dir) and pi.run_turns.empty()
    assert not (run_dir / "sockets" / "Socket-1" / "1.md").exists()


@pytest.mark.timeout(30)
def test_c63_a_refinement_turn_lost_to_the_context_window_is_retried_from_the_last_good_draft(harness, project):
    """The user's refinement turn ends in a context-window error after a partial reply: the host
    compacts, and castor's retry of that refinement turn carries the refinement guidance and the
    last good draft as its previous output, never the failed partial."""
    pi = harness
    compactions: list[dict[str, Any]] = []
    pi.client.on_request("session.compact", lambda p: compactions.append(p) or {"summary": "S", "tokensBefore": 9})
    write_project_config(project, CONFIG)
    cast_id = pi.client.call("cast.start", {"session_id": SID, "cwd": str(project), "request": "plan"})["cast_id"]
    pi.run_castor_turn(pi.next_turn(), "Draft one: use sqlite.", entry_id="pi-entry-1")
    _wait_status(pi, cast_id, "awaiting_refinement")
    pi.begin_user_turn("add indexes")
    pi.end_user_turn("add indexes", "BROKEN PARTIAL", stop_reason="error",
                     error="400 context window exceeded")
    pi.settle_user_run()
    retry = pi.next_turn()
    assert len(compactions) == 1, compactions
    assert "Previous output:\nDraft one: use sqlite." in retry["prompt"]
    assert "BROKEN PARTIAL" not in retry["prompt"] and "/materia continue" in retry["prompt"]
    pi.run_castor_turn(retry, "Draft two: sqlite with indexes.", entry_id="pi-entry-3")
    view = _wait_status(pi, cast_id, "awaiting_refinement")
    drafts = [e["data"]["refinementTurn"] for e in events(Path(view["run_dir"])) if e["type"] == "socket_refinement"]
    assert drafts == [1, 2]

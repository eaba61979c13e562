"""The materia methods through a real Server and castor.client, with the harness side scripted here."""

from __future__ import annotations

import json
import threading
import time

import pytest

from castor.client import Client
from castor.messages.errors import Forbidden, InvalidParams, NotFound

from .helpers import plan_json, wait_for, write_project_config


class FakeHarness:
    """A harness client: answers castor's agent.run_turn with agent.turn_ended (by socket)."""

    def __init__(self, client: Client, session_id: str, answers: dict[str, list[str]]) -> None:
        self.client = client
        self.session_id = session_id
        self.answers = {k: list(v) for k, v in answers.items()}
        self.turns: list[dict] = []
        self.entries: list[dict] = []
        self.notes: list[dict] = []
        client.on_notification("agent.run_turn", self._run_turn)
        client.on_request("session.append_entry", self._append)
        client.on_notification("ui.notify", self.notes.append)
        client.on_notification("ui.status", lambda _p: None)
        client.on_notification("message.send", lambda _p: None)

    def _append(self, params: dict) -> dict:
        self.entries.append(params)
        return {"ok": True, "entry_id": f"e{len(self.entries)}"}

    def _run_turn(self, params: dict) -> None:
        self.turns.append(params)
        socket = next((k for k in self.answers if k in params.get("summary", "") or k == "*"), "*")
        text = self.answers[socket].pop(0)

        def answer() -> None:
            self.client.call("agent.turn_ended", {"session_id": self.session_id, "turn_id": params["turn_id"],
                                                  "text": text, "stop_reason": "stop",
                                                  "usage": {"input": 10, "output": 5, "total_tokens": 15}})

        threading.Thread(target=answer, daemon=True).start()


def _write_two_socket_project(project) -> None:
    """The project's config: an active loadout ``Two``, a planner ``P`` (JSON, its summary assigned
    to ``plan``) always followed by a writer ``W``."""
    write_project_config(project, {"activeLoadout": "Two", "materia": {
        "P": {"prompt": "PLANNER", "tools": "none"}, "W": {"prompt": "WRITER", "tools": "none"}},
        "loadouts": {"Two": {"entry": "Socket-1", "sockets": {
            "Socket-1": {"type": "agent", "materia": "P", "parse": "json", "assign": {"plan": "$.summary"},
                         "edges": [{"when": "always", "to": "Socket-2"}]},
            "Socket-2": {"type": "agent", "materia": "W"}}}}})


def test_cast_methods_over_msgpack_rpc(served, project):
    _write_two_socket_project(project)
    client = served()
    harness = FakeHarness(client, "pi-1", {"P": [plan_json("a")], "W": ["written"]})
    hello = client.call("runtime.hello", {"client": "test"})
    for method in ("cast.start", "cast.abort", "cast.continue", "cast.recast", "cast.revive", "cast.status",
                   "cast.list", "loadout.list", "loadout.set", "grid.render", "config.validate"):
        assert method in hello["methods"]
    client.call("session.open", {"session_id": "pi-1", "cwd": str(project), "trusted": True})
    started = client.call("cast.start", {"session_id": "pi-1", "cwd": str(project), "request": "build it"})
    assert started["text"] and started["cast_id"] and started["loadout"] == "Two"
    done = wait_for(lambda: (v := client.call("cast.status", {"session_id": "pi-1", "cast_id": started["cast_id"]}))
                    ["status"] == "complete" and v, what="completion")
    assert "complete" in done["text"] and done["usage"]["tokens"] == 30
    assert [t["summary"].split("**")[1] for t in harness.turns] == ["P (1)", "W (2)"]
    assert harness.turns[0]["isolate"] is True and "PLANNER" in harness.turns[0]["prompt"]
    # the hidden prompt's custom type is pi-materia's (castor sent "castor-turn")
    assert {t["custom_type"] for t in harness.turns} == {"pi-materia-prompt"}
    wait_for(lambda: any(e["custom_type"] == "pi-materia-cast-state" and e["data"]["phase"] == "complete"
                         for e in harness.entries), what="the mirrored final state entry")
    # in pi-materia's terms: updatedAt in epoch milliseconds (Date.now()), no null for what is unset
    states = [e["data"] for e in harness.entries if e["custom_type"] == "pi-materia-cast-state"]
    assert all(isinstance(d["updatedAt"], int) and abs(d["updatedAt"] - time.time() * 1000) < 600_000
               for d in states), states
    assert all(None not in d.values() for d in states) and "currentItemKey" not in states[-1], states
    # one pi-materia-context session entry per prompt sent, as pi-materia appends it (castor wrote none)
    contexts = wait_for(lambda: (c := [e["data"] for e in harness.entries if e["custom_type"] == "pi-materia-context"])
                        and len(c) == 2 and c, what="the context entries")
    assert [(c["socketId"], c["materiaName"], c["artifact"]) for c in contexts] == [
        ("Socket-1", "P", "contexts/Socket-1-1.md"), ("Socket-2", "W", "contexts/Socket-2-1.md")]
    assert contexts[0]["phase"] == "Socket-1" and "materiaModel" in contexts[0]
    assert "itemKey" not in contexts[0] and "itemLabel" not in contexts[0]  # no item: left out, as pi-materia
    # each turn carries the details pi-materia gives its visible line and its hidden prompt
    first = harness.turns[0]
    assert first["summary_details"] == {"prefix": "materia", "socketId": "Socket-1", "materiaName": "P",
                                        "socketOrdinal": 1, "eventType": "materia_prompt",
                                        "materiaModel": contexts[0]["materiaModel"]}
    assert first["prompt_details"] == {"phase": "Socket-1", "socketId": "Socket-1", "materiaName": "P",
                                       "materiaModel": contexts[0]["materiaModel"]}
    listing = client.call("cast.list", {"session_id": "pi-1"})
    assert listing["casts"][0]["cast_id"] == started["cast_id"] and "RECAST" not in listing["text"]

    loadouts = client.call("loadout.list", {"session_id": "pi-1"})
    assert loadouts["active"] == "Two" and loadouts["text"].startswith("⌘ Two (") and "Two" in loadouts["loadouts"]
    switched = client.call("loadout.set", {"session_id": "pi-1", "name": "hello"})
    assert switched["active"] == "hello"
    assert json.loads((project / ".pi" / "pi-materia.json").read_text())["activeLoadout"] == "hello"
    grid = client.call("grid.render", {"session_id": "pi-1", "loadout": "Two"})
    assert "Socket-1" in grid["text"] and grid["loadout"] == "Two"
    (project / "bad.json").write_text(json.dumps({"loadouts": {"x": {"entry": "nope", "sockets": {}}}}))
    bad = client.call("config.validate", {"session_id": "pi-1", "path": "bad.json"})
    assert bad["ok"] is False and bad["errors"] and bad["level"] == "error"
    good = client.call("config.validate", {"session_id": "pi-1", "path": ".pi/pi-materia.json"})
    assert good["ok"] is True


def test_method_errors_have_stable_codes(served, project):
    client = served()
    FakeHarness(client, "pi-2", {"*": [{"never": 1}]})
    client.call("session.open", {"session_id": "pi-2", "cwd": str(project), "trusted": True})
    with pytest.raises(InvalidParams):
        client.call("cast.start", {"session_id": "pi-2", "request": ""})
    with pytest.raises(InvalidParams):
        client.call("cast.status", {"session_id": "pi-2", "bogus": 1})
    with pytest.raises(Forbidden):
        client.call("cast.status", {"session_id": "pi-2", "cast_id": "../../etc"})
    with pytest.raises(NotFound):
        client.call("cast.status", {"session_id": "pi-2"})
    with pytest.raises(NotFound):
        client.call("cast.recast", {"session_id": "pi-2"})
    with pytest.raises(NotFound):  # no such cast (ids are exact, a unique prefix or latest)
        client.call("cast.continue", {"session_id": "pi-2", "cast_id": "2020-01-01T00-00-00-000Z"})
    other = served()
    with pytest.raises(Forbidden):  # a session belongs to the connection that opened it
        other.call("cast.list", {"session_id": "pi-2"})
    with pytest.raises(Forbidden):
        other.call("cast.list", {"session_id": "nobody"})


@pytest.mark.timeout(60)
def test_a_harness_gone_when_castor_sends_the_next_turn_closes_its_session_at_once_and_the_cast_stays(
        served, project):
    """The harness dies between two turns of a cast: castor's next write, the second socket's
    ``agent.run_turn`` sent from the cast's own actors, is the one that finds the peer gone and
    closes the connection. Closing the session then must not wait for the actor whose write
    failed: the session closes within seconds and the cast stays persisted, resumable."""
    import errno

    _write_two_socket_project(project)
    client = served()
    FakeHarness(client, "pi-gone", {"P": [plan_json("a")], "W": ["written"]})
    client.call("session.open", {"session_id": "pi-gone", "cwd": str(project), "trusted": True})
    [conn] = served.server.connections()
    gone = threading.Event()
    send_nowait = conn.transport.send_nowait

    def failing_send(data):  # the harness died after its first turn: the next turn's frame fails
        if gone.is_set() or (b"agent.run_turn" in bytes(data) and b"WRITER" in bytes(data)):
            gone.set()
            raise BrokenPipeError(errno.EPIPE, "Broken pipe")
        return send_nowait(data)

    conn.transport.send_nowait = failing_send
    started = client.call("cast.start", {"session_id": "pi-gone", "cwd": str(project), "request": "build it"})
    assert gone.wait(15), "the second turn was never sent"
    since = time.monotonic()
    wait_for(lambda: not served.runtime.has_session("pi-gone"), timeout=10, what="the session to close")
    assert time.monotonic() - since < 10
    assert conn.closed and (conn.close_reason or "").startswith("write failed")
    later = served()
    later.call("session.open", {"session_id": "pi-later", "cwd": str(project), "trusted": True})
    status = later.call("cast.status", {"session_id": "pi-later", "cast_id": started["cast_id"]})
    assert (status["status"], status["resumable"], status["current_socket"]) == ("orphaned", True, "Socket-2")

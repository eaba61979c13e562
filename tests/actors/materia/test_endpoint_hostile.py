"""A careless or hostile harness against the materia methods: bad values are typed answers,
never a lost turn, a crashed session or a frame the harness cannot read."""

from __future__ import annotations

import queue

import pytest

from castor.client import Client
from castor.messages.errors import CastorError, InvalidParams, NotFound
from tests.support.waiting import wait_for

from .helpers import write_project_config

TWO = {"activeLoadout": "Two", "materia": {"W": {"prompt": "{{lastOutput}} {{lastOutput}}", "tools": "none"}},
       "loadouts": {"Two": {"entry": "Socket-1", "sockets": {
           "Socket-1": {"type": "agent", "materia": "W", "edges": [{"when": "always", "to": "Socket-2"}]},
           "Socket-2": {"type": "agent", "materia": "W"}}}}}


def _harness(client: Client, session_id: str, project) -> "queue.Queue[dict]":
    turns: queue.Queue[dict] = queue.Queue()
    client.on_notification("agent.run_turn", turns.put)
    client.on_request("session.append_entry", lambda _p: {"ok": True, "entry_id": "e"})
    for note in ("ui.notify", "ui.status", "message.send"):
        client.on_notification(note, lambda _p: None)
    client.call("session.open", {"session_id": session_id, "cwd": str(project), "trusted": True})
    return turns


def _status(client: Client, sid: str, cast_id: str) -> dict:
    return client.call("cast.status", {"session_id": sid, "cast_id": cast_id})


def _two_socket_cast(served, project) -> tuple[Client, "queue.Queue[dict]", str, dict]:
    """A cast of TWO over a real connection, waiting on its first turn: (client, turns, cast id, turn)."""
    write_project_config(project, TWO)
    client = served()
    turns = _harness(client, "s1", project)
    cast_id = client.call("cast.start", {"session_id": "s1", "request": "x"})["cast_id"]
    return client, turns, cast_id, turns.get(timeout=10)


@pytest.mark.timeout(60)
def test_odd_usage_never_costs_the_turn_and_a_bad_answer_leaves_it_answerable(served, project):
    client, turns, cast_id, first = _two_socket_cast(served, project)
    with pytest.raises(InvalidParams):  # a mistyped field: refused before the turn is taken
        client.call("agent.turn_ended", {"session_id": "s1", "turn_id": first["turn_id"], "text": "one",
                                         "entry_id": 42})
    # usage is telemetry: figures that are not finite non-negative numbers are "not reported"
    client.call("agent.turn_ended", {"session_id": "s1", "turn_id": first["turn_id"], "text": "one",
                                     "usage": {"input": 1.5, "output": "lots", "cost": {"total": "x"}}})
    second = turns.get(timeout=10)
    client.call("agent.turn_ended", {"session_id": "s1", "turn_id": second["turn_id"], "text": "two",
                                     "usage": {"input": float("nan"), "total_tokens": float("inf")}})
    done = wait_for(lambda: (v := _status(client, "s1", cast_id))["status"] == "complete" and v,
                    what="the cast to complete")
    assert done["failed_reason"] is None
    with pytest.raises(NotFound):  # answered once; a second answer finds nothing
        client.call("agent.turn_ended", {"session_id": "s1", "turn_id": second["turn_id"], "text": "again"})


@pytest.mark.timeout(60)
def test_a_mistyped_agent_end_never_crashes_the_session(served, project):
    write_project_config(project, {"activeLoadout": "hello"})
    client = served()
    _harness(client, "s1", project)
    for _ in range(10):  # more than the session's restart intensity, if each one crashed an actor
        client.call("harness.event", {"session_id": "s1", "event": "agent_end",
                                      "data": {"messages": [{"role": "assistant", "text": 7, "error": {"x": 1}}],
                                               "entry_id": 42}})
    assert client.call("cast.list", {"session_id": "s1"})["casts"] == []  # the session is still there


@pytest.mark.timeout(30)
@pytest.mark.parametrize("cwd, code", [("relative/dir", "invalid_params"), ("", "invalid_params"),
                                       ("/nonexistent/castor-x", "not_found"), ("/etc/passwd", "not_found"),
                                       ("/tmp/a\x00b", "invalid_params")])
def test_session_open_refuses_a_cwd_that_is_not_an_existing_absolute_directory(served, tmp_path, cwd, code):
    client = served()
    with pytest.raises(CastorError) as refused:
        client.call("session.open", {"session_id": "s1", "cwd": cwd, "trusted": True})
    assert refused.value.code == code
    assert not (tmp_path / "relative").exists()


@pytest.mark.timeout(60)
def test_a_prompt_over_the_protocols_string_limit_fails_the_cast_instead_of_the_connection(served, project):
    client, turns, cast_id, first = _two_socket_cast(served, project)
    client.call("agent.turn_ended", {"session_id": "s1", "turn_id": first["turn_id"],
                                     "text": "y" * (5 * 1024 * 1024)})  # doubled by the next prompt: 10 MiB
    failed = wait_for(lambda: (v := _status(client, "s1", cast_id))["status"] == "failed" and v,
                      what="the cast to fail")
    assert "string limit" in failed["failed_reason"] and "Non-recoverable" in failed["failed_reason"]
    assert turns.empty()  # nothing was sent
    assert client.call("runtime.hello")["name"] == "castor"  # the connection is fine


@pytest.mark.timeout(60)
def test_sessions_are_bounded_per_connection_and_per_runtime(tmp_path, project):
    from castor.endpoint.app import build_dispatcher
    from castor.endpoint.connection import ConnectionSettings
    from castor.endpoint.server import Server

    from .helpers import make_runtime

    runtime = make_runtime(max_sessions=5)
    server = Server(build_dispatcher(runtime), unix_path=str(tmp_path / "s.sock"),
                    settings=ConnectionSettings(max_sessions=3, sessions_kept_for_first=0)).start()
    try:
        first, second = (Client.connect_unix(str(tmp_path / "s.sock"), default_timeout=15) for _ in range(2))
        for n in range(3):
            first.call("session.open", {"session_id": f"a{n}", "cwd": str(project)})
        with pytest.raises(CastorError) as per_connection:
            first.call("session.open", {"session_id": "a3", "cwd": str(project)})
        assert per_connection.value.code == "mailbox_full"
        for n in range(2):
            second.call("session.open", {"session_id": f"b{n}", "cwd": str(project)})
        with pytest.raises(CastorError) as per_runtime:
            second.call("session.open", {"session_id": "b2", "cwd": str(project)})
        assert per_runtime.value.code == "mailbox_full"
        first.call("session.close", {"session_id": "a0"})
        second.call("session.open", {"session_id": "b2", "cwd": str(project)})  # room again
        with pytest.raises(InvalidParams):
            second.call("cast.start", {"session_id": "b2", "request": "x", "loadout": ""})
        first.close()
        second.close()
    finally:
        server.stop()
        runtime.shutdown(10)


@pytest.mark.timeout(60)
def test_connections_opening_all_they_may_leave_every_other_connection_its_first_session(tmp_path, project):
    """The defaults' shape (a connection may hold 32 of the runtime's 256: 8 connections held them
    all) in small: a connection may hold 4 of 8. Two greedy connections no longer take every slot;
    the last ones are kept for connections that hold none, so two more harnesses each open one."""
    from castor.endpoint.app import build_dispatcher
    from castor.endpoint.connection import ConnectionSettings
    from castor.endpoint.server import Server

    from .helpers import make_runtime

    runtime = make_runtime(max_sessions=8)
    server = Server(build_dispatcher(runtime), unix_path=str(tmp_path / "s.sock"),
                    settings=ConnectionSettings(max_sessions=4)).start()  # kept for first sessions: the default
    clients = [Client.connect_unix(str(tmp_path / "s.sock"), default_timeout=15) for _ in range(4)]
    try:
        greedy, also_greedy, late, later = clients
        for n in range(4):
            greedy.call("session.open", {"session_id": f"a{n}", "cwd": str(project)})
        also_greedy.call("session.open", {"session_id": "b0", "cwd": str(project)})  # its first: any free slot
        with pytest.raises(CastorError) as kept:
            also_greedy.call("session.open", {"session_id": "b1", "cwd": str(project)})
        assert kept.value.code == "mailbox_full"
        assert kept.value.data["reason"] == "kept_for_first_sessions" and kept.value.data["kept"] == 4
        late.call("session.open", {"session_id": "c0", "cwd": str(project)})
        later.call("session.open", {"session_id": "d0", "cwd": str(project)})
        with pytest.raises(CastorError) as second:  # a first session that has its own is a second one
            later.call("session.open", {"session_id": "d1", "cwd": str(project)})
        assert second.value.data["reason"] == "kept_for_first_sessions"
        greedy.close()  # its four close with it: room for everyone's second again
        wait_for(lambda: len(runtime.sessions()) == 3, what="the greedy connection's sessions to close")
        also_greedy.call("session.open", {"session_id": "b1", "cwd": str(project)})
    finally:
        for client in clients:
            client.close()
        server.stop()
        runtime.shutdown(10)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("field", ["error", "usages"])
def test_a_turn_end_nested_past_what_castor_can_walk_is_invalid_params_and_the_turn_stays_answerable(
        served, project, field):
    """The decoder takes 1024 levels, Python recurses about 1000: a turn's ``error`` (its repr) or
    ``usages`` (JSON for the cast's events) nested 1015 deep raised RecursionError, answered
    ``internal`` -- castor's own bug by its code -- with a traceback in the log."""
    client, turns, cast_id, first = _two_socket_cast(served, project)
    deep: object = "leaf"
    for _ in range(1015):
        deep = {"k": deep}
    with pytest.raises(InvalidParams) as refused:
        client.call("agent.turn_ended", {"session_id": "s1", "turn_id": first["turn_id"], "text": "one",
                                         field: deep})
    assert refused.value.data["reason"] == "nested_too_deep"
    client.call("agent.turn_ended", {"session_id": "s1", "turn_id": first["turn_id"], "text": "one"})
    assert turns.get(timeout=10)["turn_id"] != first["turn_id"]  # the cast went on to its next turn

"""Session and ops methods over a real Unix-socket server and the real client."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from castor.client import Client
from castor.endpoint.app import build_dispatcher
from castor.endpoint.server import Server
from castor.messages.errors import (
    ActorCrashed,
    ActorStopped,
    Conflict,
    Forbidden,
    InvalidParams,
    NotFound,
    UnknownMethod,
)
from castor.ports.agent import TurnOutcome, TurnRequest
from castor.runtime import Runtime, RuntimeSettings, SessionComponent
from castor.supervision import ChildSpec
from tests.supervision.helpers import Journal, Ping, poll_until, worker

pytestmark = pytest.mark.timeout(30)


def _probe_component(journal: Journal) -> SessionComponent:
    def children(ctx):
        return [ChildSpec("probe", worker(f"probe-{ctx.info.session_id}", journal))]

    def on_event(ctx, event, data):
        journal.add("event", ctx.info.session_id, event)
        return {"seen": event, "echo": data.get("x")}

    def on_close(ctx):
        journal.add("closed", ctx.info.session_id)

    return SessionComponent("probe", children, on_event, on_close)


@pytest.fixture
def served(tmp_path: Path, request):
    allow = getattr(request, "param", False)
    journal = Journal()
    runtime = Runtime(RuntimeSettings(allow_faults=allow), components=[_probe_component(journal)])
    sock = str(tmp_path / "castor.sock")
    server = Server(build_dispatcher(runtime), unix_path=sock).start()
    clients: list[Client] = []

    def connect() -> Client:
        client = Client.connect_unix(sock)
        clients.append(client)
        return client

    yield runtime, connect, journal
    for client in clients:
        client.close()
    server.stop()
    runtime.shutdown(10)


def test_open_event_close_round_trip(served):
    runtime, connect, journal = served
    client = connect()
    opened = client.call("session.open", {"session_id": "s1", "cwd": "/tmp", "trusted": False, "flags": {}})
    assert opened == {"session_id": "s1", "path": "/root/session/s1"}
    assert runtime.system.lookup("/root/session/s1/probe").ask(Ping(n=1), timeout=5) == ("probe-s1", 1, 1)
    result = client.call("harness.event", {"session_id": "s1", "event": "before_agent_start", "data": {"x": 7}})
    assert result == {"seen": "before_agent_start", "echo": 7}
    with pytest.raises(Conflict):
        client.call("session.open", {"session_id": "s1", "cwd": "/tmp"})
    assert client.call("session.close", {"session_id": "s1"}) == {"closed": True}
    assert ("closed", "s1") in journal.entries
    assert runtime.system.find("/root/session/s1") is None


def test_bad_params_and_foreign_sessions_are_typed_errors(served):
    runtime, connect, _ = served
    owner, other = connect(), connect()
    owner.call("session.open", {"session_id": "mine", "cwd": "/tmp"})
    with pytest.raises(Forbidden):
        other.call("harness.event", {"session_id": "mine", "event": "agent_end", "data": {}})
    with pytest.raises(InvalidParams):
        owner.call("harness.event", {"session_id": "mine", "event": "not_an_event", "data": {}})
    with pytest.raises(Forbidden) as refused:  # the one safe-id rule: the same refusal as a hostile cast id
        owner.call("session.open", {"session_id": "../../etc", "cwd": "/tmp"})
    # naming the field the caller sent (it said "invalid segment")
    assert refused.value.message == "invalid session_id: '../../etc'", refused.value.message
    assert refused.value.data == {"reason": "invalid session_id", "session_id": "../../etc"}
    with pytest.raises(UnknownMethod):
        owner.call("cast.teleport", {})
    with pytest.raises(NotFound):
        owner.call("ops.mailbox", {"path": "/root/nowhere"})


def test_a_disconnect_closes_the_sessions_opened_on_that_connection(served):
    runtime, connect, journal = served
    client = connect()
    client.call("session.open", {"session_id": "gone", "cwd": "/tmp"})
    client.close()
    assert journal.wait_for(lambda e: ("closed", "gone") in e, timeout=10)
    assert poll_until(lambda: not runtime.sessions(), timeout=10)
    assert runtime.system.find("/root/session/gone") is None


def test_agent_turns_round_trip_through_the_harness(served):
    runtime, connect, _ = served
    client = connect()
    asked: list[dict] = []

    def run_turn(params: dict) -> None:
        asked.append(params)
        threading.Thread(target=lambda: client.call("agent.turn_ended", {
            "session_id": "t", "turn_id": params["turn_id"], "text": "done", "stop_reason": "stop",
            "error": None, "usage": {"input": 3, "output": 4, "cost": None}, "aborted": False,
        }, timeout=5)).start()

    client.on_notification("agent.run_turn", run_turn)
    client.call("session.open", {"session_id": "t", "cwd": "/tmp"})
    got: list[TurnOutcome] = []
    done = threading.Event()
    agent = runtime.session("t").harness.agent
    agent.run_turn(TurnRequest(turn_id="turn-1", cast_id="c", socket_id="s", visit=1, prompt="secret prompt",
                               summary="doing it"), lambda outcome: (got.append(outcome), done.set()))
    assert done.wait(10)
    assert asked[0]["prompt"] == "secret prompt" and asked[0]["summary"] == "doing it"
    assert got[0].text == "done" and got[0].stop_reason == "stop"
    assert got[0].usage.input_tokens == 3 and got[0].usage.cost_usd is None  # unknown stays None
    with pytest.raises(NotFound):  # answered once; a duplicate is refused
        client.call("agent.turn_ended", {"session_id": "t", "turn_id": "turn-1", "text": "again"})


def test_session_entries_and_ui_go_to_the_harness(served):
    runtime, connect, _ = served
    client = connect()
    entries, notes = [], []
    client.on_request("session.append_entry", lambda p: (entries.append(p), {"ok": True, "entry_id": "e1"})[1])
    client.on_notification("ui.notify", notes.append)
    client.call("session.open", {"session_id": "u", "cwd": "/tmp"})
    link = runtime.session("u").harness
    import time

    link.session_log.append_entry("castor-test", {"a": 1}, time.monotonic() + 5)
    assert entries == [{"custom_type": "castor-test", "data": {"a": 1}}]
    link.ui.notify("hello", "warning")
    assert poll_until(lambda: notes == [{"message": "hello", "level": "warning"}])


def test_ops_actors_and_mailbox_show_the_live_tree(served):
    runtime, connect, _ = served
    client = connect()
    client.call("session.open", {"session_id": "o", "cwd": "/tmp"})
    tree = client.call("ops.actors", {})
    paths = [a["path"] for a in tree["actors"]]
    assert "/root" in paths and "/root/session/o" in paths and "/root/session/o/probe" in paths
    box = client.call("ops.mailbox", {"path": "/root/session/o/probe"})
    assert box["path"] == "/root/session/o/probe" and box["mailbox"]["depth"] == 0
    stats = client.call("ops.worker", {})
    assert stats["runtime"]["pid"] > 0 and stats["runtime"]["rss_bytes"] > 0


def test_ops_actors_lists_the_endpoints_named_threads(served):
    runtime, connect, _ = served
    client = connect()
    threads = client.call("ops.actors", {})["threads"]
    by_name = {t["name"]: t for t in threads}
    accept = by_name["castor-accept"]
    assert accept["owner"] == "/endpoint" and accept["purpose"] and accept["daemon"] is True
    per_connection = [t for t in threads if t["owner"].startswith("/endpoint/")]
    assert any(t["name"].endswith("-writer") for t in per_connection)
    assert any(t["purpose"] == "read and dispatch this connection's frames" for t in per_connection)


def test_ops_fault_is_forbidden_without_allow_faults(served):
    runtime, connect, _ = served
    client = connect()
    client.call("session.open", {"session_id": "f", "cwd": "/tmp"})
    with pytest.raises(Forbidden):
        client.call("ops.fault", {"kind": "kill", "path": "/root/session/f/probe"})


@pytest.mark.parametrize("served", [True], indirect=True)
def test_ops_fault_kills_and_the_supervisor_restarts(served):
    runtime, connect, journal = served
    client = connect()
    client.call("session.open", {"session_id": "k", "cwd": "/tmp"})
    probe = runtime.system.lookup("/root/session/k/probe")
    assert client.call("ops.fault", {"kind": "kill", "path": probe.path}) == {"injected": "kill", "path": probe.path}
    assert probe.ask(Ping(n=2), timeout=5) == ("probe-k", 2, 2)
    client.call("ops.fault", {"kind": "crash_next", "path": probe.path, "message_type": "test.ping"})
    with pytest.raises(ActorCrashed):
        probe.ask(Ping(n=3), timeout=5)
    assert probe.ask(Ping(n=4), timeout=5)[1] == 3
    for seconds in (0, float("nan"), float("inf"), 601):
        with pytest.raises(InvalidParams):
            client.call("ops.fault", {"kind": "delay_next", "path": probe.path, "seconds": seconds})
    probe.ask(Ping(n=5), timeout=5)  # nothing was injected: answered at once, no crash


@pytest.mark.parametrize("served", [True], indirect=True)
def test_ops_fault_refuses_a_kill_that_no_incarnation_would_carry_out(served):
    """A kill of a retired actor was answered ``injected`` and dropped: the operator was told of a
    crash that never came. It is refused ``actor_stopped``, nothing injected."""
    runtime, connect, _ = served
    client = connect()
    client.call("session.open", {"session_id": "r", "cwd": "/tmp"})
    probe = runtime.system.lookup("/root/session/r/probe")
    client.call("ops.fault", {"kind": "retire", "path": probe.path, "reason": "drill"})
    assert poll_until(lambda: not probe.alive)
    for kind in ("kill", "retire"):
        with pytest.raises(ActorStopped) as refused:
            client.call("ops.fault", {"kind": kind, "path": probe.path})
        assert refused.value.data["path"] == probe.path and refused.value.data["state"] == "retired"
    assert probe.ask(Ping(n=1), timeout=5) == ("probe-r", 2, 1)  # new demand: a fresh incarnation, not killed


@pytest.mark.parametrize("served", [True], indirect=True)
def test_ops_fault_refuses_to_kill_a_cast_host_already_lost(served):
    """``kill_host`` of a host the Ray backend had already taken for lost (its node gone) was
    answered ``injected``: the drill's operator counted a fault that never happened."""
    from types import SimpleNamespace

    runtime, connect, _ = served
    killed: list[str] = []
    runtime.scaleout = SimpleNamespace(hosts={"host-1": SimpleNamespace(alive=False),
                                              "host-2": SimpleNamespace(alive=True)}, kill_host=killed.append)
    client = connect()
    with pytest.raises(ActorStopped) as refused:
        client.call("ops.fault", {"kind": "kill_host", "path": "host-1"})
    assert refused.value.data == {"path": "host-1", "state": "lost"}
    assert client.call("ops.fault", {"kind": "kill_host", "path": "host-2"}) == {"injected": "kill_host",
                                                                                  "path": "host-2"}
    assert killed == ["host-2"]


@pytest.mark.timeout(60)
def test_a_session_whose_supervisor_gave_up_or_whose_parent_restarted_can_be_opened_again(tmp_path):
    """docs/reliability.md: after a session's supervisor gives up, the harness opens it again."""
    from castor.composition import materia_component
    from castor.runtime import HarnessLink, Runtime, RuntimeSettings, SessionInfo
    from castor.supervision import faults
    from tests.support.waiting import wait_for

    rt = Runtime(RuntimeSettings(allow_faults=True), components=[materia_component()])
    try:
        info = SessionInfo(session_id="s1", cwd=str(tmp_path))
        rt.open_session(info, HarnessLink(agent=None, session_log=None, ui=None))
        session_handle = rt.system.lookup("/root/session/s1")
        faults.kill(session_handle, "test: the session supervisor dies for good (temporary child)")
        wait_for(lambda: not rt.has_session("s1"), timeout=10, what="the session to be gone")
        rt.open_session(info, HarnessLink(agent=None, session_log=None, ui=None))  # no conflict
        assert rt.has_session("s1")
        parent = rt.system.lookup("/root/session")
        faults.kill(parent, "test: the sessions supervisor restarts without its dynamic children")
        wait_for(lambda: rt.system.find("/root/session/s1") is None, timeout=10, what="s1 lost with its parent")
        wait_for(lambda: rt.system.find("/root/session") is not None and rt.system.lookup("/root/session").alive,
                 timeout=10, what="the restarted parent")
        rt.open_session(info, HarnessLink(agent=None, session_log=None, ui=None))
        assert rt.has_session("s1")
    finally:
        rt.shutdown(10)


@pytest.mark.timeout(60)
def test_a_connection_that_closes_after_its_session_gave_up_leaves_the_reopened_session_alone(tmp_path):
    """Connection A's session gives up, connection B opens the same id again: A's entry drives
    nothing of B's session (``forbidden``), and neither A's ``session.close`` nor its disconnect
    closes it."""
    from castor.supervision import faults
    from tests.support.waiting import wait_for

    journal = Journal()
    runtime = Runtime(RuntimeSettings(allow_faults=True), components=[_probe_component(journal)])
    sock = str(tmp_path / "castor.sock")
    server = Server(build_dispatcher(runtime), unix_path=sock).start()
    first = Client.connect_unix(sock)
    second: Client | None = None
    try:
        first.call("session.open", {"session_id": "g1", "cwd": "/tmp", "trusted": False})
        (conn_a,) = server.connections()
        cleaned = threading.Event()
        conn_a.add_close_callback(lambda _c: cleaned.set())  # runs after the session's own close hook
        faults.kill(runtime.system.lookup("/root/session/g1"), "test: the session supervisor gives up")
        wait_for(lambda: not runtime.has_session("g1"), timeout=10, what="the session to be gone")
        second = Client.connect_unix(sock)
        second.call("session.open", {"session_id": "g1", "cwd": "/tmp", "trusted": False})
        reopened = runtime.session("g1")
        with pytest.raises(Forbidden):  # A's stale entry drives nothing of B's session
            first.call("harness.event", {"session_id": "g1", "event": "turn_start", "data": {}})
        assert first.call("session.close", {"session_id": "g1"}) == {"closed": True}  # A's own entry only
        assert runtime.session("g1") is reopened and runtime.has_session("g1")
        first.call("session.open", {"session_id": "g2", "cwd": "/tmp", "trusted": False})
        first.close()
        assert cleaned.wait(10)
        assert not runtime.has_session("g2")  # A's disconnect did close what A still had open
        assert runtime.session("g1") is reopened and runtime.has_session("g1")
        assert journal.count("closed", "g1") == 0
        seen = second.call("harness.event", {"session_id": "g1", "event": "turn_start", "data": {}})
        assert seen["seen"] == "turn_start"
    finally:
        first.close()
        if second is not None:
            second.close()
        server.stop()
        runtime.shutdown(10)


@pytest.mark.timeout(60)
def test_a_session_reopened_while_its_close_was_finishing_keeps_its_entry(tmp_path, monkeypatch):
    """A close stops the session's actors, then forgets the id; a reopen that lands between the
    two (the old actors are gone, so it is allowed) must not be forgotten by the old close."""
    from castor.composition import materia_component
    from castor.runtime import HarnessLink, Runtime, RuntimeSettings, SessionInfo

    rt = Runtime(RuntimeSettings(), components=[materia_component()])
    try:
        info = SessionInfo(session_id="r1", cwd=str(tmp_path))
        rt.open_session(info, HarnessLink(agent=None, session_log=None, ui=None))
        real_stop = rt.system.stop_child
        reopened: list[object] = []

        def stop_then_reopen(path: str, **kw):
            real_stop(path, **kw)
            if not reopened:
                reopened.append(rt.open_session(info, HarnessLink(agent=None, session_log=None, ui=None)))

        monkeypatch.setattr(rt.system, "stop_child", stop_then_reopen)
        rt.close_session("r1")
        monkeypatch.setattr(rt.system, "stop_child", real_stop)
        assert reopened and rt.session("r1") is reopened[0] and rt.has_session("r1")
    finally:
        rt.shutdown(10)


@pytest.mark.timeout(60)
def test_a_session_open_that_timed_out_does_not_hold_its_id_forever(tmp_path):
    """The sessions supervisor answered too late: the child it then starts is stopped, so the
    id can be opened again."""
    from castor.composition import materia_component
    from castor.messages.errors import Timeout
    from castor.runtime import HarnessLink, Runtime, RuntimeSettings, SessionInfo
    from castor.supervision import faults
    from tests.support.waiting import wait_for

    rt = Runtime(RuntimeSettings(allow_faults=True, session_open_timeout_s=0.5), components=[materia_component()])
    try:
        faults.delay_next(rt.system.lookup("/root/session"), 1.5)
        info = SessionInfo(session_id="d1", cwd=str(tmp_path))
        with pytest.raises(Timeout):
            rt.open_session(info, HarnessLink(agent=None, session_log=None, ui=None))
        sessions = rt.system.lookup("/root/session")

        def settled() -> bool:  # the delayed StartChild and the StopChild that follows it are both done
            box = sessions.snapshot().mailbox
            return box.depth == 0 and box.in_flight is None and box.processed >= 2

        wait_for(settled, timeout=20, what="the sessions supervisor to handle the late start and its stop")
        assert rt.system.find("/root/session/d1") is None and not rt.has_session("d1")
        rt.open_session(info, HarnessLink(agent=None, session_log=None, ui=None))
        assert rt.has_session("d1")
    finally:
        rt.shutdown(10)


@pytest.mark.parametrize("served", [True], indirect=True)
def test_a_peer_that_leaves_during_its_session_open_does_not_wedge_later_opens(served, tmp_path):
    """The open runs on after its peer left (here the sessions supervisor is held 3 s; the
    connection's end-of-stream drain is shorter): the connection is closed when the open returns,
    so its close hook runs at once. It used to run under the lock the open held and take that lock
    again: every later session.open, close and disconnect, of every client, hung."""
    import socket

    import msgpack

    from castor.supervision import faults
    from tests.support.waiting import wait_for

    runtime, connect, journal = served
    faults.delay_next(runtime.system.lookup("/root/session"), 3.0)  # longer than the 2 s drain
    leaver = socket.socket(socket.AF_UNIX)
    leaver.connect(str(tmp_path / "castor.sock"))
    leaver.sendall(msgpack.packb([0, 1, "session.open", [{"session_id": "left", "cwd": str(tmp_path)}]]))
    leaver.close()
    wait_for(lambda: ("closed", "left") in journal.entries, timeout=15,
             what="the session of the peer that left closed when its open returned")
    client = connect()
    opened = client.call("session.open", {"session_id": "later", "cwd": str(tmp_path)}, timeout=5)
    assert opened["session_id"] == "later"
    assert client.call("session.close", {"session_id": "later"}, timeout=5) == {"closed": True}


def test_a_session_closed_while_the_runtime_closes_every_session_is_no_failure(tmp_path):
    """``castor serve`` stopping closes every session while a harness may close its own (Pi quits
    at the same moment): the one already gone is skipped. It was logged as an ERROR "closing
    session … failed" with a ``not_found`` traceback."""
    from loguru import logger

    from castor.runtime import HarnessLink, SessionInfo

    journal = Journal()
    rt_box: list[Runtime] = []
    component = _probe_component(journal)

    def on_close(ctx):  # the first session's close races the second's own close, which wins
        journal.add("closed", ctx.info.session_id)
        if ctx.info.session_id == "first" and rt_box[0].has_session("second"):
            rt_box[0].close_session("second")

    rt = Runtime(RuntimeSettings(), components=[SessionComponent("probe", component.children, component.on_event,
                                                                 on_close)])
    rt_box.append(rt)
    errors: list[str] = []
    sink = logger.add(lambda m: errors.append(str(m)), level="WARNING")
    try:
        for sid in ("first", "second"):
            rt.open_session(SessionInfo(session_id=sid, cwd=str(tmp_path)), HarnessLink(agent=None, session_log=None,
                                                                                        ui=None))
        rt.close_sessions(10)
        assert not rt.sessions() and errors == []
    finally:
        logger.remove(sink)
        rt.shutdown(10)


@pytest.mark.timeout(30)
def test_a_session_closed_twice_at_once_is_closed_once_and_its_close_hooks_are_not_cut_short(tmp_path):
    """``castor serve`` stopping (SIGTERM) while the harness closes its session: both closes ran the
    close hooks, and the second stopped the session's actors while the first's hooks still ran --
    Icarus's ``on_session_end`` was killed mid-call in the worker (seen by an operator at
    teardown). Now the second close waits for the first, whose hooks run to their end, once."""
    from castor.runtime import HarnessLink, SessionInfo

    journal = Journal()
    component = _probe_component(journal)
    entered, release = threading.Event(), threading.Event()
    stopped_under_hook: list[bool] = []
    rt_box: list[Runtime] = []

    def on_close(ctx):  # a close hook that takes a while (on_session_end in the worker)
        journal.add("closed", ctx.info.session_id)
        entered.set()
        release.wait(10)
        handle = rt_box[0].system.registry.find(ctx.path)
        stopped_under_hook.append(handle is None or not handle.alive)

    rt = Runtime(RuntimeSettings(), components=[SessionComponent("probe", component.children, component.on_event,
                                                                 on_close)])
    rt_box.append(rt)
    try:
        rt.open_session(SessionInfo(session_id="s", cwd=str(tmp_path)), HarnessLink(agent=None, session_log=None,
                                                                                     ui=None))
        first = threading.Thread(target=rt.close_session, args=("s",))
        first.start()
        assert entered.wait(10)
        second_done = threading.Event()
        second = threading.Thread(target=lambda: (rt.close_session("s", timeout=10), second_done.set()))
        second.start()
        assert not second_done.wait(0.3)  # it waits for the first close, stopping nothing under it
        release.set()
        first.join(10)
        second.join(10)
        assert second_done.is_set() and not rt.sessions()
        assert journal.entries.count(("closed", "s")) == 1 and stopped_under_hook == [False]
    finally:
        release.set()
        rt.shutdown(10)

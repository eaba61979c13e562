"""The Icarus methods over a real msgpack-rpc endpoint (Server + Client on loopback TCP).

The client plays the harness: it answers ``session.append_entry``, ``model.list`` and
``classifier.complete`` (a TEST FAKE classifier that rejects candidates mentioning
"cake") and records ``message.send`` / ``ui.*`` notifications. The backend is the
reference stand-in in real worker subprocesses.
"""

from __future__ import annotations

import json
import os
import signal
import threading
from typing import Any

import pytest

from castor.client import Client
from castor.messages.errors import CastorError
from tests.support.icarus import gone, serve_icarus_on_loopback, wait_until


class FakeHarness:
    """TEST FAKE of the harness side of the protocol (what the Pi extension does)."""

    def __init__(self, client: Client) -> None:
        self.entries: list[dict[str, Any]] = []
        self.notes: list[tuple[str, dict[str, Any]]] = []
        self.noted = threading.Condition()
        client.on_request("session.append_entry", self.append_entry)
        client.on_request("model.list", lambda _p: {"models": [
            {"provider": "ollama", "id": "qwen3:4b", "base_url": "http://127.0.0.1:11434/v1", "available": True}],
            "current": None})
        client.on_request("classifier.complete", self.complete)
        for method in ("message.send", "ui.notify", "ui.status"):
            client.on_notification(method, lambda p, m=method: self.note(m, p))

    def append_entry(self, params: dict[str, Any]) -> dict[str, Any]:
        self.entries.append(params)
        return {"ok": True, "entry_id": f"e{len(self.entries)}"}

    def complete(self, params: dict[str, Any]) -> dict[str, Any]:
        payload = json.loads(params["messages"][-1]["content"])
        decisions = [{"id": c["id"], "relevant": "cake" not in c["text"], "confidence": 0.9}
                     for c in payload["candidates"]]
        return {"text": json.dumps({"decisions": decisions}), "stop_reason": "stop", "usage": None}

    def note(self, method: str, params: dict[str, Any]) -> None:
        with self.noted:
            self.notes.append((method, params))
            self.noted.notify_all()

    def wait_note(self, method: str, timeout: float = 10.0) -> dict[str, Any]:
        with self.noted:
            assert self.noted.wait_for(lambda: any(m == method for m, _ in self.notes), timeout), method
            return next(p for m, p in self.notes if m == method)


@pytest.fixture
def wired(world):
    rt = world.runtime()
    server = serve_icarus_on_loopback(rt, "t" * 32)
    host, port = server.address
    clients: list[Client] = []

    def connect() -> tuple[Client, FakeHarness]:
        client = Client.connect_tcp(host, port, default_timeout=20, token="t" * 32)
        clients.append(client)
        return client, FakeHarness(client)

    connect.server = server  # type: ignore[attr-defined]  # for the tests that reach the server's connections
    yield world, connect
    for client in clients:
        client.close()
    server.stop()


def open_session(client: Client, world, sid: str = "pi-1") -> None:
    client.call("session.open", {"session_id": sid, "cwd": str(world.project), "trusted": False,
                                 "flags": {"harness": "pi", "has_agent_settled": True}})


def test_a_pi_shaped_session_gets_startup_context_filtered_memory_and_an_audit(wired):
    world, connect = wired
    world.env["ICARUS_REF_STARTUP_CONTEXT"] = "[startup] STARTUP-CTX"
    world.seed(("sqlite WAL notes", "WAL"), ("chocolate cake recipe", "eggs"))
    client, harness = connect()
    open_session(client, world)
    config = client.call("icarus.config", {"session_id": "pi-1"})
    names = {t["name"] for t in config["tools"]}
    assert config["state"] == "active" and {"fabric_write", "fabric_recall", "icarus_hook_config"} <= names
    assert all(set(t) >= {"name", "description", "parameters"} for t in config["tools"])

    assert client.call("harness.event", {"session_id": "pi-1", "event": "session_start",
                                         "data": {"reason": "startup", "previous_session_file": None}}) == {}
    startup = harness.wait_note("message.send")
    assert (startup["custom_type"], startup["content"], startup["trigger_turn"]) == \
        ("icarus-session-context", "[startup] STARTUP-CTX", False)

    result = client.call("harness.event", {"session_id": "pi-1", "event": "before_agent_start", "data": {
        "prompt": "sqlite and cake please", "message_type": "user", "custom_type": None, "turn_id": None,
        "system_prompt": "sys", "images": 0}})
    message = result["message"]
    assert message["custom_type"] == "icarus-memory-context"
    assert "sqlite WAL notes" in message["content"] and "cake" not in message["content"]
    # the audit was acknowledged by the harness before the result came back
    [entry] = harness.entries
    assert entry["custom_type"] == "icarus-context-filter" and entry["data"]["outcome"] == "filtered"
    assert "sqlite WAL" not in json.dumps(entry) and "please" not in json.dumps(entry)

    pid = client.call("ops.worker", {"session_id": "pi-1"})["worker"]["process"]["pid"]
    assert client.call("harness.event", {"session_id": "pi-1", "event": "session_shutdown",
                                         "data": {"reason": "quit"}}) == {}
    assert client.call("session.close", {"session_id": "pi-1"}) == {"closed": True}
    assert len(world.calls("hooks.on_session_end")) == 1
    wait_until(lambda: gone(pid), 5, "the worker to be killed")


def test_fabric_tools_round_trip_errors_are_typed_and_kill_9_is_surfaced(wired):
    world, connect = wired
    client, _ = connect()
    open_session(client, world)
    call = lambda name, params, **kw: client.call("icarus.tool", {"session_id": "pi-1", "name": name,  # noqa: E731 - a short local helper
                                                                  "params": params, "tool_call_id": "t1", **kw})
    written = call("fabric_write", {"type": "note", "summary": "WIRE-WRITE", "content": "x"})
    assert written["status"] == "written"
    as_result = call("fabric_curate", {"entry_id": "404", "training_value": "low"}, format="result")
    assert as_result["is_error"] is True and as_result["isError"] is True and "error" in as_result["details"]
    assert json.loads(as_result["content"][0]["text"]) == as_result["details"]
    ok = call("fabric_search", {"query": "WIRE-WRITE"}, format="result")
    assert "isError" not in ok and ok["is_error"] is False  # Pi's key only on an error
    assert "requires evidence" in call("fabric_write", {"type": "n", "summary": "s", "content": "c",
                                                        "verified": "yes"})["error"]
    with pytest.raises(CastorError) as unknown:
        call("fabric_train", {})
    assert unknown.value.code == "not_found"

    whole = client.call("ops.worker", {"session_id": "pi-1"})
    stats = whole["worker"]
    process = stats["process"]
    assert process["alive"] is True and process["rss_bytes"] > 0 and process["open_files"] is not None
    # `castor inspect worker --session-id` draws it as a table (it printed the raw JSON text).
    import io

    from castor.console.terminal import terminal_console, worker_table

    out = io.StringIO()
    terminal_console(out).print(worker_table(whole))
    drawn = out.getvalue()
    assert str(process["pid"]) in drawn, drawn
    for row in ("castor pid", "castor memory (RSS)", "session", "worker actor", "doing now", "workers started",
                "worker memory (RSS)", "worker calls served"):
        assert row in drawn, drawn
    assert "{" not in drawn, drawn
    os.kill(process["pid"], signal.SIGKILL)
    wait_until(lambda: gone(process["pid"]), 5, "the worker to die")
    # An idle worker's death loses nothing: the next call runs on a fresh worker.
    assert call("fabric_brief", {})["recent"] == ["WIRE-WRITE"]
    assert client.call("ops.worker", {"session_id": "pi-1"})["worker"]["process"]["pid"] != process["pid"]
    assert client.call("ops.worker", {"session_id": "pi-1"})["worker"]["process"]["pid"] != process["pid"]


def test_icarus_off_over_the_wire_and_another_connection_is_forbidden(wired):
    world, connect = wired
    world.seed(("sqlite WAL notes", "WAL"))
    client, _ = connect()
    open_session(client, world)
    event = lambda: client.call("harness.event", {"session_id": "pi-1", "event": "before_agent_start",  # noqa: E731 - a short local helper
                                                  "data": {"prompt": "sqlite", "message_type": "user"}})
    assert "message" in event()
    off = client.call("icarus.command", {"session_id": "pi-1", "cwd": str(world.project), "args": "off"})
    assert "hooks are off" in off["text"]
    assert event() == {}
    assert len(world.calls("hooks.pre_llm_call")) == 1
    bad = client.call("icarus.command", {"session_id": "pi-1", "args": "context default hide moon"})
    assert (bad["level"], bad["code"]) == ("warning", "invalid_command")

    other, _ = connect()
    for method, params in (("icarus.tool", {"name": "fabric_brief", "params": {}}), ("icarus.config", {}),
                           ("icarus.command", {"args": "on"})):
        with pytest.raises(CastorError) as refused:
            other.call(method, {"session_id": "pi-1", **params})
        assert refused.value.code == "forbidden"
    with pytest.raises(CastorError) as missing:
        client.call("icarus.config", {"session_id": "nope"})
    assert missing.value.code == "not_found"
    with pytest.raises(CastorError) as invalid:
        client.call("icarus.tool", {"session_id": "pi-1", "name": "fabric_brief", "params": [], "extra": 1})
    assert invalid.value.code == "invalid_params"


def _before_agent_start(prompt: str) -> dict[str, Any]:
    return {"session_id": "pi-lane", "event": "before_agent_start", "data": {"prompt": prompt, "message_type": "user"}}


def test_hooks_over_the_wire_make_their_worker_calls_on_the_thread_that_reads_them(wired):
    """The asking thread makes a hook's worker call itself when the lane is idle: no hand-off to
    the lane's thread and back, so that thread is never even started for these events."""
    from castor.supervision.threads import running_threads

    world, connect = wired
    topics = ("sqlite", "zebra", "giraffe")
    world.seed(*((f"{topic} notes", topic) for topic in topics))
    client, _ = connect()
    open_session(client, world, "pi-lane")
    client.call("harness.event", {"session_id": "pi-lane", "event": "session_start", "data": {"reason": "startup"}})
    for topic in topics:
        assert f"{topic} notes" in client.call("harness.event", _before_agent_start(topic))["message"]["content"]
    assert len(world.calls("hooks.pre_llm_call")) == 3 and len(world.calls("hooks.on_session_start")) == 1
    lanes = [t for t in running_threads("/root/session/pi-lane") if t["name"] == "icarus-hook-lane"]
    assert lanes == []



def _hold_a_retrieval(world, connect, sleep_ms: int, *more_notes: tuple[str, str]) -> tuple[Any, Any]:
    """A started "pi-lane" session whose before_agent_start ("sqlite") is in its worker call for
    ``sleep_ms``; returns (the client, the pending call) once the worker runs it."""
    world.seed(("sqlite WAL notes", "WAL"), *more_notes)
    client, _ = connect()
    open_session(client, world, "pi-lane")
    client.call("harness.event", {"session_id": "pi-lane", "event": "session_start", "data": {"reason": "startup"}})
    world.controls({"hooks.pre_llm_call": {"sleep_ms": sleep_ms}})
    pending = client.call_async("harness.event", _before_agent_start("sqlite"), timeout=30)
    wait_until(lambda: world.calls("hooks.pre_llm_call"), what="the retrieval running in the worker")
    return client, pending

def test_a_hook_whose_retrieval_hangs_is_answered_at_once_by_icarus_off_on_the_same_connection(wired):
    """The hook's worker call runs on the connection's reading thread; an /icarus off read meanwhile
    (by the worker that takes the reading over) answers the waiting hook at once -- the early
    answer -- long before the retrieval returns; the connection and the next hooks carry on."""
    import time

    world, connect = wired
    client, pending = _hold_a_retrieval(world, connect, 4000, ("zebra notes", "stripes"))
    started = time.monotonic()
    off = client.call("icarus.command", {"session_id": "pi-lane", "args": "off"}, timeout=5)
    assert "hooks are off" in off["text"]
    assert pending.result() == {}  # answered None (no memory) at the invalidation
    assert time.monotonic() - started < 2.0  # not after the 4 s retrieval
    assert not world.calls("hooks.pre_llm_call", phase="end")  # it is still running
    world.controls({})
    assert client.call("harness.event", _before_agent_start("sqlite"), timeout=20) == {}  # hooks are off
    client.call("icarus.command", {"session_id": "pi-lane", "args": "on"}, timeout=20)
    assert "zebra notes" in client.call("harness.event", _before_agent_start("zebra"), timeout=20)["message"]["content"]


def test_the_hooks_say_what_they_do_while_a_retrieval_runs(wired):
    """An operator's `castor inspect` shows the HookController retrieving memories for a prompt
    while the worker call runs (it read "idle"); request ids and stages only, never the prompt."""
    world, connect = wired
    _client, pending = _hold_a_retrieval(world, connect, 3000)
    watcher, _ = connect()
    actors = watcher.call("ops.actors", {"prefix": "/root/session/pi-lane"})["actors"]
    (hooks,) = [a for a in actors if a["kind"] == "HookController"]
    activity = hooks["activity"]
    assert activity is not None and activity["text"] == "retrieving memories for a prompt", hooks
    assert activity["data"]["stages"] == "prompt:worker" and "sqlite" not in str(activity)
    # and how long until the worker call's deadline ends it (the worker is killed then)
    assert activity["deadline_in_s"] is not None and 0 < activity["deadline_in_s"] <= 3600
    world.controls({})
    pending.result()

    def hook_kinds() -> list[str]:
        after = watcher.call("ops.actors", {"prefix": "/root/session/pi-lane"})["actors"]
        return [a["activity"]["kind"] for a in after if a["kind"] == "HookController"]

    # The answer goes out before the actor's bookkeeping ends its turn: idle a moment after it.
    wait_until(lambda: hook_kinds() == ["idle"], timeout=5, what="the HookController idle after its answer")


def test_a_tool_result_with_an_integer_wider_than_64_bits_reaches_the_harness_as_a_number(wired):
    """A backend's 128-bit id in a tool's result made the response unserialisable: the harness got
    ``internal`` after the backend had written (and might retry the write). It is sent as the
    nearest double, what pi-icarus-hook's JSON.parse holds."""
    world, connect = wired
    world.env["ICARUS_REF_CONTROLS"] = json.dumps({"tools.fabric_write": {
        "result_json": '{"status": "written", "id": 24197857161011715162171839636988778104, "n": 7}'}})
    client, _ = connect()
    open_session(client, world)
    written = client.call("icarus.tool", {"session_id": "pi-1", "name": "fabric_write", "tool_call_id": "t1",
                                          "params": {"type": "note", "summary": "s", "content": "c"}})
    assert written == {"status": "written", "id": 2.4197857161011715e37, "n": 7}
    assert len(world.calls("tools.fabric_write")) == 1


def test_a_shutdown_during_a_retrieval_ends_it_and_runs_on_session_end_at_once(wired):
    """Quitting while a retrieval runs: the shutdown answers the waiting hook and nobody wants the
    retrieval's result, yet on_session_end queued behind it, so the quit waited for the whole
    retrieval (20 s and more). The retrieval is now stopped (its worker with it) and
    on_session_end runs at once on a fresh worker."""
    import time

    world, connect = wired
    client, pending = _hold_a_retrieval(world, connect, 20_000)
    first_pid = world.calls("hooks.pre_llm_call")[0]["pid"]
    started = time.monotonic()
    assert client.call("harness.event", {"session_id": "pi-lane", "event": "session_shutdown",
                                         "data": {"reason": "quit"}}, timeout=10) == {}
    took = time.monotonic() - started
    assert pending.result() == {}
    assert took < 3.0, f"the shutdown waited {took:.1f} s behind the retrieval"
    [ended] = world.calls("hooks.on_session_end")
    assert ended["pid"] != first_pid and not world.calls("hooks.pre_llm_call", phase="end")
    wait_until(lambda: gone(first_pid), 5, "the retrieval's worker to be stopped")


def test_the_harness_gets_the_footer_at_each_state_change_and_the_first_prompt_after_it(wired):
    """The footer over the wire (hook_controller, "The footer"): with the session's start and its
    first prompt, not again at every prompt; again after ``/icarus off`` and ``on``, and on a new
    connection's session (a reconnect) at its first prompt, with no ``session_start`` before it."""
    world, connect = wired
    footer, cleared = {"key": "icarus", "text": "🪽 Icarus"}, {"key": "icarus", "text": None}

    def harness() -> tuple[Client, list[dict[str, Any]]]:
        client, _ = connect()
        seen: list[dict[str, Any]] = []
        # On the reading thread: a status sent before a response is recorded when the call returns.
        client.on_notification("ui.status", seen.append, on_reading_thread=True)
        open_session(client, world)
        return client, seen

    def prompt(client: Client) -> None:
        client.call("harness.event", {"session_id": "pi-1", "event": "before_agent_start",
                                      "data": {"prompt": "sqlite", "message_type": "user"}})

    def taken(seen: list[dict[str, Any]]) -> list[dict[str, Any]]:
        out = list(seen)
        seen.clear()
        return out

    client, seen = harness()
    client.call("harness.event", {"session_id": "pi-1", "event": "session_start", "data": {"reason": "startup"}})
    assert taken(seen) == [footer]
    for _ in range(3):
        prompt(client)
    assert taken(seen) == [footer]  # the first prompt's; the others repeat nothing
    for args in ("off", "on"):
        client.call("icarus.command", {"session_id": "pi-1", "args": args})
    prompt(client)
    prompt(client)
    assert taken(seen) == [cleared, footer, footer]
    assert client.call("session.close", {"session_id": "pi-1"}) == {"closed": True}
    closing = taken(seen)
    assert closing and all(status == cleared for status in closing)  # the shutdown's, and the close's own

    again, seen_again = harness()  # the harness reconnected: its footer is sent at the first prompt
    prompt(again)
    prompt(again)
    assert taken(seen_again) == [footer]


@pytest.mark.timeout(60)
def test_a_settings_write_on_a_full_disk_is_storage_unavailable_not_internal(wired, monkeypatch):
    """`/icarus context default hide` writes the global settings; on a full disk the atomic write's
    OSError left the handler as it was, and the dispatcher answered ``internal`` (castor's own bug,
    with an error id and a traceback in the log). It is the storage's refusal: ``storage_unavailable``
    naming the file and the errno, and the settings file as it was."""
    import errno

    from castor.adapters import fs

    world, connect = wired
    client, _ = connect()
    open_session(client, world)
    before = world.global_path.read_bytes() if world.global_path.exists() else None
    real = fs._write_all
    under = str(world.agent_dir.resolve())

    def full(fd: int, data: bytes) -> None:
        if os.readlink(f"/proc/self/fd/{fd}").startswith(under):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        real(fd, data)

    monkeypatch.setattr(fs, "_write_all", full)
    with pytest.raises(CastorError) as refused:
        client.call("icarus.command", {"session_id": "pi-1", "args": "context default hide"})
    assert refused.value.code == "storage_unavailable", refused.value.to_wire()
    assert refused.value.data["errno"] == "ENOSPC" and refused.value.data["path"].endswith("settings.json"), \
        refused.value.to_wire()
    after = world.global_path.read_bytes() if world.global_path.exists() else None
    assert after == before
    assert [p.name for p in world.agent_dir.iterdir() if p.name.endswith(".tmp")] == []


@pytest.mark.timeout(60)
def test_a_write_that_finds_the_peer_gone_on_the_hooks_thread_still_ends_the_icarus_session_at_once(wired):
    """A harness killed mid-hook: the first frame castor writes after it died fails, and that
    write closes the connection. Here the writer is the HookController itself, on its own thread:
    the audit was acknowledged, the filtered context comes back to it (``FilterDone``) and its
    reply answers the waiting hook early. The close used to run the connection's close callbacks
    on that very thread -- closing the session, whose Icarus shutdown asks the HookController the
    thread was still handling a message for: the ask waited its whole bound (timeoutMs + 3 s),
    on_session_end never reached the worker, the hooks actor looked stuck, and stopping the
    session then waited for that handler too. The callbacks of a close that a failed write
    caused now run on a thread of their own."""
    import errno
    import time

    world, connect = wired
    world.seed(("sqlite WAL notes", "WAL"))
    client, harness = connect()
    open_session(client, world, "pi-lane")
    client.call("harness.event", {"session_id": "pi-lane", "event": "session_start", "data": {"reason": "startup"}})
    [conn] = [c for c in connect.server.connections() if not c.closed]
    broken = threading.Event()
    send_nowait = conn.transport.send_nowait

    def failing_send(data):  # the peer died (RST): every write fails; the reader saw no EOF yet
        if broken.is_set():
            raise BrokenPipeError(errno.EPIPE, "Broken pipe")
        return send_nowait(data)

    conn.transport.send_nowait = failing_send
    append_entry = harness.append_entry

    def acknowledge_then_die(params):
        broken.set()  # from here on castor's next write finds the peer gone
        return append_entry(params)

    client.on_request("session.append_entry", acknowledge_then_die)
    pending = client.call_async("harness.event", _before_agent_start("sqlite"), timeout=30)
    assert broken.wait(10), "the audit was never asked for"
    started = time.monotonic()
    wait_until(lambda: world.calls("hooks.on_session_end"), timeout=8,
               what="on_session_end to reach the worker after the connection's write failed")
    wait_until(lambda: not world.runtimes[0].has_session("pi-lane"), timeout=8, what="the session to close")
    assert time.monotonic() - started < 8.0
    assert conn.closed and (conn.close_reason or "").startswith("write failed")
    with pytest.raises(CastorError):
        pending.result()


_KILL_POINTS = ("after_open", "after_start", "mid_request", "in_classifier", "in_audit", "on_startup_message",
                "after_classifier", "after_audit")


def _killed(client: Client) -> None:
    """The harness process dies: its socket is reset (SO_LINGER 0), no session.close is sent."""
    import socket

    fd = client.connection.transport.read_fd
    raw = socket.socket(fileno=os.dup(fd))  # a duplicate of the same socket, to set its option
    try:
        raw.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
    finally:
        raw.close()
    client.connection.transport.close()


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_harnesses_killed_at_random_points_mid_hook_leave_no_session_and_every_session_ends(wired):
    """Stress: short-lived harness connections killed (socket reset, no session.close) at each of
    these points twice, in an order chosen at random -- right after the open, after session_start,
    with a prompt's hook in flight, inside castor's classifier or audit request or right after
    answering it, on the startup message. Each point that is a request or a notification from
    castor is hit exactly (the harness dies inside its handler, or once its answer left).
    Every session must be closed, and its Icarus session ended (on_session_end in the worker),
    within a bound well under the hooks' own (timeoutMs + 3 s): a close that waited for a hooks
    actor its own thread was handling stalls one of these for its whole bound."""
    import random
    import time
    from functools import partial

    world, connect = wired
    world.env["ICARUS_REF_STARTUP_CONTEXT"] = "[startup] ctx"
    world.seed(("sqlite WAL notes", "WAL"), ("zebra notes", "stripes"))
    seed = random.randrange(1 << 30)
    rng = random.Random(seed)
    rt = world.runtimes[0]
    started_sessions: list[str] = []
    points = list(_KILL_POINTS) * 2  # each point twice, in an order of the seed's
    rng.shuffle(points)
    for n, point in enumerate(points):
        client, harness = connect()
        sid = f"pi-kill-{n}"
        died = threading.Event()

        def die(*_args: Any, client: Client = client, died: threading.Event = died) -> Any:
            died.set()
            _killed(client)
            raise CastorError("the harness died", code="cancelled")

        def answer_then_die(params: dict[str, Any], answer: Any, client: Client = client,
                            died: threading.Event = died) -> Any:
            # The harness answers, then dies once its answer left (its next frame count).
            sent = client.connection.counters["frames_out"]

            def kill() -> None:
                wait_until(lambda: client.connection.counters["frames_out"] > sent, timeout=5,
                           what="the harness's answer to leave")
                died.set()
                _killed(client)

            threading.Thread(target=kill, daemon=True).start()
            return answer(params)

        if point == "in_classifier":
            client.on_request("classifier.complete", die)
        elif point == "in_audit":
            client.on_request("session.append_entry", die)
        elif point == "after_classifier":
            client.on_request("classifier.complete", partial(answer_then_die, answer=harness.complete))
        elif point == "after_audit":
            client.on_request("session.append_entry", partial(answer_then_die, answer=harness.append_entry))
        elif point == "on_startup_message":
            client.on_notification("message.send", die)
        open_session(client, world, sid)
        started_sessions.append(sid)
        if point == "after_open":
            _killed(client)
            continue
        try:
            client.call("harness.event", {"session_id": sid, "event": "session_start", "data": {"reason": "startup"}})
        except CastorError:
            assert point == "on_startup_message"
        if point == "after_start":
            _killed(client)
            continue
        if point == "on_startup_message":
            assert died.wait(10), f"seed {seed}: the startup message never came"
            continue
        client.call_async("harness.event", {"session_id": sid, "event": "before_agent_start",
                                            "data": {"prompt": rng.choice(["sqlite", "zebra"]),
                                                     "message_type": "user"}}, timeout=30)
        if point == "mid_request":
            _killed(client)
        else:
            assert died.wait(10), f"seed {seed}: {point} never reached the harness"
    started = time.monotonic()
    for sid in started_sessions:
        wait_until(lambda sid=sid: not rt.has_session(sid), timeout=max(1.0, 12 - (time.monotonic() - started)),
                   what=f"session {sid} to close (seed {seed})")
    began = {c["kwargs"].get("session_id") for c in world.calls("hooks.on_session_start")}
    ended = {c["kwargs"].get("session_id") for c in world.calls("hooks.on_session_end")}
    assert began and began <= ended, (seed, sorted(began - ended))
    assert time.monotonic() - started < 12, seed

"""The Icarus bridge's edges as a harness meets them through a real ``python -m castor serve
--socket``: a quit while Fabric tool calls run, a prompt refused because a tool's timeout retired
the worker, and an audit the harness acknowledges too late. The backend is the REFERENCE
stand-in (examples/icarus_reference) in real worker subprocesses, slowed through its control
file; the harness side is the TEST FAKE ``FakeHarness`` on a ``castor.client.Client``."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from castor.client import Client
from castor.messages.errors import CastorError
from tests.actors.icarus.test_session_endpoint import FakeHarness
from tests.support.icarus import IcarusWorldBase
from tests.support.waiting import wait_for

pytestmark = pytest.mark.timeout(120)

SID = "pi-1"
ROOT = Path(__file__).resolve().parents[2]


class Served:
    """One ``castor serve`` over a world of the reference backend, and a harness on its socket."""

    def __init__(self, world: IcarusWorldBase, client: Client, harness: FakeHarness) -> None:
        self.world = world
        self.client = client
        self.harness = harness

    def open(self) -> None:
        self.client.call("session.open", {"session_id": SID, "cwd": str(self.world.project), "trusted": False,
                                          "flags": {"harness": "pi", "has_agent_settled": True}}, timeout=30)

    def prompt(self, text: str) -> Any:
        return self.client.call("harness.event", {"session_id": SID, "event": "before_agent_start",
                                                  "data": {"prompt": text, "message_type": "user"}}, timeout=60)

    def tool(self, name: str, params: dict[str, Any], timeout: float = 60) -> Any:
        return self.client.call_async("icarus.tool", {"session_id": SID, "name": name, "params": params,
                                                      "tool_call_id": f"t-{name}"}, timeout=timeout)

    def warnings(self) -> list[str]:
        with self.harness.noted:
            return [p["message"] for m, p in self.harness.notes if m == "ui.notify" and p.get("level") == "warning"]


def _serve(tmp_path: Path, **settings: Any) -> Iterator[Served]:
    world = IcarusWorldBase(tmp_path)
    world.write_global(**settings)
    env = {**os.environ, **world.env, "HOME": str(tmp_path / "home"), "PYTHONPATH": str(ROOT)}
    env.pop("XDG_RUNTIME_DIR", None)
    env.pop("MATERIA_CONFIG", None)
    sock = tmp_path / "castor.sock"
    with (tmp_path / "serve.log").open("w") as stderr:
        server = subprocess.Popen([sys.executable, "-m", "castor", "serve", "--socket", str(sock)], cwd=str(ROOT),
                                  env=env, stdout=subprocess.DEVNULL, stderr=stderr)
    try:
        wait_for(sock.exists, 30, "castor serve's socket")
        client = Client.connect_unix(str(sock), default_timeout=30)
        try:
            served = Served(world, client, FakeHarness(client))
            yield served
        finally:
            client.close()
    finally:
        server.send_signal(signal.SIGTERM)
        server.wait(30)


@pytest.fixture
def quick_tools(tmp_path: Path) -> Iterator[Served]:
    yield from _serve(tmp_path, classifier="none", timeoutMs=1500)


@pytest.fixture
def slow_tools(tmp_path: Path) -> Iterator[Served]:
    yield from _serve(tmp_path, classifier="none", timeoutMs=20000)


def test_a_prompt_refused_because_a_tools_timeout_retired_the_worker_warns_and_the_next_prompt_has_memory(
        quick_tools: Served) -> None:
    s = quick_tools
    s.open()
    assert s.tool("fabric_write", {"type": "note", "content": "WAL notes", "summary": "sqlite WAL"}).result()
    s.world.controls({"tools.fabric_recall": {"sleep_ms": 6000}})
    recall = s.tool("fabric_recall", {"query": "sqlite"})
    wait_for(lambda: s.world.calls("tools.fabric_recall"), 20, "the slow tool call to start")
    assert s.prompt("sqlite") == {}  # queued behind the tool; its timeout retired the worker
    with pytest.raises(CastorError) as raised:
        recall.result()
    assert raised.value.code == "timeout"
    assert s.world.calls("hooks.pre_llm_call") == []  # refused unsent
    warned = wait_for(lambda: [w for w in s.warnings() if "pre_llm_call" in w], 10, "the refused prompt's warning")
    assert "without memory" in warned[0] and "sqlite" not in warned[0]
    s.world.controls({})
    reply = s.prompt("sqlite")  # the next prompt reaches a fresh worker
    assert "sqlite WAL" in reply["message"]["content"]


def test_a_quit_while_slow_tool_calls_run_is_bounded_and_the_sessions_end_still_runs(slow_tools: Served) -> None:
    s = slow_tools
    s.open()
    s.world.controls({"tools.fabric_recall": {"sleep_ms": 15000}})
    first = s.tool("fabric_recall", {"query": "one"})
    second = s.tool("fabric_recall", {"query": "two"})
    wait_for(lambda: s.world.calls("tools.fabric_recall"), 20, "the first slow tool call to start")
    started = time.monotonic()
    s.client.call("session.close", {"session_id": SID}, timeout=60)
    took = time.monotonic() - started
    assert took < 6, took  # waited about 19.5 s behind the two tool calls before
    assert len(s.world.calls("hooks.on_session_end", phase="end")) == 1
    for pending in (first, second):
        with pytest.raises(CastorError) as raised:
            pending.result()
        assert raised.value.code in ("cancelled", "worker_retired"), raised.value.code
    assert len(s.world.calls("tools.fabric_recall")) == 1  # the queued one was never sent


class LateAcks(FakeHarness):
    """The fake harness acknowledging each audit entry ``delay_s`` after it came, as a harness that
    ignores ``expires_at_ms`` does (it appends the entry and says so, late)."""

    def __init__(self, client: Client, delay_s: float) -> None:
        super().__init__(client)
        self.delay_s = delay_s
        self.received: list[tuple[float, dict[str, Any]]] = []

    def append_entry(self, params: dict[str, Any]) -> dict[str, Any]:
        self.received.append((time.time(), params))
        if len(self.received) == 1:
            time.sleep(self.delay_s)
        return super().append_entry(params)


@pytest.fixture
def filtering(tmp_path: Path) -> Iterator[Served]:
    yield from _serve(tmp_path, classifier="default")


def test_an_audit_acknowledged_too_late_expires_and_is_corrected_so_the_record_says_what_was_injected(
        filtering: Served) -> None:
    s = filtering
    late = LateAcks(s.client, delay_s=2.6)  # castor's audit deadline is 2 s
    s.harness = late
    s.open()
    for summary, content in (("sqlite WAL notes", "WAL"), ("chocolate cake recipe", "eggs")):
        assert s.tool("fabric_write", {"type": "note", "content": content, "summary": summary}).result()
    content = s.prompt("sqlite cake")["message"]["content"]
    assert "sqlite WAL notes" in content and "chocolate cake recipe" in content  # the original went in
    wait_for(lambda: [w for w in s.warnings() if "audit could not be saved" in w], 10, "the audit warning")
    wait_for(lambda: len(late.entries) == 2, 10, "the correcting entry")
    (sent_at, first), (_, second) = late.received
    # the entry expires a little before castor's own deadline, so an ack sent by then arrives in time
    assert 1.5 <= first["expires_at_ms"] / 1000 - sent_at <= 2.0, first["expires_at_ms"] / 1000 - sent_at
    assert "expires_at_ms" not in second  # the correction is best effort: late is still true
    filtered, correction = first["data"], second["data"]
    assert (filtered["outcome"], correction["outcome"], correction["reason"]) == \
        ("filtered", "fallback", "audit_unconfirmed")
    assert correction["at"] == filtered["at"] and correction["spans"] == filtered["spans"]
    assert correction["injectedIds"] == [span["id"] for span in filtered["spans"]]
    assert correction["chars"] == {"original": filtered["chars"]["original"], "injected": filtered["chars"]["original"]}
    assert "cake" not in json.dumps(correction)

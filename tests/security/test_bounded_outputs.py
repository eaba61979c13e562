"""Bounded outputs: nothing a child process or a peer sends can grow castor's memory or files without bound.

* a utility command printing 5 MiB (stdout and stderr) in a real cast is kept
  to 1 MiB each, with the truncation recorded in ``.command.json``;
* the Icarus worker's stderr (10 MB of noise) is kept as a bounded tail and
  the worker keeps answering;
* an endpoint frame over the 16 MiB buffer closes only that connection;
* a bounded mailbox in a real runtime refuses overflow at once and loses
  nothing it accepted.
"""

from __future__ import annotations

import json
import sys
import threading
from pathlib import Path

import msgpack
import pytest

from castor.actors.materia.api import materia_call
from castor.adapters.agents.scripted import ScriptedAgent, parse_script
from castor.adapters.stderr_ui import StderrUi
from castor.composition import materia_component
from castor.messages.base import LocalMessage
from castor.messages.errors import MailboxFull
from castor.runtime import HarnessLink, Runtime, RuntimeSettings, SessionInfo
from castor.supervision import Actor, ChildSpec, handles

from .conftest import wait_until

MiB = 1024 * 1024


@pytest.mark.timeout(40)
def test_a_utility_command_printing_5_mib_is_capped_at_1_mib_with_truncation_recorded(tmp_path):
    project = tmp_path / "project"
    (project / ".pi").mkdir(parents=True)
    code = ("import sys; sys.stdin.read(); chunk = 'y' * 65536\n"
            "for _ in range(80): sys.stdout.write(chunk); sys.stderr.write(chunk)\n")
    config = {"activeLoadout": "loud", "loadouts": {"loud": {"entry": "Socket-1", "sockets": {
        "Socket-1": {"type": "utility", "command": [sys.executable, "-c", code],
                     "edges": [{"when": "always", "to": "Socket-2"}]},
        "Socket-2": {"type": "agent", "materia": "greeter"}}}}}
    (project / ".pi" / "pi-materia.json").write_text(json.dumps(config))
    rt = Runtime(RuntimeSettings(), components=[materia_component()])
    try:
        rt.open_session(SessionInfo(session_id="s1", cwd=str(project), trusted=True),
                        HarnessLink(agent=ScriptedAgent(parse_script(["summarised"])), session_log=None,
                                    ui=StderrUi(printer=lambda _line: None)))
        started = materia_call(rt, "s1", "start", {"request": "be loud"})
        view = wait_until(lambda: (v := materia_call(rt, "s1", "status", {"cast_id": started["cast_id"]}))
                          ["status"] in ("complete", "failed", "aborted") and v, 30, "the cast to end")
    finally:
        rt.shutdown(10)
    sockets = Path(view["run_dir"]) / "sockets" / "Socket-1"
    meta = json.loads((sockets / "1.command.json").read_text())
    assert meta["stdoutTruncated"] is True and meta["stderrTruncated"] is True and meta["maxBytes"] == MiB
    for name in ("1.command.stdout.txt", "1.command.stderr.txt"):
        size = (sockets / name).stat().st_size
        assert 0 < size <= MiB, (name, size)
    total = sum(p.stat().st_size for p in Path(view["run_dir"]).rglob("*") if p.is_file())
    assert total < 5 * MiB  # 5 MiB of each stream went in; nothing close to 10 MiB was kept


@pytest.mark.timeout(40)
def test_the_icarus_workers_stderr_is_a_bounded_tail(icarus_world):
    rt = icarus_world.runtime()
    _, sess = icarus_world.open(rt)
    worker = sess.tool_worker()
    assert worker.call("hooks", "spew", [], {"lines": 50_000, "width": 200}, 30) == 50_000  # ~10 MB on stderr
    stats = sess.worker_stats()["process"]
    assert 0 < stats["stderr_tail_lines"] <= 200 and 0 < stats["stderr_tail_bytes"] <= 32 * 1024, stats
    assert sess.tool("fabric_brief", {})["recent"] == []  # and the worker still answers


@pytest.mark.timeout(30)
def test_a_frame_over_the_buffer_limit_closes_only_that_connection(socket_server, tmp_path):
    good = socket_server.client()
    try:
        good.call("session.open", {"session_id": "good", "cwd": str(tmp_path)})
        peer = socket_server.raw()
        # every string and the array are within their own limits; the frame as a whole is 18 MiB
        big = msgpack.packb([0, 1, "runtime.hello", [{"client": ["z" * 6144] * 3072}]])
        assert len(big) > 16 * MiB
        try:
            peer.send(big)
        except (BrokenPipeError, ConnectionResetError):
            pass
        values = peer.read(10)
        assert peer.eof and not [v for v in values if isinstance(v, list) and v[:1] == [1]], values
        assert socket_server.alive()
        assert good.call("harness.event", {"session_id": "good", "event": "context", "data": {}}) == {}
    finally:
        good.close()


class _Job(LocalMessage, type_name="security.job"):
    n: int


class _Gated(Actor):
    """Blocks on a gate in its first job, then records every job it runs."""

    gate = threading.Event()
    started = threading.Event()
    done: list[int] = []

    @handles(_Job)
    def job(self, message: _Job) -> int:
        type(self).started.set()
        type(self).gate.wait(10)
        type(self).done.append(message.n)
        return message.n


@pytest.mark.timeout(30)
def test_a_bounded_mailbox_in_a_runtime_refuses_overflow_at_once_and_loses_nothing_accepted():
    _Gated.gate.clear()
    _Gated.started.clear()
    _Gated.done = []
    rt = Runtime(RuntimeSettings(), components=[],
                 extra_children=[ChildSpec("bounded", _Gated, mailbox_capacity=8)])
    try:
        handle = rt.system.lookup("/root/bounded")
        first = handle.ask_pending(_Job(n=0), timeout=20)
        assert _Gated.started.wait(5)
        accepted, refused = [first], 0
        for n in range(1, 50):
            try:
                accepted.append(handle.ask_pending(_Job(n=n), timeout=20))
            except MailboxFull as exc:
                refused += 1
                assert exc.code == "mailbox_full"
        assert handle.snapshot().mailbox.depth == 8 and refused == 49 - 8
        _Gated.gate.set()
        results = [p.result() for p in accepted]
        assert results == list(range(9)) and _Gated.done == list(range(9))
    finally:
        _Gated.gate.set()
        rt.shutdown(10)

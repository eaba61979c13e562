"""A ``castor serve`` out of file descriptors (``ulimit -n``) under live Icarus sessions: a call
whose worker cannot be started for want of a descriptor is refused typed -- ``mailbox_full``,
``data.reason: out_of_file_descriptors``, nothing started -- never ``actor_crashed`` nor a worker
death; the serve keeps serving, and the same session's next call starts its worker once
descriptors are free again. Before, the worker's wake pipe (made before the child) crashed the
worker actor (``actor_crashed``, a traceback in the log) and a pipe the spawn could not make was a
``worker_crashed`` death counted toward the crash-loop limit."""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
from pathlib import Path

import pytest

from castor.client import Client
from castor.messages.errors import CastorError
from tests.actors.icarus.test_session_endpoint import FakeHarness
from tests.support.icarus import REFERENCE_ICARUS
from tests.support.processes import killed_on_exit
from tests.support.refused_reads import refuse_reads_in
from tests.support.waiting import wait_for

pytestmark = pytest.mark.timeout(120)

NOFILE = 64  # the serve's descriptor limit: a handful of sessions with a worker each


def _low_fd_limit() -> None:  # runs in the child before exec
    resource.setrlimit(resource.RLIMIT_NOFILE, (NOFILE, NOFILE))


def _serve(tmp: Path) -> tuple[subprocess.Popen, str, Path]:
    agent = tmp / "home" / "agent"
    agent.mkdir(parents=True)
    (agent / "settings.json").write_text(json.dumps({"piIcarusHook": {
        "icarusDir": str(REFERENCE_ICARUS), "python": sys.executable, "fabricDir": str(tmp / "fabric"),
        "classifier": "ollama/qwen3:4b", "classifierTimeoutMs": 3000, "timeoutMs": 10000}}))
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(tmp / "home"),
           "PI_CODING_AGENT_DIR": str(agent), "PYTHONUNBUFFERED": "1"}
    if os.environ.get("PYTHONPATH"):  # a checkout run with its tree first on the path: serve that tree
        env["PYTHONPATH"] = os.environ["PYTHONPATH"]
    path = str(tmp / "c.sock")
    err_path = tmp / "serve.err"
    with open(err_path, "wb") as err:
        proc = subprocess.Popen([sys.executable, "-m", "castor", "serve", "--socket", path], env=env,
                                cwd=str(tmp), stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=err,
                                preexec_fn=_low_fd_limit)
    return proc, path, err_path


def _recall(client: Client, sid: str) -> dict:
    return client.call("icarus.tool", {"session_id": sid, "name": "fabric_recall", "params": {"query": "x"},
                                       "tool_call_id": "t1"}, timeout=30)


def _assert_out_of_descriptors(err: CastorError) -> None:
    wire = err.to_wire()
    assert err.code == "mailbox_full", wire
    assert wire["data"]["reason"] == "out_of_file_descriptors" and wire["data"]["errno"] == "EMFILE", wire


def test_a_worker_that_cannot_get_a_descriptor_is_refused_typed_and_starts_once_there_are(tmp_path: Path) -> None:
    project = tmp_path / "project"
    project.mkdir()
    proc, path, err_path = _serve(tmp_path)
    with killed_on_exit(proc):
        wait_for(lambda: os.path.exists(path) or proc.poll() is not None, timeout=30, what="the socket")
        assert proc.poll() is None, err_path.read_text()
        held: list[tuple[Client, str]] = []
        try:
            # sessions (no worker yet) until the serve has no descriptor for one more connection
            for i in range(NOFILE):
                try:
                    client = Client.connect_unix(path, default_timeout=20)
                except OSError:
                    break
                FakeHarness(client)
                try:
                    client.call("session.open", {"session_id": f"pi-{i}", "cwd": str(project), "trusted": False,
                                                 "flags": {"harness": "pi", "has_agent_settled": True}})
                except CastorError as refused:
                    _assert_out_of_descriptors(refused)
                    client.close()
                    break
                held.append((client, f"pi-{i}"))
            assert len(held) >= 2, "the serve took too few sessions to test with"
            # now every worker start finds no descriptor: each call is refused typed, nothing started
            for client, sid in held[-2:]:
                with pytest.raises(CastorError) as refused:
                    _recall(client, sid)
                _assert_out_of_descriptors(refused.value)
                assert refused.value.data["may_have_started"] is False, refused.value.to_wire()
            # descriptors free again: the same session's next call starts its worker
            for client, _sid in held[:-1]:
                client.close()
            client, sid = held[-1]
            wait_for(lambda: _answers(client, sid), timeout=30, what="the session's call answered")
            assert proc.poll() is None
        finally:
            for client, _sid in held:
                client.close()
    log = err_path.read_text(errors="replace")
    assert "actor crashed" not in log and "Traceback" not in log, log[-3000:]


def _answers(client: Client, sid: str) -> bool:
    try:
        return _recall(client, sid)["count"] == 0
    except CastorError as refused:
        _assert_out_of_descriptors(refused)
        return False


@pytest.mark.parametrize("name", ["EMFILE", "ENFILE"])
def test_a_session_opened_without_a_descriptor_for_its_settings_is_refused_typed_not_opened_without_icarus(
        world, monkeypatch, name):
    """The settings files are read as a session opens. Out of descriptors, the global file (where
    Icarus is configured) could not be opened and was ignored as "unreadable": the session opened
    without Icarus, for its whole life, and nothing told the harness. The open is now refused
    ``storage_unavailable`` naming the errno and the file, nothing opened, so the harness's next
    open (the Pi extension opens again on its next call) gets Icarus once descriptors are free."""
    from castor.adapters.icarus import settings_store
    from castor.runtime import SessionInfo

    refusing = refuse_reads_in(monkeypatch, settings_store, name)
    rt = world.runtime()
    with pytest.raises(CastorError) as refused:
        rt.open_session(SessionInfo(session_id="s1", cwd=str(world.project), trusted=False), world.link())
    assert refused.value.code == "storage_unavailable", refused.value.to_wire()
    assert refused.value.data["errno"] == name and refused.value.data["path"].endswith("settings.json")
    assert rt.system.find("/root/session/s1") is None  # nothing opened
    refusing["on"] = False
    ctx, sess = world.open(rt, "s1")
    assert sess.available and sess.settings.icarus_dir == str(REFERENCE_ICARUS)

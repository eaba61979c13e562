"""Icarus conformance: the numbered pi-icarus-hook behaviours (and issue 4's "Done when"
bullets) that had no dedicated test elsewhere, or only a weak one. The map of every item to its
test is docs/icarus.md's "Conformance map"; tests here are named ``test_i<N>_...`` after the item.

Real parts throughout: the worker program in real subprocesses over the REFERENCE BACKEND
(examples/icarus_reference, a STAND-IN for the private Icarus plugin, whose own call log
is the evidence of what ran), the supervision core, a real Runtime with the Icarus
component, real settings files and the real JSONL session log. Faked only what cannot
exist here: the classifier model (``ScriptedClassifier``) and the harness UI (a recorder).
No test is marked ``xfail``: where castor deliberately differs from pi-icarus-hook, the test
states castor's behaviour and the map's note says why.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from castor.actors.icarus.component import session_of
from castor.actors.icarus.worker import CancelToken, IcarusWorkerClient, icarus_worker_spec
from castor.adapters.icarus.launch import WorkerLaunch, build_launch
from castor.adapters.icarus.worker_process import WorkerProcess, next_request_id
from castor.adapters.session_jsonl import JsonlSessionLog
from castor.domain.icarus.settings import IcarusSettings, SettingsLayer, Source, resolve_settings
from castor.messages.errors import (
    Cancelled,
    CastorError,
    ErrorCode,
    InvalidConfig,
    Timeout,
    WorkerCrashed,
    WorkerRetired,
)
from castor.ports.classifier import ClassifierRequest, ClassifierResponse, ModelEndpoint
from castor.runtime import HarnessLink, Runtime, SessionInfo
from castor.supervision import ActorSystem
from tests.support.icarus import REFERENCE_ICARUS, IcarusWorldBase, gone, read_jsonl, wait_until

# --------------------------------------------------------------------------- helpers


# --------------------------------------------------------------------------- worker-level rig


class WorkerRig:
    """Workers on the reference backend inside a per-test project dir; the backend's call log."""

    def __init__(self, tmp: Path) -> None:
        self.project = tmp / "project"
        self.project.mkdir()
        self.call_log = tmp / "calls.jsonl"
        self.fabric = tmp / "fabric"
        self.workers: list[WorkerProcess] = []

    def launch(self) -> WorkerLaunch:
        settings = IcarusSettings(icarus_dir=str(REFERENCE_ICARUS), fabric_dir=str(self.fabric),
                                  python=sys.executable, agent="conformance", project_id="conformance")
        env = dict(os.environ, ICARUS_REF_CALL_LOG=str(self.call_log))
        return build_launch(settings, cwd=str(self.project), parent_env=env)

    def worker(self, launch: WorkerLaunch | None = None) -> WorkerProcess:
        worker = WorkerProcess(launch or self.launch())
        self.workers.append(worker)
        return worker

    def calls(self, name: str, phase: str = "start") -> list[dict[str, Any]]:
        return [r for r in read_jsonl(self.call_log) if r["phase"] == phase and r["call"] == name]

    def close(self) -> None:
        for worker in self.workers:
            worker.kill_tree("test teardown")


@pytest.fixture
def rig(tmp_path: Path) -> Iterator[WorkerRig]:
    r = WorkerRig(tmp_path)
    yield r
    r.close()


@pytest.fixture
def bridge(rig: WorkerRig) -> Iterator[SimpleNamespace]:
    """A supervised IcarusWorkerActor (the bridge) whose spawned workers the test can see."""
    system = ActorSystem()
    spawned: list[WorkerProcess] = []

    def spawn() -> WorkerProcess:
        worker = rig.worker()
        spawned.append(worker)
        return worker

    handle = system.spawn(icarus_worker_spec("icarus-worker", spawn, next_request_id, timeout_ms=10000))
    yield SimpleNamespace(client=IcarusWorkerClient(handle, timeout_ms=10000), handle=handle, spawned=spawned,
                          rig=rig)
    system.shutdown(timeout=10)


# --------------------------------------------------------------------------- transport and worker

# A stand-in child that is NOT castor's worker program (e.g. a wrapper printing a banner):
# before every reply it writes a line that is not JSON to the protocol stream.
_BANNER_CHILD = r"""
import json, sys
for line in sys.stdin:
    req = json.loads(line)
    sys.stdout.write("a banner line that is not JSON\n")
    sys.stdout.write(json.dumps({"id": req["id"], "ok": True, "result": req["function"]}) + "\n")
    sys.stdout.flush()
"""


def test_i13_after_a_crash_the_next_call_gets_a_fresh_worker_without_session_init(bridge):
    client, rig = bridge.client, bridge.rig
    client.call("hooks", "on_session_start", kwargs={"session_id": "s1", "platform": "pi"})
    assert client.call("hooks", "counter") == 1
    first_pid = bridge.spawned[0].pid
    with pytest.raises(WorkerCrashed):
        client.call("hooks", "crash", [3])
    assert gone(first_pid)
    assert client.call("hooks", "counter") == 1  # module globals start fresh
    assert len(bridge.spawned) == 2 and bridge.spawned[1].pid != first_pid
    assert len(rig.calls("hooks.on_session_start")) == 1  # session initialisation is not re-sent
    assert len(rig.calls("hooks.crash")) == 1  # the failed call is never replayed


@pytest.mark.parametrize("unusable", ["dangling_symlink", "a_file", "a_directory_nothing_can_be_made_in"])
def test_a_fabric_dir_that_cannot_be_used_is_storage_unavailable_naming_the_setting_not_internal(bridge, unusable):
    """``fabricDir`` a dangling symlink (the backend's ``[Errno 17] File exists``), a symlink to a
    file, or to a directory nothing can be created in (SQLite's "unable to open database file"):
    each came back ``internal`` / ``backend_error``, as if castor had failed. The worker looks at the
    path: ``storage_unavailable`` naming the setting (``fabricDir``), its path and an errno, in
    castor's words -- never the memory's text -- and the worker is kept."""
    client, rig = bridge.client, bridge.rig
    if unusable == "dangling_symlink":
        rig.fabric.symlink_to(rig.project.parent / "nowhere")
    elif unusable == "a_file":
        (rig.project.parent / "a-file").write_text("not a directory")
        rig.fabric.symlink_to(rig.project.parent / "a-file")
    else:
        target = rig.project.parent / "shut"
        target.mkdir()
        if os.geteuid() == 0:
            rig.fabric.symlink_to("/proc/1")  # even root creates nothing there
        else:
            target.chmod(0o500)
            rig.fabric.symlink_to(target)
    with pytest.raises(CastorError) as refused:
        client.call("state", "write_entry", ["note", "SECRET memory text"])
    error = refused.value
    assert error.code == ErrorCode.STORAGE_UNAVAILABLE, error.to_wire()
    assert error.data["setting"] == "fabricDir" and error.data["path"] == str(rig.fabric), error.data
    assert error.data["errno"] in ("ENOENT", "ENOTDIR", "EACCES"), error.data
    assert "fabricDir" in error.message and str(rig.fabric) in error.message, error.message
    assert "SECRET" not in json.dumps(error.to_wire()), error.to_wire()
    assert len(bridge.spawned) == 1 and client.call("hooks", "counter") >= 0  # the worker is kept


def test_a_state_db_path_that_is_a_directory_is_storage_unavailable_naming_that_setting(rig):
    """``stateDbPath`` naming a directory (SQLite's "unable to open database file": no errno, no
    path): ``storage_unavailable`` naming ``stateDbPath`` and its path (``EISDIR``), not ``internal``;
    the worker is kept."""
    from castor.domain.icarus.worker_protocol import reply_result

    state_db = rig.project.parent / "state.db"
    state_db.mkdir()
    settings = IcarusSettings(icarus_dir=str(REFERENCE_ICARUS), fabric_dir=str(rig.fabric), python=sys.executable,
                              agent="conformance", project_id="conformance", state_db_path=str(state_db))
    worker = rig.worker(build_launch(settings, cwd=str(rig.project), parent_env=dict(os.environ)))
    reply = worker.call(next_request_id(), "state", "write_entry", ["note", "SECRET memory text"], {},
                        time.monotonic() + 10)
    with pytest.raises(CastorError) as refused:
        reply_result(reply, "state.write_entry")
    error = refused.value
    assert error.code == ErrorCode.STORAGE_UNAVAILABLE, error.to_wire()
    assert (error.data["setting"], error.data["path"], error.data["errno"]) == ("stateDbPath", str(state_db), "EISDIR")
    assert "stateDbPath" in error.message and "SECRET" not in json.dumps(error.to_wire()), error.message
    assert worker.usable


def test_i13_after_an_idle_worker_is_killed_the_next_call_gets_a_fresh_worker(bridge):
    client, rig = bridge.client, bridge.rig
    client.call("hooks", "on_session_start", kwargs={"session_id": "s1", "platform": "pi"})
    assert client.call("hooks", "counter") == 1
    first_pid = bridge.spawned[0].pid
    os.kill(first_pid, signal.SIGKILL)  # from outside, while no call is running
    wait_until(lambda: gone(first_pid), 5, "the worker to die")
    assert client.call("hooks", "counter") == 1  # the next call: a fresh worker with fresh state
    assert bridge.spawned[-1].pid != first_pid
    assert len(rig.calls("hooks.on_session_start")) == 1


def test_i14_late_events_of_a_retired_worker_never_touch_the_new_worker_or_its_calls(bridge):
    client, rig = bridge.client, bridge.rig
    old_token = CancelToken()
    timed_out = client.submit("hooks", "sleep", kwargs={"seconds": 5, "tag": "old"}, timeout=0.4, token=old_token)
    with pytest.raises(Timeout):
        timed_out.result()
    old = bridge.spawned[0]
    assert gone(old.pid)
    # a new worker starts with one call running and one queued behind it
    running = client.submit("hooks", "sleep", kwargs={"ms": 400, "tag": "new"}, timeout=10)
    queued = client.submit("hooks", "echo", ["after"], timeout=10)
    # (A new worker's cold start under a loaded CI host took over 5 s once: the call's own 10 s.)
    wait_until(lambda: [r for r in rig.calls("hooks.sleep") if r["kwargs"].get("tag") == "new"], 10,
               "the new worker's call to start")
    new = bridge.spawned[1]
    assert new.pid != old.pid
    # late events about the retired child: its call's abort fires, its tree is killed (and reaped) again
    old_token.cancel()
    old.kill_tree("late exit of the retired worker")
    assert running.result() == {"slept": True, "tag": "new"}
    assert queued.result() == {"args": ["after"], "kwargs": {}}
    assert new.running_pid == new.pid and not gone(new.pid)
    assert bridge.handle.incarnation == 2 and len(bridge.spawned) == 2  # no further retirement


def test_i15_close_rejects_pending_kills_the_worker_and_no_old_deadline_fires_later(bridge):
    client, rig = bridge.client, bridge.rig
    client.call("hooks", "counter")
    pid = bridge.spawned[0].pid
    outcome: dict[str, BaseException] = {}

    def run() -> None:
        try:
            client.call("hooks", "sleep", kwargs={"seconds": 30, "tag": "running"}, timeout=1.0)
        except BaseException as exc:  # noqa: BLE001 - the test inspects it
            outcome["running"] = exc

    thread = threading.Thread(target=run)
    thread.start()
    wait_until(lambda: rig.calls("hooks.sleep"), 5, "the running call to start")
    queued = client.submit("hooks", "echo", ["never"], timeout=1.0)
    closed_at = time.monotonic()
    client.close()
    thread.join(5)
    assert isinstance(outcome["running"], Cancelled)
    with pytest.raises(WorkerRetired):
        queued.result()
    wait_until(lambda: gone(pid), 2, "the worker to be killed by close()")
    # A fresh call runs past the old calls' deadlines (1 s after submission): no old timer kills it.
    assert client.call("hooks", "sleep", kwargs={"ms": 1000, "tag": "fresh"}, timeout=5) == {"slept": True,
                                                                                           "tag": "fresh"}
    assert time.monotonic() - closed_at > 1.0
    fresh = bridge.spawned[-1]
    assert fresh.pid != pid and fresh.running_pid == fresh.pid
    assert client.call("hooks", "counter") == 1  # still the same fresh worker, alive
    with pytest.raises(WorkerRetired):
        queued.result()  # settled once: the rejection does not change
    assert rig.calls("hooks.echo") == []


# --------------------------------------------------------------------------- session-level world


LOCAL_MODEL = ModelEndpoint(provider="ollama", id="qwen3:4b", base_url="http://127.0.0.1:11434/v1", has_auth=False)


class ScriptedClassifier:
    """TEST STAND-IN for the LLM classifier (no network): ``mode`` scripts its answer.

    ``ok`` rejects candidates containing "cake"; ``garbage`` answers prose; ``slow``
    waits on an event that is never set, until its deadline passes.
    """

    def __init__(self, mode: str = "ok") -> None:
        self.mode = mode
        self.requests: list[ClassifierRequest] = []
        self.budgets: list[float] = []  # seconds left before each request's deadline, as received

    def list_models(self, deadline: float | None = None) -> list[ModelEndpoint]:
        return [LOCAL_MODEL]

    def complete(self, request: ClassifierRequest, deadline: float) -> ClassifierResponse:
        self.requests.append(request)
        self.budgets.append(deadline - time.monotonic())
        if self.mode == "slow":
            threading.Event().wait(max(0.0, deadline - time.monotonic()))
            raise Timeout("scripted classifier: deadline passed", may_have_started=True)
        if self.mode == "garbage":
            return ClassifierResponse(text="Sure! The first one looks relevant, the rest maybe.")
        candidates = json.loads(request.messages[-1].content)["candidates"]
        return ClassifierResponse(text=json.dumps({"decisions": [
            {"id": c["id"], "relevant": "cake" not in c["text"], "confidence": 0.9} for c in candidates]}))


class World(IcarusWorldBase):
    """A project, a global agent dir pointing at the reference backend, runtimes over it."""

    def __init__(self, tmp: Path) -> None:
        super().__init__(tmp)
        self.write_global()

    def open(self, rt: Runtime, sid: str = "s1", *, trusted: bool = False, classifier: Any = None):
        link = HarnessLink(agent=None, session_log=JsonlSessionLog(self.session_log_path), ui=self.ui,
                           classifier=classifier)
        ctx = rt.open_session(SessionInfo(session_id=sid, cwd=str(self.project), trusted=trusted), link)
        return session_of(ctx)

    def audits(self) -> list[dict[str, Any]]:
        return [e["data"] for e in read_jsonl(self.session_log_path) if e.get("customType") == "icarus-context-filter"]


@pytest.fixture
def world(tmp_path: Path) -> Iterator[World]:
    w = World(tmp_path)
    yield w
    w.close()


# --------------------------------------------------------------------------- lifecycle


def test_i23_hooks_get_the_sessions_own_id_without_a_session_start_and_after_a_controller_restart(world):
    """The session manager's id, never ""; a runtime respawned mid-session reopens the
    session without a ``session_start`` event, and a crashed controller restarts from its
    initial state -- the hooks must still carry the session's id."""
    from castor.supervision import faults

    rt = world.runtime()
    world.open(rt, "pi-session-7")
    rt.dispatch_event("pi-session-7", "before_agent_start", {"prompt": "first"})
    hooks = rt.system.lookup("/root/session/pi-session-7/icarus/hooks")
    faults.crash_next(hooks)
    assert rt.dispatch_event("pi-session-7", "before_agent_start", {"prompt": "lost to the crash"}) == {}
    wait_until(lambda: hooks.snapshot().state == "running", 5, "the controller restart")
    rt.dispatch_event("pi-session-7", "before_agent_start", {"prompt": "after the restart"})
    rt.dispatch_event("pi-session-7", "agent_end", {"messages": [
        {"role": "user", "text": "after the restart"}, {"role": "assistant", "text": "ok", "stop_reason": "stop"}]})
    rt.dispatch_event("pi-session-7", "agent_settled", {"aborted": False})
    retrievals = world.calls("hooks.pre_llm_call")
    assert [c["kwargs"]["user_message"] for c in retrievals] == ["first", "after the restart"]
    assert [c["kwargs"]["session_id"] for c in retrievals] == ["pi-session-7", "pi-session-7"]
    assert [c["kwargs"]["session_id"] for c in world.calls("hooks.post_llm_call")] == ["pi-session-7"]


def test_i38_an_untrusted_projects_hooks_false_is_ignored(world):
    world.write_project({"hooks": False})
    rt = world.runtime()
    untrusted = world.open(rt, "untrusted", trusted=False)
    assert untrusted.config()["hooks"]["registered"] is True
    rt.dispatch_event("untrusted", "before_agent_start", {"prompt": "anything"})
    assert [c["kwargs"]["session_id"] for c in world.calls("hooks.pre_llm_call")] == ["untrusted"]
    # the same project, trusted: its hooks:false is honoured (so the check above could fail)
    trusted = world.open(rt, "trusted", trusted=True)
    assert trusted.config()["hooks"]["registered"] is False
    rt.dispatch_event("trusted", "before_agent_start", {"prompt": "anything"})
    assert len(world.calls("hooks.pre_llm_call")) == 1


# --------------------------------------------------------------------------- classifier (+ Done when)


def _seed_and_open(world: World, rt: Runtime, sid: str, classifier: Any) -> Any:
    sess = world.open(rt, sid, classifier=classifier)
    for summary in ("sqlite WAL notes", "chocolate cake recipe"):
        assert sess.tool("fabric_write", {"type": "note", "summary": summary, "content": "c"})["status"] == "written"
    return sess


@pytest.mark.timeout(40)
@pytest.mark.parametrize(("mode", "reason"), [("slow", "timeout"), ("garbage", "malformed_response"),
                                              ("absent", "no_registry")])
def test_i45_classifier_timeout_garbage_or_absence_keeps_the_original_and_the_real_worker(world, mode, reason):
    rt = world.runtime()
    prompt = {"prompt": "sqlite and the cake"}
    # what filtering does when the classifier works: the cake line is removed (so the checks below can fail)
    _seed_and_open(world, rt, "works", ScriptedClassifier("ok"))
    filtered = rt.dispatch_event("works", "before_agent_start", prompt)["message"]["content"]
    assert "sqlite WAL notes" in filtered and "chocolate cake recipe" not in filtered
    # the text the backend returns, unfiltered: classifier "none" in a fresh session (fresh worker, no dedupe)
    world.write_global(classifier="none")
    world.open(rt, "reference")
    original = rt.dispatch_event("reference", "before_agent_start", prompt)["message"]["content"]
    assert "chocolate cake recipe" in original and original != filtered
    world.write_global(classifier="ollama/qwen3:4b", classifierTimeoutMs=400)
    scripted = None if mode == "absent" else ScriptedClassifier(mode)
    sess = world.open(rt, "failing", classifier=scripted)
    rt.dispatch_event("failing", "session_start", {})
    pid = sess.current_worker_pid()
    assert pid is not None
    result = rt.dispatch_event("failing", "before_agent_start", prompt)
    assert result["message"]["content"] == original  # exactly the original text
    if scripted is not None:  # the classifier had the configured 400 ms, not the worker's timeout
        assert len(scripted.budgets) == 1 and 0 < scripted.budgets[0] <= 0.4
    assert sess.current_worker_pid() == pid and not gone(pid)  # the Python worker was never touched
    audits = world.audits()
    assert (audits[-1]["outcome"], audits[-1]["reason"]) == ("fallback", reason)


# --------------------------------------------------------------------------- config, settings, commands


def test_i56_global_only_footer_status_is_used_and_context_display_defaults_true():
    project = SettingsLayer(scope="project", path="/w/p/.pi/settings.json", doc=None)
    global_ = SettingsLayer(scope="global", path="/h/.pi/agent/settings.json",
                            doc={"piIcarusHook": {"footerStatus": "Memory on"}})
    s = resolve_settings(project=project, global_=global_, trusted=True, env={}, cwd="/w/p", home="/h",
                         exists=lambda p: False)
    assert s.footer_status == "Memory on" and s.sources["footerStatus"] == Source.GLOBAL
    assert s.context_display is True and s.sources["contextDisplay"] == Source.BUILTIN



def test_i56_a_global_only_footer_status_reaches_the_footer_and_the_context_shows(world):
    """The same through a real session: the footer the harness is sent is the global file's text,
    and with no contextDisplay anywhere the startup context is sent visible."""
    world.write_global(footerStatus="Memory on")
    world.write_project({"hooks": True})  # a project file without either key
    world.env["ICARUS_REF_STARTUP_CONTEXT"] = "[startup] remembered"
    rt = world.runtime()
    world.open(rt, trusted=True)
    rt.dispatch_event("s1", "session_start", {})
    assert world.ui.of("status")[-1] == ("icarus", "Memory on")
    assert [(m["content"], m["display"]) for m in world.ui.of("message")] == [("[startup] remembered", True)]

def test_i61_a_corrupt_global_file_is_never_overwritten_by_context_default_and_the_error_is_reported(world):
    world.global_path.write_text('{"piIcarusHook": {"contextDisplay": true,')  # truncated JSON
    before = world.global_path.read_bytes()
    # paths and python from the environment, so the session is available despite the broken file
    world.env.update(ICARUS_DIR=str(REFERENCE_ICARUS), ICARUS_PYTHON=sys.executable, FABRIC_DIR=str(world.fabric))
    rt = world.runtime()
    sess = world.open(rt)
    assert sess.config()["state"] == "active"
    with pytest.raises(InvalidConfig) as info:
        sess.command("context default hide")
    assert info.value.code == ErrorCode.INVALID_CONFIG and info.value.data["path"] == str(world.global_path)
    assert world.global_path.read_bytes() == before
    assert sorted(p.name for p in world.agent_dir.iterdir()) == ["settings.json"]  # no lock or temp file left


def test_i64_default_toggle_flips_the_legacy_alias_value_keeps_unrelated_keys_and_not_the_session(world):
    world.write_global({"unrelated": "preserved", "piIcarusHook": world.section(hiddenDisplay=False)})
    rt = world.runtime()
    sess = world.open(rt)
    assert "hidden" in sess.command("context status")["text"]
    saved = sess.command("context default toggle")
    assert saved["level"] == "info" and "global settings" in saved["text"]
    assert "Current session is still hidden" in saved["text"]
    doc = json.loads(world.global_path.read_text())
    assert doc["unrelated"] == "preserved"
    assert doc["piIcarusHook"]["contextDisplay"] is True and doc["piIcarusHook"]["hiddenDisplay"] is False
    assert doc["piIcarusHook"]["icarusDir"] == str(REFERENCE_ICARUS)
    assert "hidden" in sess.command("context status")["text"]  # the session's visibility did not change


def test_i65_context_default_show_project_writes_the_trusted_project_file(world):
    rt = world.runtime()
    sess = world.open(rt, trusted=True)
    assert not world.project_path.exists()
    saved = sess.command("context default show project")
    assert "project settings" in saved["text"] and str(world.project_path) in saved["text"]
    assert json.loads(world.project_path.read_text()) == {"piIcarusHook": {"contextDisplay": True}}
    assert "contextDisplay" not in json.loads(world.global_path.read_text())["piIcarusHook"]


def test_i70_a_scoped_toggle_flips_that_scopes_own_value_not_the_effective_one(world):
    world.write_project({"contextDisplay": True})
    rt = world.runtime()
    sess = world.open(rt, trusted=True)
    saved = sess.command("context default toggle global")
    # global was unset: its own value is the built-in true, flipped (the effective project true is not used)
    assert json.loads(world.global_path.read_text())["piIcarusHook"]["contextDisplay"] is False
    assert json.loads(world.project_path.read_text()) == {"piIcarusHook": {"contextDisplay": True}}
    assert saved["level"] == "warning" and "override" in saved["text"]  # the project value still wins


# --------------------------------------------------------------------------- tools


@pytest.mark.timeout(40)
def test_i79_a_timeout_during_fabric_write_raises_and_the_write_is_never_resent(world):
    world.write_global(timeoutMs=800)
    world.controls({"tools.fabric_write": {"sleep_ms": 5000}})
    rt = world.runtime()
    sess = world.open(rt)
    with pytest.raises(Timeout) as info:
        sess.tool("fabric_write", {"type": "note", "summary": "SLOW-WRITE", "content": "c"})
    assert info.value.code == ErrorCode.TIMEOUT and info.value.may_have_started is True  # indeterminate
    first_pid = world.calls("tools.fabric_write")[0]["pid"]
    assert gone(first_pid)
    world.controls({})
    assert sess.tool("fabric_brief", {})["recent"] == []  # a fresh worker answers; the write never landed
    assert world.calls("tools.fabric_brief")[0]["pid"] != first_pid
    assert len(world.calls("tools.fabric_write")) == 1  # not re-sent by castor, to any worker
    assert world.calls("tools.fabric_write", phase="end") == []


def test_i80_icarus_hook_config_schema_only_answers_without_a_worker(world):
    rt = world.runtime()
    sess = world.open(rt)
    schema = sess.tool("icarus_hook_config", {"schemaOnly": True})
    assert schema["key"] == "piIcarusHook" and "timeoutMs" in schema["settings"]
    inspection = sess.tool("icarus_hook_config", {})
    assert inspection["package"] == "pi-icarus-hook"
    assert sess.current_worker_pid() is None and sess.worker_stats()["workers_started"] == 0
    assert not world.call_log.exists()  # the backend was never imported, let alone called


def test_i66_i67_a_refused_or_invalid_command_changes_no_state_and_writes_no_file(world):
    """An invalid command is not the valid command its first words spell (``off extra`` is not
    ``off``), and an untrusted session's project write is refused without landing anywhere else."""
    world.write_project({"footerStatus": "project"})
    project_before = world.project_path.read_bytes()
    global_before = world.global_path.read_bytes()
    rt = world.runtime()
    sess = world.open(rt, trusted=False)
    for bad in ("off extra", "on extra", "context hide now", "context off now", "context default hide moon",
                "context default hide project extra", "off off"):
        result = sess.command(bad)
        assert result["level"] == "warning" and result["code"] == "invalid_command", (bad, result)
    refused = sess.command("context default hide project")
    assert refused["level"] == "warning" and "nothing was written" in refused["text"]
    assert world.project_path.read_bytes() == project_before and world.global_path.read_bytes() == global_before
    assert sorted(p.name for p in world.agent_dir.iterdir()) == ["settings.json"]  # no lock or temp file left
    # the session is as it was: hooks on, context visible (so the invalid ones above could have changed it)
    assert "visible" in sess.command("context status")["text"]
    rt.dispatch_event("s1", "before_agent_start", {"prompt": "still retrieving"})
    assert [c["kwargs"]["user_message"] for c in world.calls("hooks.pre_llm_call")] == ["still retrieving"]
    sess.command("off")
    rt.dispatch_event("s1", "before_agent_start", {"prompt": "not retrieved"})
    assert len(world.calls("hooks.pre_llm_call")) == 1  # the valid "off" does stop it


def test_i54_a_startup_context_the_classifier_would_filter_is_injected_unclassified(world):
    """The startup context is injected as the backend gave it, even when it is a retrievable
    section the configured classifier would cut (the earlier checks used a startup text with no
    retrievable section, which no filtering could have touched)."""
    startup = ("[fabric] relevant to your request:\n  [2026-01-01] conformance: sqlite WAL notes\n"
               "  [2026-01-01] conformance: chocolate cake recipe")
    world.env["ICARUS_REF_STARTUP_CONTEXT"] = startup
    rt = world.runtime()
    scripted = ScriptedClassifier("ok")
    _seed_and_open(world, rt, "s1", scripted)
    rt.dispatch_event("s1", "session_start", {})
    assert [m["content"] for m in world.ui.of("message")] == [startup]
    assert scripted.requests == []
    # the same kind of text in a retrieval is classified and its cake line cut (so the checks above could fail)
    filtered = rt.dispatch_event("s1", "before_agent_start", {"prompt": "sqlite and the cake"})["message"]["content"]
    assert len(scripted.requests) == 1
    assert "sqlite WAL notes" in filtered and "chocolate cake recipe" not in filtered


def test_i25_a_new_session_after_the_old_one_ended_gets_a_first_turn_again_with_its_own_id(world):
    """Pi replacing its session ends the old one and starts a new one (a new castor session): the
    new session's first prompt is a first turn again, under the new id, and the one after is not."""
    rt = world.runtime()
    world.open(rt, "old")
    rt.dispatch_event("old", "session_start", {})
    for prompt in ("one", "two"):
        rt.dispatch_event("old", "before_agent_start", {"prompt": prompt})
    rt.dispatch_event("old", "session_shutdown", {})
    world.open(rt, "new")
    rt.dispatch_event("new", "session_start", {"reason": "new"})
    for prompt in ("three", "four"):
        rt.dispatch_event("new", "before_agent_start", {"prompt": prompt})
    assert [(c["kwargs"]["session_id"], c["kwargs"]["is_first_turn"]) for c in world.calls("hooks.pre_llm_call")] == [
        ("old", True), ("old", False), ("new", True), ("new", False)]


@pytest.mark.timeout(40)
def test_i29_a_retrieval_still_running_when_the_session_shuts_down_injects_nothing(world):
    world.write_global(classifier="none")
    memory = {"result_json": json.dumps({"context": "[fabric] LATE MEMORY"})}
    world.controls({"hooks.pre_llm_call": memory})
    rt = world.runtime()
    world.open(rt)
    rt.dispatch_event("s1", "session_start", {})
    # the retrieval's answer is injected when nothing interrupts it (so the check below could fail)
    uninterrupted = rt.dispatch_event("s1", "before_agent_start", {"prompt": "q"})
    assert uninterrupted["message"]["content"] == "[fabric] LATE MEMORY"
    world.controls({"hooks.pre_llm_call": {**memory, "sleep_ms": 1500}})
    answers: list[Any] = []
    prompt = threading.Thread(target=lambda: answers.append(
        rt.dispatch_event("s1", "before_agent_start", {"prompt": "again"})))
    prompt.start()
    wait_until(lambda: len(world.calls("hooks.pre_llm_call")) == 2, 10, "the second retrieval under way")
    rt.dispatch_event("s1", "session_shutdown", {})
    prompt.join(20)
    assert answers == [{}]
    assert [c["kwargs"]["session_id"] for c in world.calls("hooks.on_session_end")] == ["s1"]

"""The Icarus session component through a real Runtime, over the reference backend
(a STAND-IN for the private Icarus plugin) in real worker subprocesses.
"""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import sys
import threading
from concurrent.futures import ThreadPoolExecutor

import pytest

from castor.domain.icarus.tools import tool_result
from castor.messages.errors import CastorError, NotFound, WorkerRetired
from tests.support.icarus import gone, wait_until

PROMPT = "tell me about sqlite and the cake"


def test_session_start_injects_startup_context_once(world):
    world.env["ICARUS_REF_STARTUP_CONTEXT"] = "[startup] STARTUP-CTX you were here before"
    rt = world.runtime()
    world.open(rt)
    assert rt.dispatch_event("s1", "session_start", {"reason": "startup"}) == {}
    assert rt.dispatch_event("s1", "session_start", {"reason": "startup"}) == {}  # same id: deduped
    messages = world.ui.of("message")
    assert messages == [
        {
            "custom_type": "icarus-session-context",
            "content": "[startup] STARTUP-CTX you were here before",
            "display": True,
            "trigger_turn": False,
        }
    ]
    starts = world.calls("hooks.on_session_start")
    assert [c["kwargs"] for c in starts] == [{"session_id": "s1", "platform": "pi"}]
    assert ("icarus", "\U0001fabd Icarus") in world.ui.of("status")
    assert world.classifier.requests == []  # startup context is never classified


def test_before_agent_start_returns_memory_context_with_first_turn_rules(world):
    world.seed(("sqlite WAL notes", "WAL fixed the locks"), facts=("the user prefers terse answers",))
    rt = world.runtime()
    world.open(rt)
    rt.dispatch_event("s1", "session_start", {})
    first = rt.dispatch_event("s1", "before_agent_start", {"prompt": "sqlite locking", "message_type": "user"})
    message = first["message"]
    assert message["custom_type"] == "icarus-memory-context" and message["display"] is True
    assert "sqlite WAL notes" in message["content"] and "terse answers" in message["content"]
    # custom runs and blank prompts do not consume the first turn and call nothing
    assert rt.dispatch_event("s1", "before_agent_start", {"prompt": None, "message_type": "custom"}) == {}
    assert rt.dispatch_event("s1", "before_agent_start", {"prompt": "   "}) == {}
    rt.dispatch_event("s1", "before_agent_start", {"prompt": "sqlite again"})
    calls = world.calls("hooks.pre_llm_call")
    assert [c["kwargs"] for c in calls] == [
        {"session_id": "s1", "user_message": "sqlite locking", "is_first_turn": True},
        {"session_id": "s1", "user_message": "sqlite again", "is_first_turn": False},
    ]


def test_filtering_persists_the_audit_before_release_and_keeps_raw_text_out(world):
    world.seed(("sqlite WAL notes", "WAL"), ("chocolate cake recipe", "three eggs"))
    rt = world.runtime()
    world.open(rt, "private-session-77")
    world.session_log.gate = threading.Event()
    with ThreadPoolExecutor(1) as pool:
        pending = pool.submit(rt.dispatch_event, "private-session-77", "before_agent_start", {"prompt": PROMPT})
        assert world.session_log.entered.wait(10), "the audit append never started"
        # the filtered text is held while the audit is not acknowledged
        assert not pending.done() and world.audits() == []
        world.session_log.gate.set()
        result = pending.result(15)
    content = result["message"]["content"]
    assert "sqlite WAL notes" in content and "cake" not in content
    audits = world.audits()
    assert len(audits) == 1
    data = audits[0]["data"]
    assert data["outcome"] == "filtered" and data["counts"]["rejected"] == 1 and data["counts"]["kept"] == 1
    serialised = json.dumps(audits[0])
    for raw in ("sqlite WAL notes", "chocolate cake", "tell me about", "private-session-77"):
        assert raw not in serialised


def test_audit_that_cannot_be_persisted_releases_the_original_and_warns(world):
    world.seed(("sqlite WAL notes", "WAL"), ("chocolate cake recipe", "three eggs"))
    rt = world.runtime()

    class BrokenLog:
        def append_entry(self, custom_type, data, deadline, *, expires=False):
            raise OSError("disk full")

    world.open(rt, session_log=BrokenLog())
    content = rt.dispatch_event("s1", "before_agent_start", {"prompt": PROMPT})["message"]["content"]
    assert "sqlite WAL notes" in content and "chocolate cake recipe" in content  # original kept
    assert any(level == "warning" for _, level in world.ui.of("notify"))


def test_no_classifier_in_the_harness_keeps_the_original_with_a_no_registry_audit(world):
    world.seed(("sqlite WAL notes", "WAL"), ("chocolate cake recipe", "three eggs"))
    rt = world.runtime()
    world.open(rt, classifier=None)
    content = rt.dispatch_event("s1", "before_agent_start", {"prompt": PROMPT})["message"]["content"]
    assert "chocolate cake recipe" in content and "sqlite WAL notes" in content
    [audit] = world.audits()
    assert (audit["data"]["outcome"], audit["data"]["reason"]) == ("fallback", "no_registry")


def test_agent_settled_captures_exactly_once(world):
    rt = world.runtime()
    world.open(rt)
    rt.dispatch_event("s1", "session_start", {})
    rt.dispatch_event("s1", "before_agent_start", {"prompt": "first question"})
    wire = [{"role": "user", "text": "first question"}, {"role": "toolResult", "text": "ignored"},
            {"role": "assistant", "text": "the answer", "stop_reason": "stop", "error": None}]
    assert rt.dispatch_event("s1", "agent_end", {"turn_id": None, "messages": wire}) == {}
    assert rt.dispatch_event("s1", "agent_settled", {"aborted": False, "turn_id": None}) == {}
    assert rt.dispatch_event("s1", "agent_settled", {"aborted": False, "turn_id": None}) == {}
    captures = world.calls("hooks.post_llm_call")
    assert [c["kwargs"] for c in captures] == [{"session_id": "s1", "user_message": "first question",
                                                "assistant_response": "the answer", "platform": "pi"}]
    # an aborted or non-stop settlement captures nothing
    rt.dispatch_event("s1", "before_agent_start", {"prompt": "second"})
    rt.dispatch_event(
        "s1", "agent_end", {"messages": [{"role": "assistant", "text": "partial", "stop_reason": "length"}]}
    )
    rt.dispatch_event("s1", "agent_settled", {"aborted": False})
    assert len(world.calls("hooks.post_llm_call")) == 1


def test_icarus_off_stops_retrieval_on_the_next_prompt(world):
    world.seed(("sqlite WAL notes", "WAL"))
    rt = world.runtime()
    _, sess = world.open(rt)
    assert "message" in rt.dispatch_event("s1", "before_agent_start", {"prompt": "sqlite"})
    off = sess.command("off")
    assert "hooks are off" in off["text"] and off["level"] == "info"
    assert rt.dispatch_event("s1", "before_agent_start", {"prompt": "sqlite"}) == {}
    assert len(world.calls("hooks.pre_llm_call")) == 1
    assert ("icarus", None) in world.ui.of("status")
    assert "hooks are on" in sess.command("on")["text"]
    rt.dispatch_event("s1", "before_agent_start", {"prompt": "sqlite"})
    assert len(world.calls("hooks.pre_llm_call")) == 2  # (the backend does not re-inject the same entry)


def test_invalid_commands_write_nothing_and_context_default_writes_global(world):
    rt = world.runtime()
    _, sess = world.open(rt)
    settings_path = world.agent_dir / "settings.json"
    before = settings_path.read_bytes()
    for bad in ("on now", "context default hide moon", "context default hide project extra", "frobnicate"):
        result = sess.command(bad)
        assert result["level"] == "warning" and result["code"] == "invalid_command" and "Usage" in result["text"]
    assert settings_path.read_bytes() == before
    refused = sess.command("context default hide project")  # untrusted: project scope refused
    assert refused["level"] == "warning" and not (world.project / ".pi" / "settings.json").exists()
    saved = sess.command("context default hide")
    assert "future Pi sessions" in saved["text"] and "Current session is still visible" in saved["text"]
    doc = json.loads(settings_path.read_text())
    assert doc["piIcarusHook"]["contextDisplay"] is False and doc["piIcarusHook"]["timeoutMs"] == 10000
    assert "Startup default is hidden from global settings" in sess.command("context default")["text"]
    config = json.loads(sess.command("config")["text"])
    assert config["package"] == "pi-icarus-hook"


def test_fabric_tool_round_trips_and_backend_error_is_a_tool_error(world):
    rt = world.runtime()
    _, sess = world.open(rt)
    written = sess.tool("fabric_write", {"type": "note", "summary": "TOOL-ROUND-TRIP", "content": "by a tool",
                                         "verified": True, "evidence": "ran it"}, tool_call_id="call-1")
    assert written["status"] == "written" and tool_result(written).is_error is False
    rows = sqlite3.connect(world.fabric / "icarus_reference.sqlite3").execute(
        "SELECT summary, verified FROM entries").fetchall()
    assert rows == [("TOOL-ROUND-TRIP", "true")]
    missing = sess.tool("fabric_curate", {"entry_id": "999", "training_value": "high"})
    assert "error" in missing and tool_result(missing).is_error is True
    # validation errors never reach the worker
    invalid = sess.tool("fabric_write", {"type": "n", "summary": "s", "content": "c", "verified": "true"})
    assert "requires evidence" in invalid["error"]
    assert len(world.calls("tools.fabric_write")) == 1
    with pytest.raises(NotFound):
        sess.tool("fabric_report", {})  # admin tool not configured
    config = sess.tool("icarus_hook_config", {"schemaOnly": True})
    assert config["key"] == "piIcarusHook"


@pytest.mark.timeout(40)
def test_worker_timeout_rejects_the_queue_nothing_runs_later_and_session_start_is_not_rerun(world):
    # 3 s: the fresh worker's cold start and retrieval are inside the second prompt's deadline,
    # and a loaded host took over 1 s for them once (the prompt then ran without memory).
    world.write_global(timeoutMs=3000)
    world.seed(("sqlite WAL notes", "WAL"))
    rt = world.runtime()
    _, sess = world.open(rt)
    rt.dispatch_event("s1", "session_start", {})
    world.controls({"hooks.pre_llm_call": {"sleep_ms": 8000}})
    worker = rt.system.lookup("/root/session/s1/icarus/worker")
    queued = 5
    with ThreadPoolExecutor(queued + 1) as pool:
        prompt = pool.submit(rt.dispatch_event, "s1", "before_agent_start", {"prompt": "sqlite"})
        wait_until(lambda: world.calls("hooks.pre_llm_call"), what="pre_llm_call running")
        first_pid = world.calls("hooks.pre_llm_call")[0]["pid"]
        writes = [pool.submit(sess.tool, "fabric_write", {"type": "note", "summary": f"QUEUED-{i}", "content": "x"})
                  for i in range(queued)]
        wait_until(lambda: worker.snapshot().mailbox.depth == queued, 5, "the writes queued behind the call")
        assert prompt.result(15) == {}  # ambient: the run goes on without memory
        errors = []
        for fut in writes:
            with pytest.raises(WorkerRetired) as info:
                fut.result(15)
            errors.append(info.value.code)
    assert set(errors) == {"worker_retired"}
    assert any("timed out" in message for message, _ in world.ui.of("notify"))
    assert gone(first_pid)
    world.controls({})
    result = rt.dispatch_event("s1", "before_agent_start", {"prompt": "sqlite"})
    assert "sqlite WAL notes" in result["message"]["content"]
    retrievals = world.calls("hooks.pre_llm_call")
    assert len(retrievals) == 2 and retrievals[1]["pid"] != first_pid
    assert world.calls("tools.fabric_write") == []  # never executed, by any worker
    assert len(world.calls("hooks.on_session_start")) == 1  # the fresh worker did not re-initialise
    stats = sess.worker_stats()
    assert stats["process"]["pid"] == retrievals[1]["pid"] and stats["process"]["alive"] is True
    assert stats["workers_started"] == 2 and stats["actor"]["state"] == "running"


def test_kill_9_of_an_idle_worker_gives_the_next_call_a_fresh_worker(world):
    rt = world.runtime()
    _, sess = world.open(rt)
    sess.tool("fabric_brief", {})
    for _ in range(5):  # the call right after the death is seen: in the moment a worker's last thread ends too
        pid = sess.current_worker_pid()
        assert pid is not None
        os.kill(pid, signal.SIGKILL)
        wait_until(lambda: gone(pid), what="the worker to die")  # noqa: B023 - called within the iteration
        # Nothing was pending, so nothing is lost: the next call simply runs on a fresh worker.
        assert "recent" in sess.tool("fabric_brief", {})
        assert sess.current_worker_pid() not in (None, pid)


@pytest.mark.timeout(120)
def test_a_call_made_at_once_after_a_kill_9_of_the_idle_worker_runs_on_a_fresh_one_50_times(world):
    """No wait between the kill and the call: the call meets the worker in every moment of its
    death (the signal not yet taken, its files closing, its exit not yet shown, a zombie), and
    each time the call runs on a fresh worker -- never ``worker_crashed``."""
    rt = world.runtime()
    _, sess = world.open(rt)
    sess.tool("fabric_brief", {})
    failures: list[str] = []
    for _ in range(50):
        pid = sess.current_worker_pid()
        assert pid is not None
        os.kill(pid, signal.SIGKILL)
        try:
            assert "recent" in sess.tool("fabric_brief", {})
        except CastorError as exc:
            failures.append(f"{exc.code}: {exc.message} {exc.data}")
            sess.tool("fabric_brief", {})  # the worker was retired: the next call starts one
        assert sess.current_worker_pid() not in (None, pid)
    assert failures == [], failures


def test_a_json_py_planted_in_the_project_is_not_imported(world):
    marker = world.tmp / "planted-json-imported"
    (world.project / "json.py").write_text(f"open({str(marker)!r}, 'w').write('imported')\nraise SystemExit(9)\n")
    world.seed(("sqlite WAL notes", "WAL"))
    rt = world.runtime()
    _, sess = world.open(rt)
    assert (
        "sqlite WAL notes" in rt.dispatch_event("s1", "before_agent_start", {"prompt": "sqlite"})["message"]["content"]
    )
    assert sess.tool("fabric_brief", {})["recent"] == ["sqlite WAL notes"]
    assert not marker.exists()


def test_an_untrusted_project_cannot_choose_the_python_executable(world):
    marker = world.tmp / "project-python-ran"
    evil = world.project / "evil-python"
    evil.write_text(f"#!/bin/sh\necho ran > {marker}\nexec {sys.executable} \"$@\"\n")
    evil.chmod(0o755)
    world.write_project({"python": str(evil), "timeoutMs": 4321})
    rt = world.runtime()
    _, untrusted = world.open(rt, "untrusted", trusted=False)
    assert untrusted.config()["config"]["effective"]["python"] == sys.executable
    assert untrusted.tool("fabric_brief", {})["recent"] == []
    assert not marker.exists()
    # the same project, trusted: the setting is honoured (so the check above can fail)
    _, trusted = world.open(rt, "trusted", trusted=True)
    assert trusted.config()["config"]["effective"]["python"] == str(evil)
    trusted.tool("fabric_brief", {})
    assert marker.exists()


def test_session_close_calls_on_session_end_clears_the_footer_and_kills_the_worker(world):
    rt = world.runtime()
    _, sess = world.open(rt)
    rt.dispatch_event("s1", "session_start", {})
    pid = sess.current_worker_pid()
    world.controls({"hooks.on_session_end": {"raise": "backend refused"}})  # the hook fails; cleanup still runs
    rt.close_session("s1")
    assert [c["kwargs"] for c in world.calls("hooks.on_session_end")] == [{"session_id": "s1", "platform": "pi"}]
    assert world.ui.of("status")[-1] == ("icarus", None)
    wait_until(lambda: gone(pid), 5, "the worker to be killed")
    assert rt.system.find("/root/session/s1/icarus/worker") is None


def test_inspect_worker_of_a_session_without_an_icarus_package_says_no_worker_will_start(world):
    """``castor inspect worker --session-id ID`` of such a session read "worker actor … (None)" and
    "none yet (it starts with the first call)": no call ever starts one. It says why instead."""
    from rich.console import Console

    from castor.console.terminal import worker_table

    world.write_global(icarusDir=str(world.tmp / "nowhere"))
    rt = world.runtime()
    _, sess = world.open(rt)
    stats = sess.worker_stats()
    assert (stats["state"], stats["reason"], stats["icarus_dir"]) == ("unavailable", "icarus_dir_missing",
                                                                       str(world.tmp / "nowhere"))
    console = Console(width=400, record=True)
    console.print(worker_table({"runtime": {"pid": 1}, "worker": stats}))
    text = console.export_text()
    assert "None" not in text and "first call" not in text, text
    assert "unavailable (icarus_dir_missing: no Icarus package at" in text and "no worker starts" in text, text


def test_without_an_icarus_package_the_session_answers_cheaply_and_says_why(world):
    world.write_global(icarusDir=str(world.tmp / "nowhere"))
    rt = world.runtime()
    _, sess = world.open(rt)
    for event in ("session_start", "before_agent_start", "agent_end", "agent_settled", "context", "session_shutdown"):
        assert rt.dispatch_event("s1", event, {"prompt": "sqlite"}) == {}
    assert rt.system.find("/root/session/s1/icarus") is None
    config = sess.config()
    assert (config["state"], config["reason"], config["tools"]) == ("unavailable", "icarus_dir_missing", [])
    assert sess.command("on")["level"] == "warning"
    assert json.loads(sess.command("schema")["text"])["key"] == "piIcarusHook"
    with pytest.raises(CastorError) as info:
        sess.tool("fabric_brief", {})
    assert info.value.code == "not_found"
    assert world.ui.calls == [] and world.calls() == []


def test_hooks_false_registers_no_lifecycle_but_tools_work_and_close_kills_the_worker(world):
    world.write_global(hooks=False)
    world.seed(("sqlite WAL notes", "WAL"))
    rt = world.runtime()
    _, sess = world.open(rt)
    assert rt.dispatch_event("s1", "session_start", {}) == {}
    assert rt.dispatch_event("s1", "before_agent_start", {"prompt": "sqlite"}) == {}
    assert "not registered" in sess.command("off")["text"]
    assert sess.tool("fabric_brief", {})["recent"] == ["sqlite WAL notes"]
    pid = sess.current_worker_pid()
    rt.close_session("s1")
    wait_until(lambda: gone(pid), 5, "the worker to be killed")
    assert world.calls("hooks.on_session_start") == [] and world.calls("hooks.pre_llm_call") == []


def test_ambient_events_never_fail_the_run_even_with_garbage_or_a_crashed_controller(world):
    from castor.supervision import faults

    world.seed(("sqlite WAL notes", "WAL"))
    rt = world.runtime()
    world.open(rt)
    assert rt.dispatch_event("s1", "agent_end", {"messages": "not a list"}) == {}
    assert rt.dispatch_event("s1", "agent_settled", {"aborted": "yes", "messages": [1, None, "x"]}) == {}
    assert rt.dispatch_event("s1", "turn_start", {"anything": 1}) == {}
    hooks = rt.system.lookup("/root/session/s1/icarus/hooks")
    faults.crash_next(hooks)
    assert rt.dispatch_event("s1", "before_agent_start", {"prompt": "sqlite"}) == {}
    # the supervisor restarted the controller; the next prompt retrieves again
    wait_until(lambda: hooks.snapshot().state == "running", 5, "the controller restart")
    assert (
        "sqlite WAL notes" in rt.dispatch_event("s1", "before_agent_start", {"prompt": "sqlite"})["message"]["content"]
    )


def test_a_tool_call_logs_its_actor_tool_and_call_id_at_debug_and_nothing_of_its_arguments(world):
    """The tool call's debug record (its fields passed with the call, not a bound logger) carries
    the worker's actor path, the tool and the call id; never the arguments (private text)."""
    from castor.logs import configure_logging

    rt = world.runtime()
    _, sess = world.open(rt)
    records: list[dict] = []
    configure_logging("DEBUG", sink=lambda message: records.append(message.record))
    try:
        sess.tool("fabric_brief", {"query": "PRIVATE-ARGUMENT"}, tool_call_id="call-7")
    finally:
        configure_logging("ERROR")  # the suite's setting (tests/conftest.py)
    (record,) = [r for r in records if r["message"] == "icarus tool call"]
    assert record["level"].name == "DEBUG"
    assert record["extra"]["actor"] == sess.path("worker")
    assert record["extra"]["tool"] == "fabric_brief" and record["extra"]["tool_call_id"] == "call-7"
    assert "PRIVATE-ARGUMENT" not in repr(record["extra"]) + record["message"]


def test_a_tool_call_builds_no_debug_record_while_castors_logging_is_above_debug(world, monkeypatch):
    """With castor's own logging configured above DEBUG (the suite's ERROR), no sink takes the
    tool call's debug record, so it is not built: loguru is not called for it at all."""
    from castor.actors.icarus import session as session_module
    from castor.logs import configure_logging

    configure_logging("INFO")
    try:
        rt = world.runtime()
        _, sess = world.open(rt)
        built: list[str] = []
        monkeypatch.setattr(session_module.logger, "debug", lambda message, *a, **k: built.append(message))
        assert "error" not in sess.tool("fabric_brief", {"query": "q"}, tool_call_id="call-8")
        assert built == []
    finally:
        configure_logging("ERROR")


@pytest.mark.timeout(60)
def test_a_python_that_is_not_one_is_said_once_with_its_cause(world):
    """A ``python`` that runs but is no Python (``/bin/true``; a venv whose interpreter lost its
    library: exit 127) ends before the worker program is ready: every hook then warned "lost the
    worker process; a fresh one starts on the next call" -- false (the next fails the same way), and
    silent about the cause. Said once now, naming the python and its exit, as a python that does
    not exist is; the session goes on without memory, and its events still answer."""
    world.write_global(python="/bin/true")
    rt = world.runtime()
    world.open(rt)
    assert rt.dispatch_event("s1", "session_start", {}) == {}
    for prompt in ("one", "two", "three"):
        assert rt.dispatch_event("s1", "before_agent_start", {"prompt": prompt, "message_type": "user"}) == {}
    assert rt.dispatch_event("s1", "session_shutdown", {}) == {}
    warnings = [message for message, level in world.ui.of("notify") if level == "warning"]
    assert len(warnings) == 1, warnings
    assert "/bin/true" in warnings[0] and "before it was ready" in warnings[0] and "exit code 0" in warnings[0]


@pytest.mark.timeout(60)
def test_a_package_that_ends_the_worker_on_every_call_is_said_once_not_at_every_hook(world):
    """An ``icarus`` package whose import ends the process (``os._exit`` in its ``__init__``: a
    broken install, a backend that exits on a missing model) takes each fresh worker down in its
    first call. Every hook warned "lost the worker process; a fresh one starts on the next call" --
    after the second time, false. The first loss is said as before; a second in a row, with no
    call answered between them, is said once more naming the pattern and the exit code; then the
    session stays quiet (its events still answer) until a call succeeds again."""
    package = world.tmp / "exiting" / "icarus"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("import os\nos._exit(3)\n")
    world.write_global(icarusDir=str(package))
    rt = world.runtime()
    world.open(rt)
    assert rt.dispatch_event("s1", "session_start", {}) == {}
    for prompt in ("one", "two", "three", "four", "five"):
        assert rt.dispatch_event("s1", "before_agent_start", {"prompt": prompt, "message_type": "user"}) == {}
    warnings = [message for message, level in world.ui.of("notify") if level == "warning"]
    assert len(warnings) == 2, warnings
    assert "lost the worker process" in warnings[0]
    assert "2 calls in a row" in warnings[1] and "exit code 3" in warnings[1] and "icarusDir" in warnings[1]
    assert rt.dispatch_event("s1", "session_shutdown", {}) == {}


@pytest.mark.timeout(10)
def test_losses_in_a_row_to_a_signal_name_the_signal_not_a_negative_exit_code():
    """A worker the kernel kills in every call (``kill -9``, the OOM killer) reports exit status
    -9; the user's warning said "(exit code -9)", which reads as the package's own exit. It names
    the signal now, as the operator's retired reason does."""
    from castor.actors.icarus.session import _ObservedWorker
    from castor.messages.errors import WorkerCrashed

    warnings: list[str] = []

    class Client:
        def call(self, *args):
            raise WorkerCrashed("icarus worker exited (code -9)", data={"exit_code": -9})

    observed = _ObservedWorker(Client, warnings.append)
    for _ in range(3):
        with pytest.raises(WorkerCrashed):
            observed.call("hooks", "pre_llm_call")
    assert len(warnings) == 2 and "(killed by SIGKILL)" in warnings[1] and "-9" not in warnings[1]


@pytest.mark.timeout(10)
def test_a_call_answered_after_losses_in_a_row_makes_the_next_loss_said_again():
    """The losses-in-a-row count restarts at an answered call: a worker lost after it is news."""
    from castor.actors.icarus.session import _ObservedWorker
    from castor.messages.errors import WorkerCrashed

    outcomes = iter(["lost", "lost", "lost", "ok", "lost"])
    warnings: list[str] = []

    class Client:
        def call(self, *args):
            if next(outcomes) == "lost":
                raise WorkerCrashed("icarus worker exited (code 3)", data={"exit_code": 3})
            return "answer"

    observed = _ObservedWorker(Client, warnings.append)
    for _ in range(3):
        with pytest.raises(WorkerCrashed):
            observed.call("hooks", "pre_llm_call")
    assert observed.call("hooks", "pre_llm_call") == "answer"
    with pytest.raises(WorkerCrashed):
        observed.call("hooks", "pre_llm_call")
    assert [("lost the worker" in w, "2 calls in a row" in w) for w in warnings] == [
        (True, False), (False, True), (True, False)]

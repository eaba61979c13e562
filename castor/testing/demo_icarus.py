"""``castor demo`` section 3: the Icarus memory bridge, honestly and checked.

One :class:`~castor.runtime.Runtime` with only the Icarus component, over the
**reference backend** (``examples/icarus_reference/icarus``, a stand-in for the
private Icarus plugin) running in a real worker subprocess. Everything is
local: a JSONL session log under the demo's work dir plays the harness's
session file, and :class:`WordOverlapClassifier` plays the classifier model.

What is shown, each as a check (the demo exits 0 only if all pass):

===================  ==========================================================
step                 evidence
===================  ==========================================================
session start        ``on_session_start`` ran once; its startup context went
                     to the UI unfiltered
retrieval            ``before_agent_start`` → ``pre_llm_call`` in the worker;
                     the injection carries the relevant Fabric entry
filtering + audit    the off-topic entry is dropped; the ``icarus-context-filter``
                     entry is in the JSONL log *before* the text is released
                     (the log is held shut and the text waits for it)
audit privacy        no 12-character run of the prompt or of the retrieved
                     context appears in the audit entry
worker timeout       a retrieval sleeping past ``timeoutMs`` is killed; the
                     tool calls queued behind it fail ``worker_retired``; the
                     backend's own call log shows none of them ever ran
fresh worker         the next prompt is served by a new pid that did not
                     re-run ``on_session_start``
===================  ==========================================================

Failure behaviour: a missing reference backend is one failing check (and the
section stops); any unexpected exception propagates to ``castor demo``, which
records it as a failed check. The runtime is always shut down (worker killed).
"""

from __future__ import annotations

import json
import os
import re
import sys
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING, Any

import psutil
from rich.table import Table

from castor.actors.icarus import IcarusSession, session_of
from castor.adapters.fs import atomic_write_text, make_dirs
from castor.adapters.session_jsonl import JsonlSessionLog
from castor.composition import icarus_component
from castor.messages.errors import CastorError
from castor.ports.classifier import ClassifierRequest, ClassifierResponse, ModelEndpoint
from castor.runtime import HarnessLink, Runtime, RuntimeSettings, SessionInfo
from castor.testing.reference_backend import reference_backend

if TYPE_CHECKING:
    from castor.testing.report import DemoReport

SECTION = "icarus"
SESSION_ID = "demo-icarus"
AUDIT_TYPE = "icarus-context-filter"
#: The worker's per-call deadline in this demo (short, so the timeout step is quick).
TIMEOUT_MS = 1000
#: How long the retrieval sleeps in the timeout step (well past TIMEOUT_MS).
STALL_MS = 6000
#: Tool calls queued behind the stalled retrieval.
QUEUED_CALLS = 5
#: The audit-privacy check: no run of this many characters may leak.
LEAK_RUN = 12
#: How long the demo holds the session log shut to show that the text waits for it.
HOLD_S = 0.3

PROMPT = "how do I fix the sqlite lock contention in the build cache"
STARTUP = "[startup] Last session: you were migrating the build cache to sqlite."
RELEVANT = "sqlite WAL mode fixed the build cache lock contention"
OFF_TOPIC = "grandma's chocolate cake needs three eggs"


# ---------------------------------------------------------------------------
# Stand-ins for what cannot exist here


class WordOverlapClassifier:
    """DEMO STAND-IN for an LLM classifier (a :class:`ClassifierPort`); no model, no network.

    It judges relevance deterministically: a candidate is relevant when it
    shares a content word (4+ letters) with the user's request, else it is
    irrelevant with confidence 0.9. It reads the real request castor builds
    (``{request, candidates}`` JSON in the last message) and answers the
    classifier's JSON decision format ``{"decisions": [{id, relevant,
    confidence}]}``. It reports no usage (the audit records it as unknown).
    Its one model endpoint is on loopback, so ``classifier: default`` picks it
    as a local model; nothing ever connects to that address.
    """

    model = ModelEndpoint(provider="demo", id="word-overlap", base_url="http://127.0.0.1/word-overlap-stand-in")

    def __init__(self) -> None:
        self.requests = 0

    def list_models(self, deadline: float | None = None) -> Sequence[ModelEndpoint] | None:
        return [self.model]

    def complete(self, request: ClassifierRequest, deadline: float) -> ClassifierResponse:
        self.requests += 1
        payload = json.loads(request.messages[-1].content)
        wanted = _words(payload["request"])
        decisions = [{"id": c["id"], "relevant": bool(wanted & _words(c["text"])), "confidence": 0.9}
                     for c in payload["candidates"]]
        return ClassifierResponse(text=json.dumps({"decisions": decisions}), usage=None)


def _words(text: str) -> set[str]:
    return {w for w in re.findall(r"[a-z]+", text.lower()) if len(w) >= 4}


class _DemoUi:
    """The harness UI of this demo: prints toasts and injected messages, records them."""

    def __init__(self, print_line: Callable[[str], None]) -> None:
        self._print = print_line
        self._lock = threading.Lock()
        self.messages: list[tuple[str, str]] = []
        self.notices: list[str] = []

    def send_message(self, custom_type: str, content: str, *, display: bool, trigger_turn: bool = False) -> None:
        with self._lock:
            self.messages.append((custom_type, content))
        if display:
            self._print(f"    [dim]ui message ({custom_type}): {content}[/dim]")

    def set_status(self, key: str, text: str | None) -> None:
        pass

    def notify(self, message: str, level: str = "info", *, code: str | None = None) -> None:
        with self._lock:
            self.notices.append(message)
        self._print(f"    [dim]ui {level}: {message}[/dim]")


class _HeldLog:
    """The JSONL session log behind a gate, to show the text waits for the audit."""

    def __init__(self, inner: JsonlSessionLog) -> None:
        self.inner = inner
        self.gate = threading.Event()
        self.gate.set()
        self.entered = threading.Event()

    def append_entry(self, custom_type: str, data: dict[str, Any], deadline: float, *,
                     expires: bool = False) -> None:
        self.entered.set()
        self.gate.wait(max(0.0, deadline - time.monotonic()))
        self.inner.append_entry(custom_type, data, deadline, expires=expires)


# ---------------------------------------------------------------------------
# Observations


def leaked_runs(haystack: str, secrets: Sequence[str], n: int = LEAK_RUN) -> list[str]:
    """Every ``n``-character run of any secret that occurs in ``haystack``."""
    found = []
    for secret in secrets:
        for i in range(0, max(0, len(secret) - n + 1)):
            run = secret[i:i + n]
            if run.strip() and run in haystack:
                found.append(run)
    return found


def _read_jsonl(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def _gone(pid: int) -> bool:
    try:
        return bool(psutil.Process(pid).status() == psutil.STATUS_ZOMBIE)
    except psutil.NoSuchProcess:
        return True


def _wait(predicate: Callable[[], Any], timeout: float) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value or time.monotonic() >= deadline:
            return value
        time.sleep(0.01)


class _Scene:
    """The demo's files, runtime and session, plus what the backend logged."""

    def __init__(self, root: Path, backend: Path, console_print: Callable[[str], None]) -> None:
        self.dir = root / "icarus"
        self.project = self.dir / "project"
        self.agent_dir = self.dir / "agent"
        for d in (self.project, self.agent_dir):
            make_dirs(d)
        self.call_log = self.dir / "backend-calls.jsonl"
        self.control_file = self.dir / "backend-controls.json"
        self.session_log_path = self.dir / "session.jsonl"
        for stale in (self.call_log, self.control_file, self.session_log_path):
            stale.unlink(missing_ok=True)
        section = {"icarusDir": str(backend), "python": sys.executable, "fabricDir": str(self.dir / "fabric"),
                   "classifier": "default", "classifierTimeoutMs": 3000, "timeoutMs": TIMEOUT_MS}
        atomic_write_text(self.agent_dir / "settings.json", json.dumps({"piIcarusHook": section}, indent=2))
        self.env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "PI_CODING_AGENT_DIR": str(self.agent_dir),
                    "ICARUS_REF_CALL_LOG": str(self.call_log), "ICARUS_REF_CONTROL_FILE": str(self.control_file),
                    "ICARUS_REF_STARTUP_CONTEXT": STARTUP}
        self.ui = _DemoUi(console_print)
        self.log = _HeldLog(JsonlSessionLog(self.session_log_path))
        self.classifier = WordOverlapClassifier()
        self.runtime = Runtime(RuntimeSettings(), components=[icarus_component(env=self.env, home=str(self.dir))])

    def open(self) -> IcarusSession:
        ctx = self.runtime.open_session(
            SessionInfo(session_id=SESSION_ID, cwd=str(self.project), trusted=False),
            HarnessLink(agent=None, session_log=self.log, ui=self.ui, classifier=self.classifier))
        return session_of(ctx)

    def event(self, event: str, data: dict[str, Any]) -> dict[str, Any]:
        return self.runtime.dispatch_event(SESSION_ID, event, data)

    def controls(self, controls: dict[str, Any]) -> None:
        atomic_write_text(self.control_file, json.dumps(controls))  # an error names the file

    def calls(self, name: str) -> list[dict[str, Any]]:
        return [r for r in _read_jsonl(self.call_log) if r.get("phase") == "start" and r.get("call") == name]

    def audits(self) -> list[dict[str, Any]]:
        return [e for e in _read_jsonl(self.session_log_path) if e.get("customType") == AUDIT_TYPE]


# ---------------------------------------------------------------------------
# The section


def section_icarus(report: DemoReport, root: Path) -> None:
    """Run the Icarus section under ``root / "icarus"``; every outcome is a ``report.check``."""
    from castor.testing.report import section_header

    console = report.console
    section_header(console, "3. icarus memory bridge (reference backend)")
    backend = reference_backend()
    if not report.check(SECTION, "reference backend present", (backend / "__init__.py").is_file(), str(backend)):
        return
    scene = _Scene(root, backend, console.print)
    rows: list[tuple[str, str, str]] = []
    try:
        sess = scene.open()
        _start_and_retrieve(report, scene, sess, rows)
        _timeout_and_fresh_worker(report, scene, sess, rows)
    finally:
        scene.runtime.shutdown(10)
    console.print(_table(rows))
    console.print(f"  [dim]session log: {scene.session_log_path}   backend call log: {scene.call_log}[/dim]")


def _start_and_retrieve(report: DemoReport, scene: _Scene, sess: IcarusSession,
                        rows: list[tuple[str, str, str]]) -> None:
    check = report.check
    scene.event("session_start", {"reason": "startup"})
    starts = scene.calls("hooks.on_session_start")
    startup_shown = ("icarus-session-context", STARTUP) in scene.ui.messages
    check(SECTION, "session_start → on_session_start once, startup context shown unfiltered",
          len(starts) == 1 and startup_shown and scene.classifier.requests == 0,
          f"worker pid {starts[0]['pid']}" if starts else "no on_session_start in the backend log")
    rows.append(("session start", "on_session_start in the worker", f"pid {starts[0]['pid'] if starts else '?'}"))

    for summary, content in ((RELEVANT, "journal_mode=WAL plus busy_timeout; fix confirmed"),
                             (OFF_TOPIC, "fix the frosting with butter")):
        written = sess.tool("fabric_write", {"type": "note", "summary": summary, "content": content})
        if not (isinstance(written, dict) and written.get("status") == "written"):
            check(SECTION, "fabric_write through the worker", False, str(written)[:120])
            return

    # Hold the session log shut: the filtered text must wait for its audit.
    scene.log.gate.clear()
    with ThreadPoolExecutor(1, thread_name_prefix="demo-prompt") as pool:
        pending = pool.submit(scene.event, "before_agent_start", {"prompt": PROMPT, "message_type": "user"})
        entered = scene.log.entered.wait(10)
        time.sleep(HOLD_S)  # a visible hold: nothing may come back while the audit is not persisted
        held = entered and not pending.done() and scene.audits() == []
        scene.log.gate.set()
        result = pending.result(20)
    audits = scene.audits()
    content = (result.get("message") or {}).get("content", "") if isinstance(result, dict) else ""
    retrieval = scene.calls("hooks.pre_llm_call")
    check(SECTION, "before_agent_start → pre_llm_call in the worker → injected memory",
          len(retrieval) == 1 and RELEVANT in content,
          f"{len(content)} chars injected")
    audit = audits[0]["data"] if audits else {}
    counts = audit.get("counts", {})
    check(SECTION, "filtering keeps the relevant entry, drops the off-topic one",
          RELEVANT in content and OFF_TOPIC not in content and counts.get("rejected") == 1,
          f"kept {counts.get('kept')}, rejected {counts.get('rejected')}, outcome {audit.get('outcome')}")
    check(SECTION, "audit persisted in the JSONL session log before the text was released",
          held and len(audits) == 1, f"text held {HOLD_S:.1f}s while the log was shut")
    raw_context = "\n".join([RELEVANT, OFF_TOPIC, content])
    leaks = leaked_runs(json.dumps(audits), [PROMPT, raw_context, SESSION_ID])
    check(SECTION, f"audit holds no raw text (no {LEAK_RUN}-char run of prompt or context)",
          bool(audits) and not leaks, f"{len(leaks)} leaked runs")
    rows.append(("retrieval", "pre_llm_call → memory injected", f"{len(content)} chars"))
    rows.append(("filtering", f"{counts.get('kept')} kept / {counts.get('rejected')} rejected",
                 f"audit {audit.get('outcome')} in session.jsonl first"))


def _timeout_and_fresh_worker(report: DemoReport, scene: _Scene, sess: IcarusSession,
                              rows: list[tuple[str, str, str]]) -> None:
    check = report.check
    worker = scene.runtime.system.lookup(sess.path("worker"))
    scene.controls({"hooks.pre_llm_call": {"sleep_ms": STALL_MS}})
    started = time.monotonic()
    with ThreadPoolExecutor(QUEUED_CALLS + 1, thread_name_prefix="demo-timeout") as pool:
        stalled = pool.submit(scene.event, "before_agent_start", {"prompt": PROMPT})
        running = _wait(lambda: len(scene.calls("hooks.pre_llm_call")) >= 2, 10)
        old_pid = scene.calls("hooks.pre_llm_call")[-1]["pid"] if running else None
        queued = [pool.submit(sess.tool, "fabric_write",
                              {"type": "note", "summary": f"QUEUED-WRITE-{i}", "content": "must never run"})
                  for i in range(QUEUED_CALLS)]
        depth = _wait(lambda: worker.snapshot().mailbox.depth >= QUEUED_CALLS, 5)
        answer = stalled.result(20)
        codes = []
        for fut in queued:
            try:
                fut.result(20)
                codes.append("ok")
            except CastorError as exc:
                codes.append(str(exc.code))
    elapsed = time.monotonic() - started
    killed = old_pid is not None and _wait(lambda: _gone(old_pid), 5)
    check(SECTION, f"retrieval past timeoutMs={TIMEOUT_MS} is killed; the turn goes on without memory",
          bool(running) and killed and answer == {} and elapsed < STALL_MS / 1000.0,
          f"answered after {elapsed:.1f}s, pid {old_pid} gone: {killed}, "
          f"warning shown: {any('timed out' in n for n in scene.ui.notices)}")
    check(SECTION, f"{QUEUED_CALLS} queued calls rejected worker_retired",
          bool(depth) and codes == ["worker_retired"] * QUEUED_CALLS, ", ".join(sorted(set(codes))))

    scene.controls({})
    after = scene.event("before_agent_start", {"prompt": PROMPT})
    retrievals = scene.calls("hooks.pre_llm_call")
    new_pid = retrievals[-1]["pid"] if retrievals else None
    content = (after.get("message") or {}).get("content", "")
    check(SECTION, "next prompt served by a fresh worker (new pid)",
          len(retrievals) == 3 and new_pid not in (None, old_pid) and RELEVANT in content,
          f"pid {old_pid} → {new_pid}")
    executed = [c for c in scene.calls("tools.fabric_write") if "QUEUED-WRITE" in json.dumps(c.get("args"))]
    check(SECTION, "backend call log: no queued call ever executed", executed == [],
          f"{len(scene.calls('tools.fabric_write'))} fabric_write calls logged, all before the timeout")
    starts = scene.calls("hooks.on_session_start")
    check(SECTION, "the fresh worker did not re-run on_session_start", len(starts) == 1,
          f"{len(starts)} on_session_start call(s) in the backend log")
    stats = sess.worker_stats()
    rows.append(("worker timeout", f"pid {old_pid} killed after {TIMEOUT_MS} ms",
                 f"{codes.count('worker_retired')}/{QUEUED_CALLS} queued rejected, 0 executed"))
    rows.append(("fresh worker", f"pid {new_pid} serves the next prompt",
                 f"workers started {stats.get('workers_started')}, on_session_start ×{len(starts)}"))


def _table(rows: list[tuple[str, str, str]]) -> Table:
    table = Table(title="icarus bridge")
    table.add_column("step")
    table.add_column("what happened")
    table.add_column("evidence")
    for row in rows:
        table.add_row(*row)
    return table


__all__ = ["WordOverlapClassifier", "leaked_runs", "reference_backend", "section_icarus"]

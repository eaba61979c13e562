"""IcarusSession: one harness session's Icarus bridge, the facade the endpoint methods use.

:mod:`castor.actors.icarus.component` builds one per session and keeps it in
``SessionContext.extras["icarus"]``; it knows the session's settings, the
children it asked the runtime to start, and how to reach them (``icarus.tool``,
``icarus.command``, ``icarus.config``, ``ops.worker``).

Harness events (``on_event``)
-----------------------------
=======================  =====================================  ==============================================
event (data)             sent to the HookController as          result returned to the harness
=======================  =====================================  ==============================================
``session_start``        ``session_start{session_id}`` — the    ``None``; startup context goes out through
                         session's own id (payload ids are       ``message.send`` (never filtered)
                         ignored)
``before_agent_start``   ``prompt``; ``custom`` when             ``{message: {custom_type:
{prompt, message_type}   ``message_type == "custom"``            "icarus-memory-context", content, display}}``
                                                                or ``None``
``agent_end {messages}`` messages, wire summaries               ``None``
                         ``{role, text, stop_reason}`` mapped
                         to ``{role, content, stopReason}``
``agent_settled``        ``aborted`` (+ messages if any)         ``None`` (capture runs at most once)
``session_shutdown``     ``session_shutdown``, once the Fabric  ``None`` once ``on_session_end`` ran and the
                         tool calls still running after         worker is closed
                         ``QUIT_GRACE_S`` are cancelled
``context``              ``context``                             ``None`` (Icarus injects before the turn)
anything else            not forwarded                           ``None``
=======================  =====================================  ==============================================

Guarantees
----------
* **Ambient**: ``on_event`` never raises. A failure in this layer (controller
  gone, bad payload, a wait past its bound) gives ``None`` and one
  ``ui.notify`` warning with fixed text; a worker ``timeout``, crash or backend
  error during a hook call also warns (codes only, never context or error
  text). The user's run always continues.
* **Cheap when off**: with no Icarus package at ``icarusDir`` the session gets
  no actors and every event is answered ``None`` without a message hop; with
  ``hooks: false`` only ``session_shutdown`` reaches the controller (it closes
  a worker the tools may have started).
* **Filtering** needs a place to put the audit: with no session log
  (``HarnessLink.session_log is None``) or ``classifier: none`` it is off and
  retrieved context is injected unfiltered. A missing classifier port is the
  spec's *registry missing*: the original context is kept and a
  ``fallback/no_registry`` audit is written.
* ``on_close`` runs the shutdown path (``on_session_end``, footer cleared, the
  worker closed even when the hook fails) within a bound, then closes the
  worker clients; stopping the session supervisor afterwards kills whatever
  is left.
* Explicit tools (:meth:`IcarusSession.tool`) bypass the controller: their
  transport errors (``timeout``, ``worker_crashed``, ``worker_retired``,
  ``internal``) are raised typed and never retried; a backend ``{error}`` is
  a value the caller marks ``is_error``.
"""

from __future__ import annotations

import json
import math
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

from castor import tree
from castor._log import LOGGING_SETUP, logger
from castor.actors.icarus.audit import DEFAULT_AUDIT_TIMEOUT, AuditActor
from castor.actors.icarus.classifier import ClassifierActor
from castor.actors.icarus.hook_controller import QUIT_GRACE_S, HookClient, HookController, PromptDoor
from castor.actors.icarus.messages import (
    AGENT_END,
    AGENT_SETTLED,
    BEFORE_AGENT_START,
    CONTEXT,
    SESSION_SHUTDOWN,
    SESSION_START,
)
from castor.actors.icarus.worker import IcarusWorkerClient, WorkerCrashLoop, icarus_worker_spec
from castor.domain.icarus import lifecycle as lc
from castor.domain.icarus.classify import parse_choice
from castor.domain.icarus.commands import (
    USAGE,
    CommandError,
    ContextCommand,
    ContextDefaultCommand,
    HooksCommand,
    IcarusCommand,
    InspectCommand,
    parse_command,
)
from castor.domain.icarus.crash_loop import CrashLoopLimit
from castor.domain.icarus.settings import (
    KEY_BY_NAME,
    IcarusSettings,
    SettingsLayer,
    Source,
    apply_bool_default,
    config_inspection,
    config_schema,
    inspect_bool,
    plan_default_write,
    scope_bool,
)
from castor.domain.icarus.tools import (
    CONFIG_TOOL,
    ToolValidationError,
    config_tool_result,
    prepare_call,
    registered_tools,
)
from castor.domain.icarus.worker_protocol import death_words
from castor.messages.errors import CastorError, ErrorCode, NotFound
from castor.messages.ids import is_safe_id
from castor.ports.classifier import ClassifierPort, ClassifierRequest, ClassifierResponse, ModelEndpoint
from castor.ports.icarus_backend import IcarusBackend, WorkerProcessPort
from castor.ports.session import SessionPort, SessionUiPort
from castor.ports.session_component import EarlyAnswer, SessionContext
from castor.shown import one_line
from castor.supervision import ActorHandle, CancelToken, ChildSpec
from castor.supervision.supervisor import WhichChildren

COMPONENT = "icarus"
EXTRAS_KEY = "icarus"
STATUS_KEY = lc.STATUS_KEY
#: Seconds added to every bounded wait on the controller (lane hop, kill + reap).
WAIT_GRACE_S = 3.0
#: Bound for events that never touch the worker (agent_end, context).
QUICK_EVENT_S = 5.0
#: Bound for waiting on the session's supervisors to finish starting their children.
READY_TIMEOUT_S = 10.0

#: Worker error codes a hook call warns about with these words (``worker_retired``: below).
_WARN_CODES: dict[str, str] = {ErrorCode.TIMEOUT: "timed out; the worker was stopped and starts fresh on the next call",
               ErrorCode.WORKER_CRASHED: "lost the worker process; a fresh one starts on the next call",
               ErrorCode.INTERNAL: "failed in the memory backend"}
#: Why a worker was retired that a hook call refused for it does not warn about: the crash loop is
#: said once when the worker is given up, and a close is the session's own end.
_QUIET_RETIREMENTS = frozenset({"crash_loop", "closed"})
#: What a hook's step loses when the backend's storage refuses it, in the storage warning's words.
_STORAGE_STEP = {"post_llm_call": ("to capture the finished turn", "it is not in memory"),
                 "pre_llm_call": ("the memory retrieval", "this prompt ran without memory"),
                 "on_session_start": ("the session's start", "it ran without its startup memory"),
                 "on_session_end": ("the session's end", "what it gathered is not kept")}
_LAYER_WARNING = "Icarus: the {event} hook failed in castor ({code}); this step ran without memory."
_SOURCE_LABEL = {Source.BUILTIN: "built-in default", Source.GLOBAL: "global settings",
                 Source.PROJECT: "project settings", Source.ENV: "environment"}


# ---------------------------------------------------------------------------
# Stand-ins for ports the harness may not offer


class _NoRegistry:
    """The harness has no classifier: the spec's *registry missing* (original text, ``no_registry``)."""

    def list_models(self, deadline: float | None = None) -> list[ModelEndpoint] | None:
        return None

    def complete(self, request: ClassifierRequest, deadline: float) -> ClassifierResponse:
        raise NotFound("no classifier registry in this harness")


class _ObservedWorker:
    """``WorkerCalls`` for the controller's lane: warns the user when a hook call loses the worker.

    The client is created on first use (the worker actor is a sibling that
    starts before the controller, but a lazy lookup survives restarts too).
    """

    def __init__(self, client: Callable[[], IcarusWorkerClient], warn: Callable[..., None]) -> None:
        self._client = client
        #: The client once made (the session makes it once and keeps it): read without a call.
        self._made: IcarusWorkerClient | None = None
        self._warn = warn
        self._told_cannot_start = False
        self._told_missing: set[str] = set()  # hooks the package lacks, said once each
        #: Hooks the backend's storage refused since their last answered call (said once each).
        self._storage_refused: set[str] = set()
        # Workers lost in a row, no call answered between them (see below).
        self._losses_in_a_row = 0

    def call(self, module: str, function: str, args: list[Any] | None = None,
             kwargs: dict[str, Any] | None = None, timeout: float | None = None,
             token: CancelToken | None = None) -> Any:
        try:
            result = (self._made or self._make()).call(module, function, args, kwargs, timeout, token)
        except CastorError as exc:
            reason = (exc.data or {}).get("reason")
            if reason in ("spawn_failed", "exited_before_ready"):
                # No worker ever ran (the settings' python is missing, or runs but is no Python:
                # /bin/true, a venv whose interpreter lost its library): "lost the worker" on every
                # prompt named neither the cause nor a fix. Said once, with the cause.
                if not self._told_cannot_start:
                    self._told_cannot_start = True
                    python = (exc.data or {}).get("python")
                    named = f" (python {one_line(str(python))!r})" if python else ""
                    what = (exc.message if reason == "spawn_failed" else
                            "icarus worker's python ended before it was ready "
                            f"(exit code {(exc.data or {}).get('exit_code')})")
                    self._warn(f"Icarus: {what}{named}; hooks run without memory until it can start "
                               "(check the python and icarusDir settings).")
                raise
            if reason == "missing_function":
                # An older or customised Icarus without this hook: every call of it fails the same
                # way, so it is said once, as what it is (not "failed in the memory backend").
                if function not in self._told_missing:
                    self._told_missing.add(function)
                    self._warn(f"Icarus: the icarus package has no {module}.{function}; Pi sessions run "
                               "without that step (check the package in the icarusDir setting).")
                raise
            if exc.code == ErrorCode.WORKER_CRASHED:
                # A package that ends the process in every call (an ``os._exit`` in its import, a
                # backend that exits on a missing model) takes each fresh worker down: "a fresh one
                # starts on the next call" is true once and false after. The second loss in a row
                # with no call answered between them names the pattern; then quiet until a call
                # is answered again.
                self._losses_in_a_row += 1
                if self._losses_in_a_row == 2:
                    # "killed by SIGKILL" for a signal (the OOM killer), not "exit code -9"
                    how = death_words((exc.data or {}).get("exit_code")) or "exit status unknown"
                    self._warn(f"Icarus: the worker process ended during {self._losses_in_a_row} calls in a "
                               f"row ({how}); hooks run without memory, and further losses "
                               "are not reported until a call succeeds (check the icarus package in the "
                               "icarusDir setting: its import or a hook ends the process).")
                if self._losses_in_a_row > 1:
                    raise
            if exc.code == ErrorCode.STORAGE_UNAVAILABLE:
                # The backend's disk refused the step (full, read-only, failing): a capture lost
                # this way is a memory the user believes kept. Said once per hook until that hook
                # works again, typed, naming the errno only (the error's text may quote the data).
                if function not in self._storage_refused:
                    self._storage_refused.add(function)
                    errno_name = (exc.data or {}).get("errno")
                    named = one_line(errno_name) if isinstance(errno_name, str) and errno_name else "refused"
                    step, lost = _STORAGE_STEP.get(function, (function, "this step ran without memory"))
                    self._warn(f"Icarus: the memory storage refused {step} ({named}): {lost}. Free space (or "
                               "fix the storage); this is not said again until it works.",
                               code=ErrorCode.STORAGE_UNAVAILABLE)
                raise
            if exc.code == ErrorCode.WORKER_RETIRED and reason not in _QUIET_RETIREMENTS:
                # Refused unsent: the call waited behind another (a Fabric tool call) whose timeout
                # or cancel retired the worker. The user saw that tool fail, never that this step
                # lost its memory; the next call gets a fresh worker.
                why_retired = one_line(str(reason)) if isinstance(reason, str) and reason else "retired"
                self._warn(f"Icarus: {function} did not run: the worker was stopped while it waited "
                           f"({why_retired}); a fresh one starts on the next call. This step ran without memory.")
                raise
            why = _WARN_CODES.get(str(exc.code))
            if why is not None:
                self._warn(f"Icarus: {function} {why}. This step ran without memory.")
            raise
        self._losses_in_a_row = 0
        if self._storage_refused:
            self._storage_refused.discard(function)
        return result

    def _make(self) -> IcarusWorkerClient:
        self._made = client = self._client()
        return client

    def close(self) -> None:
        self._client().close()


# ---------------------------------------------------------------------------
# Payload mapping (harness wire → HookController)


def _wire_message(msg: Any) -> Any:
    """A wire summary ``{role, text, stop_reason}`` → the lifecycle's ``{role, content, stopReason}``."""
    if not isinstance(msg, dict):
        return msg
    out = dict(msg)
    if "content" not in out and "text" in out:
        out["content"] = out["text"]
    if "stopReason" not in out and "stop_reason" in out:
        out["stopReason"] = out["stop_reason"]
    return out


def _messages(data: Mapping[str, Any]) -> list[Any]:
    messages = data.get("messages")
    return [_wire_message(m) for m in messages] if isinstance(messages, (list, tuple)) else []


def controller_payload(event: str, data: Mapping[str, Any], session_id: str) -> dict[str, Any] | None:
    """The HookController payload for a harness event, or None when Icarus ignores the event."""
    if event == SESSION_START:
        return {"session_id": session_id}
    if event == BEFORE_AGENT_START:
        custom = data.get("message_type") == "custom" or data.get("custom") is True
        payload: dict[str, Any] = {"prompt": data.get("prompt"), "custom": custom}
        if isinstance(data.get("model"), dict):
            payload["model"] = data["model"]
        return payload
    if event == AGENT_END:
        return {"messages": _messages(data)}
    if event == AGENT_SETTLED:
        return {"aborted": data.get("aborted") is True, "messages": _messages(data)}
    if event in (SESSION_SHUTDOWN, CONTEXT):
        return {}
    return None


def wire_result(result: dict[str, Any] | None) -> dict[str, Any] | None:
    """The controller's injection in the Pi extension's snake_case shape."""
    if not result:
        return None
    message = result.get("message")
    if not isinstance(message, dict):
        return None
    return {"message": {"custom_type": message.get("customType", lc.MEMORY_CONTEXT_TYPE),
                        "content": message.get("content", ""), "display": bool(message.get("display"))}}


# ---------------------------------------------------------------------------
# The per-session facade


#: While a settings file stays refused by its storage, a call reads the settings again once this
#: many seconds have passed since the last read: a fault that clears by itself (an ``EIO``) leaves
#: the file's ``stat`` as it was, so only time tells that it may read now.
SETTINGS_RETRY_S = 2.0
#: The clock of that back-off (a test moves its own).
_now = time.monotonic

@dataclass
class IcarusSession:
    """One session's bridge: what the component started and how to reach it."""

    ctx: SessionContext
    backend: IcarusBackend
    settings: IcarusSettings
    available: bool
    reason: str | None  # why unavailable (a code)
    filtering: bool
    filtering_reason: str | None
    ui: SessionUiPort
    _workers: list[WorkerProcessPort] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _hooks: HookClient | None = None
    #: The controller's prompt step without an ask, shared by its incarnations and the client.
    _door: PromptDoor = field(default_factory=PromptDoor)
    _tool_client: IcarusWorkerClient | None = None
    _hook_client: IcarusWorkerClient | None = None
    _spawn: Callable[[], WorkerProcessPort] | None = None
    _spawned: int = 0  # worker processes constructed (one per incarnation that got a call)
    _crash_loop: WorkerCrashLoop | None = None  # the session's worker deaths, across incarnations
    _settings_said: set[str] = field(default_factory=set)  # the settings' warnings logged, each once
    _settings_retry_at: float = 0.0  # while a file is refused: when a call reads the settings again anyway

    def __post_init__(self) -> None:
        self._say_settings_warnings()
        if self.settings.refused_files:
            self._settings_retry_at = _now() + SETTINGS_RETRY_S

    # -- settings the storage refused -------------------------------------------
    def _reread_settings(self) -> None:
        """Read the settings again, as a session's start reads them, when a file that counts was
        refused by its storage (``EACCES``, ``EIO``) and has changed since (one ``stat`` each), or,
        while one stays refused, once :data:`SETTINGS_RETRY_S` have passed since the last read (a
        fault that clears by itself, an ``EIO``, changes nothing a ``stat`` shows): at most one
        read per back-off, however many calls. The new values are the session's from this call
        on: its tools, their deadlines, ``icarus.config``, and the launch of its next fresh
        worker. What its running actors were built with at the start (whether it has Icarus at
        all, the hook controller's switches, the filter) stays until the session is opened again."""
        refused = self.settings.refused_files
        backend = self.backend
        changed = not all(backend.settings_signature(path) == seen for path, seen in refused)
        if not changed and _now() < self._settings_retry_at:
            return
        with self._lock:
            if self.settings.refused_files is not refused:
                return  # another call read them meanwhile
            self._settings_retry_at = _now() + SETTINGS_RETRY_S
            try:
                fresh = backend.load_settings(self.ctx.info.cwd, trusted=self.ctx.info.trusted)
            except CastorError as exc:  # no descriptor to read with: the next call tries again
                logger.bind(actor=self.path(), code=str(exc.code)).warning("icarus settings not read again")
                return
            self.settings = fresh
            if self._spawn is not None:
                self._spawn = backend.worker_spawn(fresh, self.ctx.info.cwd)
        if not changed and [path for path, _ in fresh.refused_files] == [path for path, _ in refused]:
            return  # the back-off's read, refused as before: said once already (its warning)
        logger.bind(actor=self.path()).info("icarus settings read again: a file refused before changed"
                                            if changed else "icarus settings read again: a file refused before "
                                            "was read after its fault cleared")
        self._say_settings_warnings()
        if not self.available and backend.package_present(fresh.icarus_dir):
            logger.bind(actor=self.path(), icarus_dir=fresh.icarus_dir).warning(
                "icarus settings read again name a package this session started without: Icarus "
                "runs from the session's next open")

    def _say_settings_warnings(self) -> None:
        """Log each of the settings' warnings (``icarus.config`` lists them) the first time this
        session meets it: once per distinct cause, never per call."""
        for text in self.settings.warnings:
            if text not in self._settings_said:
                self._settings_said.add(text)
                logger.bind(actor=self.path()).warning("icarus.config warning: {text}", text=text)

    # -- paths and handles ----------------------------------------------------
    @property
    def session_id(self) -> str:
        return self.ctx.info.session_id

    @cached_property
    def icarus_session_id(self) -> str:
        """The id Icarus's hooks get: the harness's own session id when its ``session.open`` flags
        name one (``harness_session_id``; ``""`` when the harness has none, a Pi session without
        an id that the extension opened under an id of its own), else castor's session id. An
        empty id is never deduplicated: every ``session_start`` runs ``on_session_start``. Read
        once: a session's flags never change."""
        named = self.ctx.info.flags.get("harness_session_id")
        return named if isinstance(named, str) and (named == "" or is_safe_id(named)) else self.session_id

    def path(self, *segments: str) -> str:
        return self.ctx.child(COMPONENT, *segments)

    @cached_property
    def _worker_path(self) -> str:
        """The worker actor's path (the tool call's debug record names it): made once, not per call."""
        return self.path("worker")

    def _lookup(self, *segments: str) -> ActorHandle:
        """A child handle, once the session's supervisors have started their children.

        ``Runtime.open_session`` returns when the session supervisor is up; its
        grandchildren start on the supervisors' own threads right after. An ask
        to a supervisor is handled only after its ``on_start`` started every
        child, so asking the session and then the icarus supervisor orders us
        after the registration -- no polling.
        """
        system = self.ctx.runtime.system
        path = self.path(*segments)
        if system.find(path) is None:
            system.lookup(self.ctx.path).ask(WhichChildren(), timeout=READY_TIMEOUT_S)
            system.lookup(self.path()).ask(WhichChildren(), timeout=READY_TIMEOUT_S)
        return system.lookup(path)

    def hooks(self) -> HookClient:
        hooks = self._hooks  # set once, never unset: no lock to read it (every hook call reads it)
        if hooks is not None:
            return hooks
        with self._lock:
            if self._hooks is None:
                self._hooks = HookClient(self._lookup("hooks"), door=self._door)
            return self._hooks

    def _worker_client(self, attr: str) -> IcarusWorkerClient:
        client: IcarusWorkerClient | None = getattr(self, attr)  # set once, never unset: no lock to read it
        if client is not None:
            return client
        with self._lock:
            client = getattr(self, attr)
            if client is None:
                client = IcarusWorkerClient(self._lookup("worker"),
                                            timeout_ms=self.settings.timeout_ms)
                setattr(self, attr, client)
            return client

    def tool_worker(self) -> IcarusWorkerClient:
        return self._worker_client("_tool_client")

    def hook_worker(self) -> IcarusWorkerClient:
        return self._worker_client("_hook_client")

    # -- children ---------------------------------------------------------------
    def spawn_worker(self) -> WorkerProcessPort:
        """Construct a worker for a fresh IcarusWorkerActor incarnation, remembering it for stats."""
        assert self._spawn is not None, "children() sets the spawn callable"
        worker = self._spawn()
        with self._lock:
            self._spawned += 1
            self._workers.append(worker)
            del self._workers[:-4]  # stats need the latest only; keep a short history
        return worker

    def children(self) -> list[ChildSpec]:
        if not self.available:
            return []
        s = self.settings
        self._spawn = self.backend.worker_spawn(s, self.ctx.info.cwd)
        runtime = self.ctx.runtime.settings
        self._crash_loop = WorkerCrashLoop(CrashLoopLimit(max_deaths=runtime.icarus_worker_max_deaths,
                                                          within_s=runtime.icarus_worker_death_window_s,
                                                          cool_down_s=runtime.icarus_worker_cool_down_s))
        specs = [icarus_worker_spec("worker", self.spawn_worker, self.backend.next_request_id,
                                    timeout_ms=s.timeout_ms, crash_loop=self._crash_loop)]
        if self.filtering:
            port: ClassifierPort = self.ctx.harness.classifier or _NoRegistry()
            log: SessionPort = self.ctx.harness.session_log  # type: ignore[assignment]  # checked for None just above; the harness link types it optional
            choice = parse_choice(s.classifier)
            specs.append(tree.ICARUS_CLASSIFIER.child_spec(lambda: ClassifierActor(port, choice)))
            specs.append(tree.ICARUS_AUDIT.child_spec(lambda: AuditActor(log, self.ui,
                                                                         audit_timeout=DEFAULT_AUDIT_TIMEOUT)))
        specs.append(tree.ICARUS_HOOKS.child_spec(self._controller))
        return [tree.ICARUS.supervisor_spec(specs, id=COMPONENT)]

    def _controller(self) -> HookController:
        s = self.settings
        system = self.ctx.runtime.system
        config = lc.HookConfig(platform=s.platform, footer_status=s.footer_status, hooks_registered=s.hooks,
                               filtering=self.filtering, context_display=s.context_display,
                               session_id=self.icarus_session_id)
        return HookController(
            config,
            worker=_ObservedWorker(self.hook_worker, self.warn),
            ui=self.ui,
            classifier=system.lookup(self.path("classifier")) if self.filtering else None,
            audit=system.lookup(self.path("audit")) if self.filtering else None,
            worker_timeout=s.timeout_ms / 1000.0,
            classifier_timeout=s.classifier_timeout_ms / 1000.0,
            door=self._door,
        )

    # -- ui ---------------------------------------------------------------------
    def warn(self, text: str, *, code: str | None = None) -> None:
        """One ``warning`` toast to the harness (``code``: its stable error code, if it has one);
        a UI failure is swallowed."""
        try:
            if code is None:
                self.ui.notify(text, "warning")
            else:
                self.ui.notify(text, "warning", code=code)
        except Exception:  # noqa: BLE001 - a toast never fails the run
            pass

    # -- events -----------------------------------------------------------------
    def wait_bound(self, event: str) -> float:
        s = self.settings
        worker = s.timeout_ms / 1000.0 + WAIT_GRACE_S
        if event == BEFORE_AGENT_START:
            return worker + s.classifier_timeout_ms / 1000.0 + DEFAULT_AUDIT_TIMEOUT
        if event in (SESSION_START, AGENT_SETTLED,
                     SESSION_SHUTDOWN):
            return worker
        return QUICK_EVENT_S

    def event(self, event: str, data: Mapping[str, Any] | None, *,
              answer: EarlyAnswer | None = None) -> dict[str, Any] | None:
        """Offer one harness event; never raises (ambient policy).

        ``answer`` (the endpoint's early answer): given, the calling thread makes the hook's worker
        calls itself when the worker lane is idle, and the harness is answered through it as soon
        as the lifecycle answers -- at once on an ``/icarus off`` or an abort, even while this
        thread is still inside the worker call (see :class:`HookClient`)."""
        if self.settings.refused_files:
            self._reread_settings()
        if not self.available:
            return None
        if not self.settings.hooks and event != SESSION_SHUTDOWN:
            return None
        # A dict (what the endpoint passes) without the ABC's isinstance check.
        payload = controller_payload(event, data if type(data) is dict or isinstance(data, Mapping) else {},
                                     self.icarus_session_id)
        if payload is None:
            return None
        if event == SESSION_SHUTDOWN:
            self._abandon_tool_calls()
        # An empty answer (a prompt with nothing to inject, the commonest) is None on the wire
        # without a wire_result call; the client is read without a call once it exists.
        early = None if answer is None else (lambda result: answer(wire_result(result) if result else None))
        try:
            result = (self._hooks or self.hooks()).event(event, payload, timeout=self.wait_bound(event), answer=early)
            return wire_result(result) if result else None
        except Exception as exc:  # noqa: BLE001 - ambient: the run goes on without memory
            code = str(exc.code) if isinstance(exc, CastorError) else "internal"
            logger.bind(actor=self.path(), event=event, code=code).warning("icarus hook event failed")
            self.warn(_LAYER_WARNING.format(event=event, code=code))
            return None

    def _abandon_tool_calls(self) -> None:
        """Before the session's end: Fabric tool calls still running :data:`QUIT_GRACE_S` into the
        quit are cancelled (the worker killed under the running one, queued ones never sent), so
        ``on_session_end`` runs at once on a fresh worker instead of queueing behind them (where a
        tool's own timeout would retire the worker and refuse it). Their callers get ``cancelled``
        or ``worker_retired``."""
        tools = self._tool_client
        if tools is None:
            return
        cancelled = tools.abandon_outstanding(QUIT_GRACE_S)
        if cancelled:
            logger.bind(actor=self.path(), cancelled=cancelled).warning(
                "the session ended while Fabric tool calls still ran {s:g} s later: they were cancelled, "
                "their worker stopped, so the session's end runs on a fresh worker", s=QUIT_GRACE_S)

    def close(self) -> None:
        """Shutdown path for ``session.close``: on_session_end, footer cleared, worker closed."""
        if not self.available:
            return
        try:
            self.event(SESSION_SHUTDOWN, {})
        finally:
            try:
                self.ui.set_status(STATUS_KEY, None)
            except Exception:  # noqa: BLE001 - best effort on close: a backend failure is logged, not raised
                pass
            for client in (self._hook_client, self._tool_client):
                if client is not None:
                    try:
                        client.close()
                    except CastorError:
                        pass  # the actor is already gone: nothing left to close

    # -- tools ------------------------------------------------------------------
    def tool_specs(self) -> list[dict[str, Any]]:
        if not self.available:
            return []
        return [{"name": t.name, "description": t.description, "parameters": t.parameters,
                 **({"prompt_snippet": t.prompt_snippet} if t.prompt_snippet else {})}
                for t in registered_tools(self.settings)]

    def tool(self, name: str, params: Any, *, tool_call_id: str | None = None) -> Any:
        """Run one Fabric tool; returns the backend's value (an ``{error}`` value is a tool error).

        Raises ``NotFound`` (``unknown_tool`` / ``icarus_unavailable``) for a tool
        this session does not offer, and the worker's typed transport errors.
        A validation failure is the value ``{"error": message}``, with no worker call.
        """
        if self.settings.refused_files:
            self._reread_settings()
        if not self.available:
            raise NotFound("Icarus is not available in this session",
                           data={"reason": "icarus_unavailable", "detail": self.reason, "tool": name})
        if name == CONFIG_TOOL.name and self.settings.tools:
            return config_tool_result(params, self.settings).details
        try:
            prepared = prepare_call(name, params, self.settings)
        except ToolValidationError as exc:
            if exc.data.get("reason") == "unknown_tool":
                raise NotFound(exc.message, data=exc.data) from None
            return {"error": exc.message}
        # The fields as the call's extras, not a bound logger: a bound logger is built even when
        # debug records are dropped (2.4 against 0.5 us a tool call); the record is the same. Not
        # built at all when castor's own logging setup is above DEBUG (4.7k instructions a call).
        if not LOGGING_SETUP.debug_dropped:
            logger.debug("icarus tool call", actor=self._worker_path, tool=name, tool_call_id=tool_call_id)
        client = self._tool_client  # set once, never unset: read as tool_worker() does, in this frame
        if client is None:
            client = self.tool_worker()
        return client.call("tools", name, [prepared], None, self.settings.timeout_ms / 1000.0)

    # -- commands ---------------------------------------------------------------
    def command(self, args: str | None) -> dict[str, Any]:
        """Run one ``/icarus`` command; ``{text, level}``. Invalid input changes nothing."""
        if self.settings.refused_files:
            self._reread_settings()
        try:
            cmd = parse_command(args)
        except CommandError as exc:
            return {"text": exc.message, "level": "warning", "code": "invalid_command", "usage": USAGE}
        return self._run(cmd)

    def _run(self, cmd: IcarusCommand) -> dict[str, Any]:
        if isinstance(cmd, InspectCommand):
            doc = config_inspection(self.settings) if cmd.what == "config" else config_schema()
            return {"text": json.dumps(doc, indent=2, ensure_ascii=False), "level": "info"}
        refusal = self._hooks_refusal()
        if refusal is not None:
            # Unregistered hooks are already off: asking their status or turning them off is
            # information; asking for hooks or context that cannot run is a warning.
            quiet = isinstance(cmd, HooksCommand) and cmd.action in ("status", "off")
            return {"text": refusal, "level": "info" if quiet else "warning"}
        if isinstance(cmd, HooksCommand):
            return self._hooks_command(cmd)
        if isinstance(cmd, ContextCommand):
            return self._context_command(cmd)
        return self._context_default(cmd)

    def _hooks_refusal(self) -> str | None:
        if not self.available:
            return (f"Icarus hooks are not registered: no Icarus package at {self.settings.icarus_dir} "
                    "(set icarusDir or ICARUS_DIR).")
        if not self.settings.hooks:
            return "Icarus hooks are not registered because settings disable them (hooks: false)."
        return None

    def _hooks_command(self, cmd: HooksCommand) -> dict[str, Any]:
        hooks = self.hooks()
        if cmd.action == "status":
            st = hooks.status()
            state = "on" if st.enabled else "off"
            shown = "visible" if st.visible else "hidden"
            return {"text": f"Icarus hooks are {state}; memory context is {shown} in this session.", "level": "info"}
        enabled = hooks.set_enabled({"toggle": None, "on": True, "off": False}[cmd.action])
        return {"text": f"Icarus hooks are {'on' if enabled else 'off'} for this session.", "level": "info"}

    def _context_command(self, cmd: ContextCommand) -> dict[str, Any]:
        hooks = self.hooks()
        if cmd.action == "status":
            visible = hooks.status().visible
        else:
            visible = hooks.set_visible({"toggle": None, "show": True, "hide": False}[cmd.action])
        shown = "visible" if visible else "hidden"
        return {"text": f"Icarus memory context is {shown} in this session "
                        "(the model receives it either way).", "level": "info"}

    def _context_default(self, cmd: ContextDefaultCommand) -> dict[str, Any]:
        key = "contextDisplay"
        trusted = self.ctx.info.trusted
        project, global_ = self.backend.settings_layers(self.ctx.info.cwd, trusted=trusted)
        current = "visible" if self.hooks().status().visible else "hidden"
        if not cmd.writes:
            return {"text": self._default_status(cmd.scope, project, global_, trusted, current), "level": "info"}
        plan = plan_default_write(key, scope=cmd.scope, trusted=trusted, project=project, global_=global_)
        if isinstance(plan, str):
            return {"text": plan, "level": "warning"}
        written: dict[str, bool] = {}

        def mutate(doc: dict[str, Any]) -> dict[str, Any]:
            new_doc, written["value"] = apply_bool_default(doc, key, cmd.action)  # type: ignore[arg-type]  # the command parser guarantees one of the two boolean actions here
            return new_doc

        self.backend.update_settings(plan.path, mutate,
                                     confine_to=self.ctx.info.cwd if plan.scope == "project" else None,
                                     owned=True)  # another user's file is never made castor's user's own
        shown = "visible" if written["value"] else "hidden"
        text = (f"Memory context will be {shown} by default for future Pi sessions (saved to {plan.scope} "
                f"settings: {plan.path}). Current session is still {current}.")
        if plan.warnings:
            text += " " + " ".join(plan.warnings)
        return {"text": text, "level": "warning" if plan.warnings else "info"}

    @staticmethod
    def _default_status(scope: str | None, project: SettingsLayer, global_: SettingsLayer, trusted: bool,
                        current: str) -> str:
        """``context default [status] [scope]``: the startup default, where it comes from, and the session's.

        Without a scope: the effective default (trusted project, global, built-in). With one: that
        scope's own value, or the built-in default when the scope does not set it; an untrusted
        project's file is not read, so its scoped status is the effective default and says why.
        """
        key = "contextDisplay"
        label = {True: "visible", False: "hidden"}
        tail = f" Current session is {current}."
        if scope is None or (scope == "project" and not trusted):
            insp = inspect_bool(key, project=project, global_=global_, trusted=trusted)
            where = f" ({insp.path})" if insp.path else ""
            note = (f" Project settings ({project.path}) are not read: this project is untrusted."
                    if scope == "project" else "")
            # A file the user wrote the default in but that cannot be read (a JSON slip) counts for
            # nothing: said, not left for the user to wonder why their value is not the default.
            ignored = "".join(f" {layer.scope.capitalize()} settings are ignored ({layer.error}): {layer.path}."
                              for layer in ((project, global_) if trusted else (global_,)) if layer.error)
            return (f"Startup default is {label[insp.value]} from {_SOURCE_LABEL[insp.source]}{where}."
                    f"{ignored}{note}{tail}")
        layer = project if scope == "project" else global_
        value = scope_bool(layer, key)
        if layer.error:
            return (f"Startup default is {label[bool(KEY_BY_NAME[key].default)]} from built-in default "
                    f"({scope} settings are ignored ({layer.error}): {layer.path}).{tail}")
        if value is None:
            return (f"Startup default is {label[bool(KEY_BY_NAME[key].default)]} from built-in default "
                    f"(not set in {scope} settings: {layer.path}).{tail}")
        return f"Startup default is {label[value]} from {scope} settings ({layer.path}).{tail}"

    # -- inspection -------------------------------------------------------------
    def config(self) -> dict[str, Any]:
        """Read-only state, effective config, schema and the tools to register."""
        if self.settings.refused_files:
            self._reread_settings()
        hooks: dict[str, Any] = {"registered": self.available and self.settings.hooks,
                                 "enabled": None, "visible": self.settings.context_display}
        if self.available and self.settings.hooks:
            try:
                st = self.hooks().status()
                hooks.update(enabled=st.enabled, visible=st.visible, generation=st.generation)
            except CastorError:
                pass  # the controller is restarting; report the configured values
        return {
            "session_id": self.session_id,
            "state": "active" if self.available else "unavailable",
            "reason": self.reason,
            "trusted": self.ctx.info.trusted,
            "hooks": hooks,
            "filtering": {"enabled": self.filtering, "reason": self.filtering_reason,
                          "classifier": self.settings.classifier},
            "config": config_inspection(self.settings),
            "schema": config_schema(),
            "tools": self.tool_specs(),
            **({"deadlines_ms": self.deadlines_ms()} if self.available else {}),
        }

    def deadlines_ms(self) -> dict[str, int]:
        """The longest castor itself waits on this session's memory backend, per harness method:
        a harness whose own per-call deadline is shorter must wait this long instead (else a slow
        retrieval or tool, within ``timeoutMs``, is cut off and its result lost)."""
        return {"harness.event": math.ceil(self.wait_bound(BEFORE_AGENT_START) * 1000),
                "icarus.tool": math.ceil((self.settings.timeout_ms / 1000.0 + WAIT_GRACE_S) * 1000)}

    def worker_stats(self) -> dict[str, Any]:
        """The worker actor's mailbox and the latest worker process (pid, RSS, CPU, files); in a
        session without Icarus (``state: unavailable``), why (``reason``, the ``icarus_dir`` looked
        at): no worker ever starts there."""
        out: dict[str, Any] = {"session_id": self.session_id, "state": "active" if self.available else "unavailable",
                               "path": self.path("worker"), "actor": None, "process": None, "workers_started": 0}
        if not self.available:
            return {**out, "reason": self.reason, "icarus_dir": self.settings.icarus_dir}
        handle = self.ctx.runtime.system.find(self.path("worker"))
        if handle is not None:
            out["actor"] = handle.snapshot().model_dump(mode="json")
        with self._lock:
            latest = self._workers[-1] if self._workers else None
            out["workers_started"] = self._spawned
        if self._crash_loop is not None:
            out["crash_loop"] = self._crash_loop.view()
        if latest is not None:
            out["process"] = latest.stats().model_dump(mode="json")
        return out

    def current_worker_pid(self) -> int | None:
        with self._lock:
            latest = self._workers[-1] if self._workers else None
        return latest.running_pid if latest is not None else None


__all__ = [
    "COMPONENT", "EXTRAS_KEY", "IcarusBackend", "IcarusSession", "controller_payload", "wire_result",
]

"""The composition root: one actor system, its session tree and shared pools.

Actor tree (paths are stable; see docs/architecture.md)::

    /root                                   root supervisor (one_for_one)
    /root/utility                           utility executor pool (supervisor)
    /root/utility/slot-<n>                  UtilityExecutorActor
    /root/session                           all harness sessions (supervisor)
    /root/session/<sid>                     one session (supervisor, one_for_one)
    /root/session/<sid>/<component>/...     what each session component adds
                                            (materia: ``materia``, ``cast/<id>``;
                                            icarus: ``icarus/...``)

A *session component* is a function ``(SessionContext) -> list[ChildSpec]``
that contributes children to every session supervisor, plus optional
``harness.event`` listeners. Components are how the materia and Icarus
systems plug into a session without the runtime knowing either.
"""

from __future__ import annotations

import dataclasses
import os
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Protocol

from loguru import logger
from pydantic import BaseModel, ConfigDict, Field

from castor.actors.ports.agent import AgentPort
from castor.actors.ports.host_context import HostContextPort
from castor.actors.ports.classifier import ClassifierPort
from castor.actors.ports.session import SessionPort, SessionUiPort
from castor.messages.errors import CastorError, Conflict, Forbidden, InvalidParams, MailboxFull, NotFound, Timeout
from castor import tree
from castor.supervision import ActorHandle, ActorSystem, ChildSpec
from castor.supervision.registry import check_segment
from castor.supervision.threads import start_thread

SESSIONS_PATH = "/root/session"
UTILITY_PATH = "/root/utility"


UTILITY_STOP_GRACE_S = 1.0
"""On shutdown a running utility command gets SIGTERM, then SIGKILL after this long."""


class RuntimeSettings(BaseModel):
    """Runtime-wide settings (CLI flags and environment; never project files)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    allow_faults: bool = False
    utility_slots: int = Field(default=4, ge=1, le=256)
    utility_queue_limit: int = Field(default=1000, ge=1)
    max_casts_per_session: int = Field(default=1, ge=1)
    artifact_root: str | None = None  # overrides the config's artifactDir when set
    session_restart_intensity: int = tree.SESSION_INTENSITY.max_restarts
    max_sessions: int = Field(default=256, ge=1)
    session_open_timeout_s: float = Field(default=10.0, gt=0)
    compaction_timeout_s: float = Field(default=300.0, gt=0, le=3600)
    """Deadline of one host compaction (``session.compact``; Pi asks the model for a summary)."""
    context_usage_timeout_s: float = Field(default=5.0, gt=0, le=600)
    """Deadline of the pre-turn context usage read (``session.context_usage``)."""
    """Open sessions at most (each runs a handful of actor threads): one more is ``mailbox_full``."""
    user_turn_timeout_s: float | None = Field(default=None, gt=0, allow_inf_nan=False)
    """Opt-in bound on a user-driven refinement turn: withdrawn (reason ``timed_out``) if the harness
    reports neither its end nor its settle within this many seconds. ``None`` (the default): no bound —
    a user's run may legitimately take hours, and withdrawing one that still runs loses its draft
    (see docs/materia.md "When the harness never reports a user turn")."""


class SessionInfo(BaseModel):
    """What the harness says about a session when it opens it."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    session_id: str
    cwd: str
    trusted: bool = False
    flags: dict[str, Any] = {}
    session_file: str | None = None


@dataclass
class HarnessLink:
    """The harness-side ports of one session (over the wire, or standalone stand-ins)."""

    agent: AgentPort | None
    session_log: SessionPort | None
    ui: SessionUiPort | None
    classifier: ClassifierPort | None = None
    kind: str = "standalone"  # "endpoint" when backed by a msgpack-rpc connection
    host_context: HostContextPort | None = None  # the harness's own transcript; None = there is none


@dataclass
class SessionContext:
    """Everything a session component needs to build its children."""

    info: SessionInfo
    harness: HarnessLink
    runtime: Runtime
    path: str
    extras: dict[str, Any] = field(default_factory=dict)

    def child(self, *segments: str) -> str:
        return "/".join([self.path, *segments])

    def lookup(self, *segments: str) -> ActorHandle:
        return self.runtime.system.lookup(self.child(*segments))


class EventListener(Protocol):
    def __call__(self, ctx: SessionContext, event: str, data: dict[str, Any]) -> dict[str, Any] | None: ...


@dataclass
class SessionComponent:
    """One system's contribution to every session."""

    name: str
    children: Callable[[SessionContext], list[ChildSpec]]
    on_event: EventListener | None = None
    on_close: Callable[[SessionContext], None] | None = None


class Runtime:
    """One castor runtime: actor system, sessions, components, shared pools."""

    def __init__(
        self,
        settings: RuntimeSettings | None = None,
        *,
        components: list[SessionComponent] | None = None,
        extra_children: list[ChildSpec] | None = None,
        scaleout: Any = None,
    ) -> None:
        self.settings = settings or RuntimeSettings()
        self.scaleout = scaleout  # castor.scaleout's RayBackend when casts run on a cluster, else None
        self.components = list(components if components is not None else default_components())
        self._sessions: dict[str, SessionContext] = {}
        self._lock = threading.Lock()
        children = [
            *_utility_children(self.settings),
            tree.SESSIONS.supervisor_spec(),
            *(extra_children or []),
        ]
        self.system = ActorSystem(children, **tree.ROOT.supervisor_args())
        self.log = logger.bind(actor="/runtime")

    # -- sessions ------------------------------------------------------------
    def open_session(self, info: SessionInfo, harness: HarnessLink) -> SessionContext:
        """Start ``/root/session/<sid>`` with every component's children.

        Opening an already-open session id replaces its harness link only if
        the old one is gone; otherwise it is a ``conflict``.
        """
        check_segment(info.session_id)
        check_project_dir(info.cwd)
        path = f"{SESSIONS_PATH}/{info.session_id}"
        with self._lock:
            if info.session_id in self._sessions and not self._gone(self._sessions[info.session_id]):
                raise Conflict(f"session {info.session_id!r} is already open", data={"session_id": info.session_id})
            self._sessions.pop(info.session_id, None)  # gone (given up, or lost with its parent): reopen
            if len(self._sessions) >= self.settings.max_sessions:
                raise MailboxFull(f"the runtime has {len(self._sessions)} open sessions, its limit; close one first",
                                  data={"limit": self.settings.max_sessions})
            ctx = SessionContext(info=info, harness=harness, runtime=self, path=path)
            self._sessions[info.session_id] = ctx
        try:
            specs: list[ChildSpec] = []
            for component in self.components:
                specs.extend(component.children(ctx))
            spec = tree.SESSION.supervisor_spec(specs, id=info.session_id,
                                                max_restarts=self.settings.session_restart_intensity)
            spec = dataclasses.replace(spec, on_removed=lambda reason: self._forget(ctx, reason))
            self.system.spawn(spec, under=SESSIONS_PATH, timeout=self.settings.session_open_timeout_s)
        except BaseException as exc:
            with self._lock:
                if self._sessions.get(info.session_id) is ctx:
                    self._sessions.pop(info.session_id, None)
            if isinstance(exc, Timeout):
                # The supervisor may still start it after the answer came too late: stop it then
                # (its StartChild is ahead in the same mailbox), so the id is not held forever.
                start_thread(self._stop_late_child, args=(path,), name=f"late-session-{info.session_id}",
                             owner=SESSIONS_PATH, purpose="stops a session that started after its open timed out")
            raise
        _label_session(self.system.find(path), info)
        self.log.info("session opened: {sid}", sid=info.session_id)
        return ctx

    def has_session(self, session_id: str) -> bool:
        """Whether ``session_id`` is open and its actors run."""
        with self._lock:
            ctx = self._sessions.get(session_id)
        return ctx is not None and not self._gone(ctx)

    def _gone(self, ctx: SessionContext) -> bool:
        """The session's supervisor no longer runs (it gave up, or went with its parent)."""
        handle = self.system.registry.find(ctx.path)
        return handle is None or handle.closed.is_set()

    def _forget(self, ctx: SessionContext, reason: str) -> None:
        with self._lock:
            if self._sessions.get(ctx.info.session_id) is ctx:
                self._sessions.pop(ctx.info.session_id, None)
                self.log.warning("session {sid} is gone ({reason}); it may be opened again",
                                 sid=ctx.info.session_id, reason=reason)

    def _stop_late_child(self, path: str) -> None:
        try:
            self.system.stop_child(path, timeout=120.0)
        except CastorError:
            pass

    def session(self, session_id: str) -> SessionContext:
        with self._lock:
            ctx = self._sessions.get(session_id)
        if ctx is None:
            raise NotFound(f"no open session {session_id!r}", data={"session_id": session_id})
        return ctx

    def sessions(self) -> list[SessionContext]:
        with self._lock:
            return list(self._sessions.values())

    def close_session(self, session_id: str, *, timeout: float = 30.0) -> None:
        """Run component close hooks, then stop the session's actors (casts persist their state)."""
        ctx = self.session(session_id)
        for component in self.components:
            if component.on_close is not None:
                try:
                    component.on_close(ctx)
                except Exception as exc:  # noqa: BLE001 - one component must not block the others
                    self.log.opt(exception=exc).error("{name}.on_close failed", name=component.name)
        try:
            self.system.stop_child(ctx.path, timeout=timeout)
        except NotFound:
            pass
        with self._lock:
            self._sessions.pop(session_id, None)
        self.log.info("session closed: {sid}", sid=session_id)

    def dispatch_event(self, session_id: str, event: str, data: dict[str, Any]) -> dict[str, Any]:
        """Offer a harness event to every component; merge their results (later keys win)."""
        ctx = self.session(session_id)
        merged: dict[str, Any] = {}
        for component in self.components:
            if component.on_event is None:
                continue
            result = component.on_event(ctx, event, data)
            if result:
                merged.update(result)
        return merged

    # -- lifecycle -------------------------------------------------------------
    def shutdown(self, timeout: float = 30.0) -> bool:
        """Close every session (casts stay resumable), end running utility commands gently
        (SIGTERM to each tree, SIGKILL after a second: after the casts, so none re-dispatches),
        then stop every actor."""
        from castor.actors.materia.utility import terminate_running

        for ctx in self.sessions():
            try:
                self.close_session(ctx.info.session_id, timeout=timeout)
            except Exception as exc:  # noqa: BLE001
                self.log.opt(exception=exc).error("closing session {sid} failed", sid=ctx.info.session_id)
        terminate_running(self.system.registry, grace_s=UTILITY_STOP_GRACE_S)
        return self.system.shutdown(timeout)

    def artifact_root_for(self, cwd: str, configured: str | None) -> Path:
        """Where a session's casts write artifacts.

        The runtime's own override (CLI/environment) is taken as given. A
        configured ``artifactDir`` is user data: relative to the project and
        never outside it (``forbidden`` otherwise), so a hostile config cannot
        make a cast write into ``/etc`` or a sibling checkout.
        """
        if self.settings.artifact_root:
            return Path(self.settings.artifact_root).resolve()
        return project_artifact_root(cwd, configured)


def _label_session(handle: ActorHandle | None, info: SessionInfo) -> None:
    """What an operator sees for a session besides its id: its project directory and a label."""
    if handle is not None:
        label = info.flags.get("label") if isinstance(info.flags.get("label"), str) else None
        handle.labels = {"project": info.cwd, "label": (label or Path(info.cwd).name or info.cwd)[:200]}


def check_project_dir(cwd: str) -> None:
    """A session's ``cwd`` is its project: an absolute path to an existing directory. Anything
    else is refused before a session exists (a relative path would be taken against the
    runtime's own working directory; a missing one would be created by the first cast)."""
    if "\x00" in cwd or not os.path.isabs(cwd):
        raise InvalidParams("cwd must be an absolute path", data={"cwd": cwd[:200].replace("\x00", "\\0")})
    if not os.path.isdir(cwd):
        raise NotFound(f"cwd {cwd[:200]} is not an existing directory", data={"cwd": cwd[:200]})


def project_artifact_root(cwd: str, configured: str | None) -> Path:
    """A project's artifact root: ``configured`` (default ``.pi/pi-materia``) resolved against the
    project, symlinks included; ``forbidden`` unless it stays inside the project (the one rule of
    castor.domain.paths: no ``..``, an absolute path only inside the project)."""
    from castor.adapters.fs import confine

    project = Path(cwd).resolve()
    try:
        return confine(project, configured or ".pi/pi-materia", allow_absolute=True)
    except Forbidden as exc:
        raise Forbidden(
            "artifactDir must stay inside the project directory",
            data={"artifactDir": str(configured)[:200], "cwd": str(project), "reason": exc.data.get("reason")},
        ) from None


def _utility_children(settings: RuntimeSettings) -> list[ChildSpec]:
    from castor.actors.materia.utility import utility_pool_spec

    return [utility_pool_spec(settings)]


def default_components() -> list[SessionComponent]:
    """The components every runtime has unless told otherwise: materia, then icarus."""
    from castor.actors.icarus_session import icarus_component
    from castor.actors.materia.component import materia_component

    return [materia_component(), icarus_component()]

"""The session-component contract: what a session component gets and what it gives.

A *session component* is one system's contribution to every harness session (materia and Icarus
are the two castor ships). When a session opens, the runtime builds a :class:`SessionContext` and
asks each component for the children of the session's supervisor (``children(ctx)``); it offers
every harness event to each component's ``on_event`` and calls each ``on_close`` when the session
closes. The runtime knows no component; components know the runtime only through
:class:`SessionHost`, the part of it this module names.

Guarantees: the context's ``path`` is the session supervisor's path and does not change for the
session's life; ``extras`` is the components' own scratch space (the runtime never reads it).
Not guaranteed: the order in which components see an event beyond the order they were given to
the runtime, or that ``on_close`` runs for a session whose supervisor gave up on its own.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from pydantic import BaseModel, ConfigDict, Field

from castor import tree
from castor.ports.agent import AgentPort
from castor.ports.classifier import ClassifierPort
from castor.ports.host_context import HostContextPort
from castor.ports.session import SessionPort, SessionUiPort
from castor.supervision import ActorHandle, ActorSystem, ChildSpec

DEFAULT_MEMORY_RETURN_S = 2.0
"""Default of ``RuntimeSettings.memory_return_interval_s`` (``castor serve --memory-return``)."""
MAX_MEMORY_RETURN_S = 3600.0
"""The longest ``memory_return_interval_s`` accepted."""


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
    memory_return_interval_s: float = Field(default=DEFAULT_MEMORY_RETURN_S, ge=0, le=MAX_MEMORY_RETURN_S)
    """After a session closes, give the allocator's free pages back to the system
    (``malloc_trim``, on its own thread), at most once per this many seconds; 0: never."""
    malloc_arenas: int = Field(default=1, ge=0, le=1024)
    """glibc malloc arenas at most in this process, set when the runtime is made (before its
    threads start; ``castor.adapters.memory_return.limit_malloc_arenas``); 0: the allocator's
    default (eight per CPU). Process-wide."""
    icarus_worker_max_deaths: int = Field(default=5, ge=1, le=10_000)
    """A session's Icarus worker that dies this many times (in calls) within
    ``icarus_worker_death_window_s`` is given up: calls fail ``worker_retired`` (reason
    ``crash_loop``) at once, no process started, for ``icarus_worker_cool_down_s``; then one call
    tries a fresh worker (see docs/icarus.md "Crash loop")."""
    icarus_worker_death_window_s: float = Field(default=60.0, gt=0, le=86_400, allow_inf_nan=False)
    icarus_worker_cool_down_s: float = Field(default=60.0, gt=0, le=86_400, allow_inf_nan=False)
    cast_cli_note: dict[str, list[str]] = {}
    """Written to the ``cli.json`` of each cast this runtime starts that brings no note of its own (a
    cast a harness starts): ``castor serve --backend ray`` records there the backend flags its casts
    run with (never a token), as ``castor cast --backend ray`` does, so the CLI's resume hints
    (``castor status``, ``castor casts``) name them. Empty: no note (casts run on this machine)."""
    notes_where_resumed_casts_run: bool = False
    """``castor serve`` sets it: a cast this runtime takes up again (``recast``, ``revive``, a
    ``continue`` of a cast no runtime holds) gets in its ``cli.json`` the backend flags this runtime
    runs casts with (``cast_cli_note``'s :data:`castor.ports.cli_note.CAST_BACKEND_FLAGS`), or
    loses those recorded when it has none: it runs on this machine now. Before, a cast started
    through ``castor serve --backend ray`` and resumed through a serve on this machine kept naming
    the cluster. The standalone CLI records them itself, after the resume."""
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
    #: A relay's (a Ray cast host's session, ``kind`` "ray-relay"): the ``kind`` of the harness it
    #: stands in for, the serving process's session's; what the user typing there is told to type.
    relays: str | None = None

    @property
    def user_kind(self) -> str:
        """The kind of harness the user is in: a relay's :attr:`relays`, else :attr:`kind`."""
        return self.relays or self.kind


class SessionHost(Protocol):
    """The part of the runtime a session component may use (``castor.runtime.Runtime`` is one)."""

    settings: RuntimeSettings
    system: ActorSystem
    scaleout: Any  # castor.scaleout's RayBackend when casts run on a cluster, else None

    def session(self, session_id: str) -> SessionContext:
        """The open session's context; ``not_found`` when it is not open."""
        ...

    def artifact_root_for(self, cwd: str, configured: str | None) -> Path:
        """Where a session's casts write artifacts (``forbidden`` when it would leave the project)."""
        ...


@dataclass
class SessionContext:
    """Everything a session component needs to build its children."""

    info: SessionInfo
    harness: HarnessLink
    runtime: SessionHost
    path: str
    extras: dict[str, Any] = field(default_factory=dict)

    def child(self, *segments: str) -> str:
        return "/".join([self.path, *segments])

    def lookup(self, *segments: str) -> ActorHandle:
        return self.runtime.system.lookup(self.child(*segments))


class EventListener(Protocol):
    """A component's harness-event hook: a dict to merge into the event's reply, or None.

    A component that sets :attr:`SessionComponent.answers_early` is also given ``answer=`` (an
    :class:`EarlyAnswer`, or None when the caller cannot be answered early) when it is the last
    component with a listener."""

    def __call__(self, ctx: SessionContext, event: str, data: dict[str, Any]) -> dict[str, Any] | None: ...


class AnsweringEventListener(Protocol):
    """The listener of a component that :attr:`~SessionComponent.answers_early`."""

    def __call__(self, ctx: SessionContext, event: str, data: dict[str, Any], *,
                 answer: EarlyAnswer | None = None) -> dict[str, Any] | None: ...


class EarlyAnswer(Protocol):
    """Answers the harness's event *now* with this component's part of the reply (merged with
    the parts of the components before it), from any thread, before the listener returns; at
    most once counts. What the listener returns after it is dropped. The Icarus hooks use it so
    that a waiting harness is answered at once (an ``/icarus off``, an abort) while the thread
    that asked is still inside the worker call it chose to make itself."""

    def __call__(self, result: dict[str, Any] | None) -> None: ...


@dataclass
class SessionComponent:
    """One system's contribution to every session."""

    name: str
    children: Callable[[SessionContext], list[ChildSpec]]
    on_event: EventListener | None = None
    on_close: Callable[[SessionContext], None] | None = None
    #: ``on_event`` is an :class:`AnsweringEventListener` (it takes ``answer=``); offered to the last listener only,
    #: as an early answer must carry every other component's part of the reply already.
    answers_early: bool = False


__all__ = [
    "AnsweringEventListener", "EarlyAnswer", "EventListener", "HarnessLink", "RuntimeSettings",
    "SessionComponent", "SessionContext", "SessionHost", "SessionInfo",
]

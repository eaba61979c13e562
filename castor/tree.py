"""The actor tree of a castor runtime, declared once, as data.

Every supervised slot the runtime starts is a :class:`Node` here: its path (``<sid>``-style
segments stand for ids), what runs there, its restart type, its shutdown timeout, and for a
supervisor its strategy and restart intensity (at most R restarts within T seconds); a child
that its supervisor gives up on alone (castor's addition to OTP) carries that limit too. The
code that builds the ``ChildSpec``\\ s reads its numbers from these nodes, and
``tests/supervision/test_tree_docs.py`` checks that ``docs/architecture.md``'s tree and
``docs/supervision.md``'s limits are what :func:`render_tree` and :func:`render_limits` say.

This module guarantees the declared values only; what a restart type, a strategy or an
intensity *does* is supervision's (docs/supervision.md). It imports nothing of castor but
``castor.supervision`` (and, through it, ``castor.messages``).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Callable, Sequence

from castor.supervision import (
    DEFAULT_MAX_RESTARTS,
    DEFAULT_SHUTDOWN_TIMEOUT,
    DEFAULT_WITHIN_SECONDS,
    ROOT_PATH,
    ChildSpec,
    Restart,
    Strategy,
    supervisor_spec,
)
from castor.supervision.supervisor import SUPERVISOR_SHUTDOWN_TIMEOUT


@dataclass(frozen=True)
class Intensity:
    """At most ``max_restarts`` restarts within ``within_seconds``."""

    max_restarts: int
    within_seconds: float

    def __str__(self) -> str:
        return f"{self.max_restarts} in {_seconds(self.within_seconds)}"


@dataclass(frozen=True)
class Node:
    """One slot of the tree (a path names a slot, not an incarnation)."""

    path: str
    what: str
    """What runs there, in a few words (the tree in docs/architecture.md shows it)."""
    restart: Restart = Restart.PERMANENT
    shutdown_timeout: float = DEFAULT_SHUTDOWN_TIMEOUT
    strategy: Strategy | None = None
    """Set for a supervisor: how it restarts its children."""
    intensity: Intensity | None = None
    """A supervisor's own limit: past it the supervisor stops its children and fails to its parent."""
    give_up: Intensity | None = None
    """A child's own limit (``ChildSpec.max_restarts``): past it its supervisor removes it, and
    does not fail."""

    @property
    def id(self) -> str:
        """The last segment of the path (a template such as ``<sid>`` for per-id slots)."""
        return self.path.rpartition("/")[2]

    @property
    def parent(self) -> str:
        return self.path.rpartition("/")[0]

    @property
    def is_supervisor(self) -> bool:
        return self.strategy is not None

    def child_spec(self, factory: Callable[[], Any], *, id: str | None = None, **more: Any) -> ChildSpec:
        """The ``ChildSpec`` of a worker at this slot; ``more``: the spec's other fields."""
        limits: dict[str, Any] = {}
        if self.give_up is not None:
            limits = {"max_restarts": self.give_up.max_restarts, "within_seconds": self.give_up.within_seconds}
        return ChildSpec(id=id or self.id, factory=factory, restart=self.restart,
                         shutdown_timeout=self.shutdown_timeout, **limits, **more)

    def supervisor_spec(self, children: Sequence[ChildSpec] = (), *, id: str | None = None,
                        max_restarts: int | None = None) -> ChildSpec:
        """The ``ChildSpec`` of the supervisor at this slot; ``max_restarts`` overrides R (a setting)."""
        assert self.strategy is not None and self.intensity is not None, f"{self.path} is not a supervisor"
        spec = supervisor_spec(id or self.id, children, strategy=self.strategy,
                               max_restarts=self.intensity.max_restarts if max_restarts is None else max_restarts,
                               within_seconds=self.intensity.within_seconds, restart=self.restart)
        return dataclasses.replace(spec, shutdown_timeout=self.shutdown_timeout)

    def supervisor_args(self) -> dict[str, Any]:
        """``strategy``, ``max_restarts`` and ``within_seconds`` of this supervisor (for ``ActorSystem``)."""
        assert self.strategy is not None and self.intensity is not None, f"{self.path} is not a supervisor"
        return {"strategy": self.strategy, "max_restarts": self.intensity.max_restarts,
                "within_seconds": self.intensity.within_seconds}


def _supervisor(path: str, what: str, strategy: Strategy, intensity: Intensity,
                restart: Restart = Restart.PERMANENT) -> Node:
    return Node(path, what, restart=restart, shutdown_timeout=SUPERVISOR_SHUTDOWN_TIMEOUT, strategy=strategy,
                intensity=intensity)


SESSION_SLOT = f"{ROOT_PATH}/session/<sid>"

ROOT = _supervisor(ROOT_PATH, "the runtime's top", Strategy.ONE_FOR_ONE,
                   Intensity(DEFAULT_MAX_RESTARTS, DEFAULT_WITHIN_SECONDS))
UTILITY = _supervisor(f"{ROOT_PATH}/utility", "UtilityExecutorActor pool", Strategy.ONE_FOR_ONE, Intensity(20, 10.0))
UTILITY_SLOT = Node(f"{ROOT_PATH}/utility/slot-<n>", "one utility command at a time each", shutdown_timeout=3.0)
SESSIONS = _supervisor(f"{ROOT_PATH}/session", "every harness session", Strategy.ONE_FOR_ONE, Intensity(100, 10.0))
SESSION_INTENSITY = Intensity(5, 10.0)
"""R is ``RuntimeSettings.session_restart_intensity`` (this is its default)."""
SESSION = _supervisor(SESSION_SLOT, "one session", Strategy.ONE_FOR_ONE, SESSION_INTENSITY,
                      restart=Restart.TEMPORARY)
MATERIA = Node(f"{SESSION_SLOT}/materia", "SessionActor: the session's casts")
CASTS = _supervisor(f"{SESSION_SLOT}/cast", "supervisor of the session's casts", Strategy.ONE_FOR_ONE,
                    Intensity(100, 10.0))
CAST_GIVE_UP = Intensity(5, 30.0)
"""A cast that keeps crashing (a full disk, a bug) is given up alone; its state stays resumable."""
CAST = Node(f"{SESSION_SLOT}/cast/<castId>", "CastActor: a crash restarts it from persisted state",
            restart=Restart.TRANSIENT, give_up=CAST_GIVE_UP)
SOCKETS = _supervisor(f"{SESSION_SLOT}/socket", "supervisor of the session's socket visits", Strategy.ONE_FOR_ONE,
                      Intensity(100, 10.0))
SOCKET = Node(f"{SESSION_SLOT}/socket/<castId>.<n>", "SocketActor, one per socket visit",
              restart=Restart.TEMPORARY, shutdown_timeout=2.0)
ICARUS = _supervisor(f"{SESSION_SLOT}/icarus", "supervisor of the session's Icarus actors", Strategy.ONE_FOR_ONE,
                     Intensity(10, 10.0))
ICARUS_WORKER = Node(f"{SESSION_SLOT}/icarus/worker", "IcarusWorkerActor: one Python subprocess, retires on timeout")
ICARUS_CLASSIFIER = Node(f"{SESSION_SLOT}/icarus/classifier", "ClassifierActor")
ICARUS_AUDIT = Node(f"{SESSION_SLOT}/icarus/audit", "AuditActor")
ICARUS_HOOKS = Node(f"{SESSION_SLOT}/icarus/hooks", "HookController")

TREE: tuple[Node, ...] = (ROOT, UTILITY, UTILITY_SLOT, SESSIONS, SESSION, MATERIA, CASTS, CAST, SOCKETS, SOCKET,
                          ICARUS, ICARUS_WORKER, ICARUS_CLASSIFIER, ICARUS_AUDIT, ICARUS_HOOKS)
"""Every slot, parents before children, in start order."""

BY_PATH: dict[str, Node] = {node.path: node for node in TREE}


def ancestors(node: Node) -> list[Node]:
    """The supervisors above ``node``, its parent first."""
    chain = []
    path = node.parent
    while path:
        chain.append(BY_PATH[path])
        path = path.rpartition("/")[0]
    return chain


def worst_case(node: Node) -> tuple[int, Node | None]:
    """How many crashes of ``node`` (coming faster than every window) end the escalation, and
    which supervisor then gives up (None: ``node`` alone is removed, and nothing above it fails).

    Each supervisor on the way absorbs R restarts and fails on the next failure; a failure
    escalates to the next one only while the failed slot is restarted (not TEMPORARY) — so the
    count is the product of (R + 1) from the parent up to the first TEMPORARY slot or the root.
    """
    parent = ancestors(node)[0] if node.parent else None
    if parent is None or node.restart is Restart.TEMPORARY:
        return 1, None  # the root's crash is the runtime's; a temporary child is removed, never restarted
    if node.give_up is not None and parent.intensity is not None \
            and node.give_up.max_restarts < parent.intensity.max_restarts:
        return node.give_up.max_restarts + 1, None
    crashes = 1
    for supervisor in ancestors(node):
        assert supervisor.intensity is not None
        crashes *= supervisor.intensity.max_restarts + 1
        if supervisor.restart is Restart.TEMPORARY or supervisor is ROOT:
            return crashes, supervisor
    return crashes, ROOT  # pragma: no cover - every chain ends at the root


def _seconds(value: float) -> str:
    return f"{value:g} s"


def render_tree() -> str:
    """The tree block of docs/architecture.md."""
    width = max(len(node.path) for node in TREE) + 1
    lines = []
    for node in TREE:
        facts = []
        if node.is_supervisor:
            facts += ["supervisor", str(node.strategy)]
        if node is not ROOT:
            facts.append(str(node.restart))
        lines.append(f"{node.path.ljust(width)}{node.what} ({', '.join(facts)})")
    return "\n".join(lines)


def render_limits() -> str:
    """The limits table of docs/supervision.md (a Markdown table)."""
    rows = ["| path | restart | strategy | intensity (R in T) | gives up alone after | shutdown timeout "
            "| crashes of it that end the escalation |",
            "|---|---|---|---|---|---|---|"]
    for node in TREE:
        crashes, by = worst_case(node)
        if node is ROOT:
            outcome = "1: the runtime fails"
        elif by is None:
            outcome = f"{crashes}: it alone is removed"
        else:
            outcome = f"{crashes}: `{by.path}` fails" + (" (the runtime fails)" if by is ROOT else
                                                           " (removed: temporary)")
        rows.append(" | ".join([
            f"| `{node.path}`",
            "—" if node is ROOT else str(node.restart),
            str(node.strategy) if node.strategy is not None else "—",
            str(node.intensity) if node.intensity is not None else "—",
            str(node.give_up) if node.give_up is not None else "—",
            _seconds(node.shutdown_timeout),
            outcome + " |",
        ]))
    return "\n".join(rows)


def deepest_product() -> int:
    """The largest number of crashes of one slot the tree absorbs before a supervisor gives up."""
    return max(worst_case(node)[0] for node in TREE)


__all__ = ["BY_PATH", "CAST", "CAST_GIVE_UP", "CASTS", "SESSION_INTENSITY", "ICARUS", "ICARUS_AUDIT",
           "ICARUS_CLASSIFIER", "ICARUS_HOOKS", "ICARUS_WORKER", "Intensity", "MATERIA", "Node", "ROOT", "SESSION",
           "SESSIONS", "SOCKET", "SOCKETS", "TREE", "UTILITY", "UTILITY_SLOT", "ancestors", "deepest_product",
           "render_limits", "render_tree", "worst_case"]

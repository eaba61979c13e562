"""What the parts of supervision share: kinds and states as enums, the crash exceptions, the
supervisor's messages.

This is the bottom module of ``castor.supervision``: it imports nothing of supervision, so the
actor, its handle, the registry, faults and the supervisor all import it and none of them
needs another's private names. It guarantees names and values only; behaviour lives in the
modules that use them (see docs/supervision.md).
"""

from __future__ import annotations

from enum import StrEnum

from castor.messages.base import LocalMessage


class ExitKind(StrEnum):
    """How one incarnation ended (what its supervisor is told in :class:`ChildExited`)."""

    STOPPED = "stopped"
    """Ended normally: a stop by its supervisor, or ``stop_self``."""
    CRASHED = "crashed"
    """A handler (or ``on_start``) raised something that is not a ``CastorError``, or it was killed."""
    RETIRED = "retired"
    """It retired: its queue was rejected, and it is never restarted nor replayed."""


class HandleState(StrEnum):
    """The state a handle reports in snapshots (``ActorSnapshot.state``)."""

    STARTING = "starting"
    RUNNING = "running"
    STOPPING = "stopping"
    STOPPED = "stopped"
    CRASHED = "crashed"
    RETIRED = "retired"

    @classmethod
    def after(cls, kind: ExitKind) -> HandleState:
        """The state of a handle whose incarnation ended with ``kind``."""
        return cls(kind.value)


class ControlKind(StrEnum):
    """Lifecycle instructions on a mailbox's control lane (ahead of every message)."""

    STOP = "stop"
    KILL = "kill"
    RETIRE = "retire"
    HONOUR = "honour"
    """Wake the loop so it honours a stop or retirement that an inline ask's handler asked for."""


class Strategy(StrEnum):
    """Which children a supervisor restarts when one of them exits and is to be restarted."""

    ONE_FOR_ONE = "one_for_one"
    ONE_FOR_ALL = "one_for_all"
    REST_FOR_ONE = "rest_for_one"


class Restart(StrEnum):
    """Which exits of a child its supervisor answers with a restart."""

    PERMANENT = "permanent"
    """Every exit (a crash or a normal stop)."""
    TRANSIENT = "transient"
    """A crash only."""
    TEMPORARY = "temporary"
    """None: the child is removed when it exits."""


class InjectedCrash(Exception):
    """Raised inside an actor by fault injection; a crash like any other."""


class ActorKilled(Exception):
    """The actor was killed from outside (fault injection or brutal shutdown)."""


class RestartIntensityExceeded(Exception):
    """A supervisor saw more than R restarts in T seconds; it fails to its parent."""


# -- messages a supervisor handles (local only: they never cross the wire) -------------------
class StopChild(LocalMessage, type_name="supervisor.stop_child"):
    id: str


class ChildExited(LocalMessage, type_name="supervisor.child_exited"):
    path: str
    incarnation: int
    kind: ExitKind
    error: str | None = None


class ReviveChild(LocalMessage, type_name="supervisor.revive_child"):
    path: str


class WhichChildren(LocalMessage, type_name="supervisor.which_children"):
    pass

"""Snapshots of the live actor tree: typed, msgpack-serialisable, read-only.

Taking a snapshot never consumes or reorders a message. Ages are seconds
measured on the runtime's monotonic clock at the moment of the snapshot.
"""

from __future__ import annotations

from typing import Literal, Union

from castor.messages.base import Message


def at_or_under(path: str, prefix: str) -> bool:
    """Whether actor ``path`` is ``prefix`` or below it (``/root/session/s1`` is under
    ``/root/session``, ``/root/session-2`` is not); every path is under an empty prefix."""
    if not prefix:
        return True
    base = prefix.rstrip("/") or "/"
    return path == base or path.startswith(base.rstrip("/") + "/")


ActorState = Literal["starting", "running", "restarting", "stopping", "stopped", "retired", "crashed", "failed"]


class InFlight(Message, type_name="inspect.in_flight"):
    """The message an actor is handling right now."""

    message_type: str
    since_s: float  # how long it has been processing it
    is_ask: bool


ActivityValue = Union[str, int, float, bool, None]


class QueuedMessage(Message, type_name="inspect.queued"):
    """One message waiting in a mailbox (the first few, oldest first): its type, how long it has
    waited, whether someone waits for its answer, and what its type says of itself
    (``Message.queued_detail``: a worker call's target and deadline; never a payload)."""

    message_type: str
    age_s: float
    is_ask: bool
    detail: dict[str, ActivityValue] = {}


class MailboxSnapshot(Message, type_name="inspect.mailbox"):
    depth: int
    capacity: int | None
    oldest_age_s: float | None
    by_type: dict[str, int]
    in_flight: InFlight | None
    processed: int
    failed: int
    rejected: int  # refused (full, closed) or, as asks still queued, failed by a stop or retirement
    dead_letters: int  # tells dropped because the actor stopped for good
    queued: list[QueuedMessage] = []  # the oldest few waiting (QUEUED_SHOWN at most), oldest first


class Activity(Message, type_name="inspect.activity"):
    """What an actor is doing now, in words (``text``) and data.

    ``kind`` is a stable word: ``idle``, ``handling`` (a message, nothing more said),
    ``awaiting_turn`` (an agent turn), ``utility`` (a running command), ``worker_call``
    (a call into the Icarus worker process), ``cast`` (a cast's phase), ``reading_usage``,
    ``compacting``, ``hook_call`` (an Icarus hook), ``interrupted``, ``paused``, ``starting``, ``ended``,
    ``fault_delay`` (an injected delay before a message).
    ``age_s`` is how long it has been doing it.
    ``data`` holds the same facts as scalars (cast_id, socket, materia, visit, item, pid, ...).
    ``deadline_in_s`` is how long until the bound that ends it passes (a worker call's deadline,
    a command's ``timeoutMs``, ...; negative once it has passed), ``None`` when nothing bounds it
    (an agent turn waits for the harness, an idle actor for nothing).
    """

    kind: str
    text: str
    age_s: float
    data: dict[str, ActivityValue] = {}
    deadline_in_s: float | None = None


class Failure(Message, type_name="inspect.failure"):
    """The last crash of an actor (across its incarnations)."""

    error_type: str
    message_type: str | None  # the message it crashed on; None when it crashed between messages
    age_s: float  # how long ago
    at: float  # when, in seconds since the epoch


class RestartBudget(Message, type_name="inspect.restart_budget"):
    """A restart limit and how much of it the restarts of its window have used.

    ``applies_to``: ``self`` -- a child with a limit of its own (a cast): past ``max_restarts``
    restarts within ``within_s`` seconds its supervisor gives up on it (removes it alone);
    ``children`` -- a supervisor's intensity: past that many restarts of its children together,
    the supervisor itself fails and its parent applies its own policy. ``restarts``: how many
    restarts the window holds now.
    """

    applies_to: Literal["self", "children"]
    restarts: int
    max_restarts: int
    within_s: float


class ActorSnapshot(Message, type_name="inspect.actor"):
    path: str
    kind: str  # the actor class name
    state: ActorState
    incarnation: int
    restarts: int
    uptime_s: float | None
    retired_reason: str | None = None
    mailbox: MailboxSnapshot
    activity: Activity | None = None
    last_failure: Failure | None = None
    labels: dict[str, str] = {}  # what the runtime says the actor stands for (a session: project, label)
    restart_budget: RestartBudget | None = None  # the restart limit that applies, and how much is used


class ThreadSnapshot(Message, type_name="inspect.thread"):
    """A thread castor started that is not an actor's loop (a reader, a watchdog, a timer)."""

    name: str
    owner: str  # the actor path (or component) it works for
    purpose: str
    age_s: float
    daemon: bool


class TreeSnapshot(Message, type_name="inspect.tree"):
    """Every registered actor, sorted by path (parents before children), and the other threads
    castor runs (those whose owner is under the snapshot's prefix)."""

    actors: list[ActorSnapshot]
    threads: list[ThreadSnapshot] = []

"""Snapshots of the live actor tree: typed, msgpack-serialisable, read-only.

Taking a snapshot never consumes or reorders a message. Ages are seconds
measured on the runtime's monotonic clock at the moment of the snapshot.
"""

from __future__ import annotations

from typing import Literal

from castor.messages.base import Message

ActorState = Literal["starting", "running", "restarting", "stopping", "stopped", "retired", "crashed", "failed"]


class InFlight(Message, type_name="inspect.in_flight"):
    """The message an actor is handling right now."""

    message_type: str
    since_s: float  # how long it has been processing it
    is_ask: bool


class MailboxSnapshot(Message, type_name="inspect.mailbox"):
    depth: int
    capacity: int | None
    oldest_age_s: float | None
    by_type: dict[str, int]
    in_flight: InFlight | None
    processed: int
    failed: int
    rejected: int  # refused by overflow or closure
    dead_letters: int  # tells dropped because the actor stopped for good


class ActorSnapshot(Message, type_name="inspect.actor"):
    path: str
    kind: str  # the actor class name
    state: ActorState
    incarnation: int
    restarts: int
    uptime_s: float | None
    retired_reason: str | None = None
    mailbox: MailboxSnapshot


class TreeSnapshot(Message, type_name="inspect.tree"):
    """Every registered actor, sorted by path (parents before children)."""

    actors: list[ActorSnapshot]

"""The one protocol a handle needs from the incarnation it runs.

Kept apart from the actor so that the handle module does not import the actor module (the
actor imports the handle); :class:`~castor.supervision.actor.Actor` implements it.
"""

from __future__ import annotations

from typing import Any, ClassVar, Protocol

from castor.supervision.mailbox import Envelope, Latch, Mailbox


class Incarnation(Protocol):
    """What an :class:`~castor.supervision.handle.ActorHandle` needs from the actor it runs.

    :class:`~castor.supervision.actor.Actor` implements it; the handle knows actors only
    through it, so the handle module does not import the actor module. The ``handle``
    parameters are typed ``Any`` because naming ``ActorHandle`` here would make this bottom
    module depend on the handle module (an import cycle); it is always the calling handle.
    """

    inline_asks: ClassVar[bool]
    start_on_caller: ClassVar[bool]

    @property
    def inbox(self) -> Mailbox:
        """The mailbox it was bound to."""

    @property
    def start_latch(self) -> Latch | None:
        """Set once ``on_start`` has finished; None when there is no ``on_start`` to wait for."""

    @property
    def is_ending(self) -> bool:
        """True once this incarnation ended, was cut loose, or asked to stop or retire."""

    def bind_to(self, handle: Any, mailbox: Mailbox, incarnation: int) -> None:
        """Attach to its handle and mailbox as incarnation number ``incarnation``."""

    def begin_incarnation(self) -> None:
        """Start the bound incarnation (its loop on a loop thread; see ``Actor.start_on_caller``)."""

    def handle_envelope(self, envelope: Envelope, handle: Any, since: float | None = None) -> None:
        """Handle one message and resolve its reply; ``since`` is when its handling began
        (monotonic; None: now)."""

    def cut_loose(self) -> None:
        """Brutal shutdown: the loop hands on whatever it takes next and ends."""

    def owned_pids(self) -> list[int]:
        """OS processes this actor owns."""

    def kill_owned(self) -> None:
        """Kill owned OS processes; safe from any thread."""

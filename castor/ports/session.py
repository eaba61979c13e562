"""SessionPort: persist a custom session entry and wait for the acknowledgement.

Implemented by the harness link (``session.append_entry`` request, answered
when Pi has persisted the entry) and, standalone, by
:class:`castor.adapters.session_jsonl.JsonlSessionLog`.

Contract: :meth:`append_entry` returns only once the entry is durably
recorded (acknowledged). It raises :class:`castor.messages.errors.Timeout`
if ``deadline`` (an absolute ``time.monotonic()`` value) passes first, and
any other :class:`castor.messages.errors.CastorError` (or ``OSError``) when
the entry could not be recorded. A raise means "not known to be persisted":
callers that promised "persisted before" must then act as if it was not.
Entries are never model-visible.

``expires=True`` (the Icarus filter audit, whose text castor releases only once the entry is
acknowledged): the entry must not be recorded at all once ``deadline`` has passed, since castor has
then acted as if it was not. A harness told so over the wire (``expires_at_ms``) refuses a late
entry; an implementation that cannot promise it (a harness that ignores the field) leaves the
caller to correct the record (:mod:`castor.actors.icarus.audit`).
"""

from __future__ import annotations

from typing import Any, Protocol, runtime_checkable


@runtime_checkable
class SessionPort(Protocol):
    def append_entry(self, custom_type: str, data: dict[str, Any], deadline: float, *,
                     expires: bool = False) -> None:
        """Persist ``{custom_type, data}``; return after the acknowledgement. ``expires``: never
        record it once ``deadline`` has passed."""
        ...


@runtime_checkable
class SessionUiPort(Protocol):
    """Fire-and-forget session UI of the harness (``message.send``, ``ui.status``, ``ui.notify``).

    Implementations should not block for long; callers swallow their errors
    (a footer or toast failure never fails the user's run).
    """

    def send_message(self, custom_type: str, content: str, *, display: bool, trigger_turn: bool = False) -> None:
        """Show or inject a custom message (``message.send``)."""
        ...

    def set_status(self, key: str, text: str | None) -> None:
        """Set (or clear with ``None``) the footer status under ``key``."""
        ...

    def notify(self, message: str, level: str = "info", *, code: str | None = None) -> None:
        """A toast (``info`` or ``warning``). ``code``: what it is about, a stable error code
        (``storage_unavailable``) a harness can act on without reading the text; None for a
        toast that is only text."""
        ...

"""HostContextPort: the harness's own accumulated context (its session transcript), read and compacted.

In a harness session (Pi) castor's materia turns run *inside* the harness session, whose
transcript — including each turn's own tool output — accumulates. Same-socket recovery after a
``context_window`` failure compacts it before the retry, and a non-recovery
send compacts it first when its usage is over the threshold.

Implemented by the harness link (``session.context_usage`` / ``session.compact`` requests,
:mod:`castor.endpoint.harness_link`) and, for standalone agents (scripted, OpenAI HTTP), by
:class:`NoHostContext`, which says explicitly that there is nothing to compact.

Contract for implementers
-------------------------
- ``has_context`` is False when the port *knows* there is no host context (standalone, or a
  harness that answered ``unknown_method`` for ``session.context_usage``): callers then skip the
  usage read and proactive compaction entirely, with no events.
- ``context_usage(timeout_s)`` returns :class:`ContextUsage`, or None when the host has no
  context or does not say; it raises a :class:`castor.messages.errors.CastorError` only when the
  question could not be asked or answered (timeout, connection closed) — callers treat that as
  "usage unknown" and skip.
- ``compact(request, reply, timeout_s=...)`` returns at once. ``reply`` is called **exactly once**,
  later, **never on the caller's stack**, with a :class:`CompactionOutcome`. Failures are
  outcomes (``ok=False`` with ``error``), never exceptions. ``unsupported=True`` marks a host that
  does not implement compaction at all (``unknown_method``). One exception, as for agent turns:
  a harness link whose connection closed does not reply (the session closes with it and its
  casts stay resumable); callers guard every compaction with a deadline of their own
  (:class:`castor.actors.materia.compaction_call.CompactionCall`).
- The instructions are never logged (``CompactionRequest.instructions`` is excluded from repr).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol, runtime_checkable

from pydantic import BaseModel, ConfigDict, Field

from castor.domain.materia.budget import non_negative_number
from castor.domain.materia.compaction import NO_HOST_CONTEXT, compaction_summary
from castor.supervision.threads import start_thread

__all__ = ["CompactionOutcome", "CompactionReply", "CompactionRequest", "ContextUsage", "HostContextPort",
           "NO_HOST_CONTEXT", "NoHostContext"]


class ContextUsage(BaseModel):
    """The host's context usage before a turn; ``None`` = not known."""

    model_config = ConfigDict(frozen=True)

    tokens: float | None = None
    context_window: float | None = None
    percent: float | None = None

    @classmethod
    def from_wire(cls, value: Any) -> ContextUsage | None:
        """``{tokens?, contextWindow?, percent?}`` as sent by a harness; None for nil or a non-map.
        A figure that is not a finite non-negative number counts as not reported."""
        if not isinstance(value, dict):
            return None
        return cls(tokens=non_negative_number(value.get("tokens")),
                   context_window=non_negative_number(value.get("contextWindow")),
                   percent=non_negative_number(value.get("percent")))

    def usage_map(self) -> dict[str, Any]:
        """The map :func:`castor.domain.materia.compaction.decide_proactive` reads."""
        return {"tokens": self.tokens, "contextWindow": self.context_window, "percent": self.percent}


class CompactionRequest(BaseModel):
    """Compact the host context of the session that runs cast ``cast_id``."""

    model_config = ConfigDict(frozen=True)

    cast_id: str
    instructions: str = Field(repr=False)  # what the compaction must preserve (never logged)
    reason: str = "context_window"  # context_window (recovery) | context_pressure (proactive)


class CompactionOutcome(BaseModel):
    """The answer to one :class:`CompactionRequest`.

    ``result`` holds only the spec's summary fields (``tokensBefore, tokensAfter, entriesRemoved,
    summaryTokens, firstKeptEntryId``); ``skipped`` says why an ``ok`` compaction compacted
    nothing (:data:`NO_HOST_CONTEXT`).
    """

    model_config = ConfigDict(frozen=True)

    ok: bool
    result: dict[str, Any] = Field(default_factory=dict)
    error: str | None = None
    skipped: str | None = None
    unsupported: bool = False
    cancelled: bool = False  # the user stopped it (an Esc in the harness): not a failure of the cast

    @classmethod
    def succeeded(cls, raw: Any) -> CompactionOutcome:
        return cls(ok=True, result=compaction_summary(raw))

    @classmethod
    def failed(cls, error: str, *, unsupported: bool = False, cancelled: bool = False) -> CompactionOutcome:
        return cls(ok=False, error=error, unsupported=unsupported, cancelled=cancelled)


CompactionReply = Callable[[CompactionOutcome], None]


@runtime_checkable
class HostContextPort(Protocol):
    @property
    def has_context(self) -> bool:
        """False when there is known to be no host context to read or compact."""
        ...

    def context_usage(self, timeout_s: float) -> ContextUsage | None:
        """The host's context usage now, or None (no context / not reported)."""
        ...

    def compact(self, request: CompactionRequest, reply: CompactionReply, *, timeout_s: float) -> None:
        """Start a compaction; ``reply`` is called exactly once, later, on another thread."""
        ...


class NoHostContext:
    """The host context of a standalone agent: there is none, and it says so.

    Standalone adapters (scripted, OpenAI HTTP) send each turn as an isolated request; nothing
    accumulates between turns. So ``context_usage`` is None (proactive compaction never fires)
    and a recovery compaction is answered ``ok`` with an empty result and
    ``skipped="no host context"`` — recorded in the ``same_socket_recovery_action_complete``
    event, so a run record never suggests that something was compacted.
    """

    has_context = False

    def context_usage(self, timeout_s: float) -> ContextUsage | None:
        return None

    def compact(self, request: CompactionRequest, reply: CompactionReply, *, timeout_s: float) -> None:
        outcome = CompactionOutcome(ok=True, skipped=NO_HOST_CONTEXT)
        start_thread(reply, args=(outcome,), name=f"no-host-context-{request.cast_id}", owner="/root",
                     purpose="answer a compaction with no host context")

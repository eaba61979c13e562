"""AgentPort: run one agent turn somewhere else and hear back once.

Implemented by the harness link (the ``agent.run_turn`` notification, answered
later by the harness's ``agent.turn_ended`` request) and, standalone, by
:mod:`castor.adapters.agents.scripted` and :mod:`castor.adapters.agents.openai_http`.

Contract for implementers
-------------------------
- ``run_turn(request, reply)`` returns at once; it never blocks on the model.
- ``reply`` is called **exactly once** per accepted ``turn_id`` and **never on
  the caller's stack** (always from another thread), so an actor that calls
  ``run_turn`` from its own message handler is never re-entered — unless the
  caller marked it :func:`enqueues_only` (it only *tells* an actor, which can
  never re-enter anyone): such a reply may be called on any thread, the
  caller's included, so an answer that is ready at once costs no thread hop.
- ``cancel(turn_id)`` is idempotent. If the turn has not replied yet, it
  replies with ``stop_reason="aborted"`` and ``error.kind="cancelled"``; a
  late answer from the model is then dropped. Unknown ids are ignored.
- Failures are *outcomes*, not exceptions: ``error`` carries the message the
  failure classifier reads and, where the provider sent one, its structured
  error payload untouched (``error.payload``) so context-window or tool errors
  are never masked. ``error.kind`` is a hint (``transport`` for a dropped
  connection, ``timeout`` for a passed deadline, ...), never a replacement for
  the message.
- ``run_turn`` may raise only for a request it cannot accept at all
  (``InvalidParams``, a duplicate in-flight ``turn_id`` → ``Conflict``, a
  closed adapter → ``ActorStopped``); then ``reply`` is never called.
- Usage fields the provider did not report are ``None``, never ``0``.
- ``TurnRequest.prompt`` is the hidden prompt: it is excluded from ``repr`` so
  it does not reach logs by accident.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Literal, Protocol, runtime_checkable

from pydantic import BaseModel, ConfigDict, Field

__all__ = [
    "AgentPort",
    "ErrorKind",
    "ThinkingLevel",
    "ToolScope",
    "TurnError",
    "TurnOutcome",
    "TurnReply",
    "TurnRequest",
    "TurnUsage",
    "TOOL_SCOPES",
    "enqueues_only",
    "harness_turn_settings",
    "may_reply_inline",
]

ToolScope = Literal["none", "readOnly", "coding"]
ThinkingLevel = Literal["off", "minimal", "low", "medium", "high", "xhigh"]
ErrorKind = Literal["provider", "transport", "timeout", "cancelled", "exhausted", "invalid_response", "internal"]

TOOL_SCOPES: dict[str, list[str] | None] = {
    "none": [],  # a pure reasoning turn: no tools at all
    "readOnly": ["read", "grep", "find", "ls"],  # Pi's read-only built-ins
    "coding": None,  # the harness's full tool set (the field is omitted)
}
"""Materia tool scopes → the tool names a harness activates for a turn."""


def harness_turn_settings(model: str | None, thinking: str | None, tools: str | None) -> dict[str, Any]:
    """A turn's model, thinking and tool scope as harness parameters (``agent.run_turn``, and the
    ``before_agent_start`` answer for a user-driven refinement turn): ``model`` as
    ``{provider, id}`` from ``"provider/id"``, ``thinking`` as is, ``tools`` as the tool names of the
    scope. Unset values (and the ``coding`` scope: the harness's full set) are left out."""
    out: dict[str, Any] = {}
    names = TOOL_SCOPES.get(tools) if tools is not None else None
    if names is not None:
        out["tools"] = list(names)
    if model:
        provider, _, model_id = model.partition("/")
        out["model"] = {"provider": provider, "id": model_id} if model_id else {"provider": None, "id": provider}
    if thinking:
        out["thinking"] = thinking
    return out


class TurnRequest(BaseModel):
    """One isolated agent turn castor asks for."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    turn_id: str = Field(min_length=1)
    cast_id: str = Field(min_length=1)
    socket_id: str = Field(min_length=1)
    visit: int = Field(ge=0)
    prompt: str = Field(repr=False)  # hidden prompt sent to the model
    summary: str = ""  # visible one-line summary for the user
    model: str | None = None  # ``provider/model-id`` or an id; None = the host's current model
    thinking: ThinkingLevel | None = None
    tools: ToolScope = "none"
    item_key: str | None = None  # the work item of a loop socket's turn, if any
    mode: Literal["normal", "refinement", "finalization"] = "normal"  # the socket turn's mode
    materia: str = ""  # the socket's materia, as configured
    item_label: str | None = None  # the work item's label, if any
    materia_model: dict[str, Any] | None = None  # the socket's ``materiaModel`` record (pi-materia's)


class TurnUsage(BaseModel):
    """Token and cost usage of a turn; ``None`` = not reported."""

    model_config = ConfigDict(frozen=True)

    input_tokens: int | None = None
    output_tokens: int | None = None
    cache_read_tokens: int | None = None
    cache_write_tokens: int | None = None
    total_tokens: int | None = None
    cost_usd: float | None = None
    raw: dict[str, Any] | None = None  # the provider's usage object as sent, for alias-aware extraction


class TurnError(BaseModel):
    """Why a turn failed. ``message`` is what the failure classifier reads."""

    model_config = ConfigDict(frozen=True)

    message: str
    kind: ErrorKind | None = None
    payload: Any = None  # the provider's structured error body, untouched
    status: int | None = None  # HTTP status where there was one


class TurnOutcome(BaseModel):
    """The answer to one ``TurnRequest``."""

    model_config = ConfigDict(frozen=True)

    turn_id: str
    text: str = ""
    stop_reason: str | None = None  # "stop", "length", "toolUse", "error", "aborted", ...
    error: TurnError | None = None
    usage: TurnUsage | None = None
    model: str | None = None  # the model that actually answered, if known
    provider: str | None = None  # ... its provider, api and the thinking level it ran with, if known
    api: str | None = None
    thinking_level: str | None = None
    entry_id: str | None = None  # the harness's transcript entry of the answer (Pi's message id), if any

    @property
    def ok(self) -> bool:
        return self.error is None and self.stop_reason not in ("error", "aborted")


TurnReply = Callable[[TurnOutcome], None]


def enqueues_only(reply: TurnReply) -> TurnReply:
    """Mark ``reply`` as one that only enqueues (an actor ``tell``) and returns.

    Such a reply can never re-enter the code that called ``run_turn``, so an adapter may call
    it on the caller's own stack (see the contract above). Returns ``reply`` itself.
    """
    reply.enqueues_only = True  # type: ignore[attr-defined]  # a marker attribute on a function object
    return reply


def may_reply_inline(reply: TurnReply) -> bool:
    """Whether an adapter may call ``reply`` on the thread that settles the turn, even the caller's."""
    return getattr(reply, "enqueues_only", False) is True


@runtime_checkable
class AgentPort(Protocol):
    def run_turn(self, request: TurnRequest, reply: TurnReply) -> None:
        """Start a turn; ``reply`` is called exactly once, later, on another thread."""
        ...

    def cancel(self, turn_id: str) -> None:
        """Abandon a turn: reply ``aborted`` now if it has not replied yet."""
        ...

"""What a cast's transition reads of a resolved socket, as a plain slotted object made once per socket.

A :class:`~castor.domain.materia.config.ResolvedSocket` is a pydantic model, and every pydantic
model inherits ``BaseModel.__getattr__`` (it serves private attributes and extra fields): CPython
3.11 does not specialise an attribute read on such a type, so each ``rs.materia`` costs ~150 ns
where a slot read costs ~20, and the engine's step and prompts read a socket's fields about 130
times a transition. :func:`facts_of` gives those fields as :class:`SocketFacts`, computed the first
time a socket object is asked and kept for as long as it lives (``castor.domain.materia.memo``: the
resolved config is immutable by contract, so the facts cannot go stale).

Guarantees: every field equals what the same expression on the socket gives (``id``, ``socket``,
``materia_name``, ``materia`` the socket's own; ``is_agent``, ``is_generator``, ``multi_turn`` its
properties; ``is_json`` its ``socket.is_json``); ``prompt``, ``model``, ``thinking`` and ``tools``
are the materia's, or ``""``, None, None and ``"none"`` for a socket without one; ``turn_model`` is
the model stripped (None when blank), ``applied_thinking`` the thinking level when castor knows it
(else None: warned at load), and ``materia_model`` the one shared ``materiaModel`` record of the
socket's (model, thinking) (None without a materia). tests/domain/materia/test_socket_facts.py
checks each against the socket.
"""

from __future__ import annotations

import functools
from typing import Any

from castor.domain.materia.budget import materia_model_selection
from castor.domain.materia.config import THINKING_LEVELS, AgentMateria, ResolvedSocket, Socket
from castor.domain.materia.memo import derived


class SocketFacts:
    """The fields of one resolved socket a transition reads (see the module's guarantees); read-only
    by convention, as the socket it comes from."""

    __slots__ = ("id", "socket", "type", "materia_name", "materia", "is_agent", "is_generator", "multi_turn",
                 "is_json", "prompt", "model", "turn_model", "thinking", "applied_thinking", "tools",
                 "materia_model")

    def __init__(self, rs: ResolvedSocket) -> None:
        socket = rs.socket
        materia = rs.materia
        self.id: str = rs.id
        self.socket: Socket = socket
        self.type: str = socket.type
        self.materia_name: str | None = rs.materia_name
        self.materia: AgentMateria | None = materia
        self.is_agent: bool = rs.is_agent
        self.is_generator: bool = rs.is_generator
        self.multi_turn: bool = rs.multi_turn
        self.is_json: bool = socket.is_json
        self.prompt: str = materia.prompt if materia is not None else ""
        self.model: str | None = materia.model if materia is not None else None
        self.turn_model: str | None = (self.model or "").strip() or None
        self.thinking: str | None = materia.thinking if materia is not None else None
        self.applied_thinking: str | None = self.thinking if self.thinking in THINKING_LEVELS else None
        self.tools: str = materia.tools if materia is not None else "none"
        self.materia_model: dict[str, Any] | None = (
            None if materia is None else shared_materia_model(materia.model, materia.thinking))


def facts_of(rs: ResolvedSocket) -> SocketFacts:
    """``rs``'s :class:`SocketFacts`, made once per socket object."""
    return derived(rs, "socket_facts", lambda: SocketFacts(rs))


@functools.lru_cache(maxsize=256)
def shared_materia_model(model: str | None, thinking: str | None) -> dict[str, Any]:
    """One record per (model, thinking), shared by every cast that asks for it: a 15-field record
    made per socket of every cast cost a thousand concurrent casts 4 KiB each (bench/casts.py's
    peak memory per cast). Shared safely because nothing mutates a ``materiaModel``. A field with
    no value is left out, as pi-materia's JSON leaves out its undefined optional fields (and each
    manifest entry, kept as text, is shorter for it)."""
    thinking = thinking if (thinking or "").strip() else None  # blank: unset
    # An unknown level is not applied (warned at load): the turn keeps the harness's level, as
    # pi-materia falls back.
    applied = thinking if thinking is None or thinking in THINKING_LEVELS else None
    record = materia_model_selection(requested_model=model, requested_thinking=thinking, thinking=applied,
                                     thinking_fallback_reason=None if applied == thinking else "unknown_thinking")
    return {key: value for key, value in record.items() if value is not None}

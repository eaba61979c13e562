"""Typed messages: immutable pydantic models with stable type names.

Every message class registers itself under a stable ``type_name`` (given as a
class keyword, ``class CastStarted(Message, type_name="cast.started")``).
The name, not the Python class path, is what crosses the wire, so classes may
move between modules without breaking peers. Names are unique: registering
the same name twice is a programming error and raises at import time.
"""

from __future__ import annotations

from typing import Any, ClassVar

from pydantic import BaseModel, ConfigDict

_REGISTRY: dict[str, type[Message]] = {}


class Message(BaseModel):
    """Base of every typed message. Frozen, strict about unknown fields."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    type_name: ClassVar[str] = ""
    wire: ClassVar[bool] = True
    """False for process-local messages (they carry callables or handles)."""

    def __init_subclass__(cls, type_name: str | None = None, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if type_name is None:
            return  # an abstract intermediate base; not on the wire
        existing = _REGISTRY.get(type_name)
        if existing is not None and existing.__qualname__ != cls.__qualname__:
            raise TypeError(f"message type name {type_name!r} already used by {existing.__qualname__}")
        cls.type_name = type_name
        _REGISTRY[type_name] = cls

    def queued_detail(self, now: float) -> dict[str, str | int | float | bool | None]:
        """What an operator may read of this message while it waits in a mailbox (``castor
        inspect``, the console): a few scalars that say what it is for -- a call's target, its
        deadline (``now`` is the snapshot's monotonic clock) -- never its payload, which may hold
        a prompt or a memory. Nothing by default."""
        return {}


class LocalMessage(Message):
    """A message that never leaves the process: it may carry callables, handles, tokens.

    Registered (so mailboxes count it by name) but refused by the wire codec.
    """

    model_config = ConfigDict(frozen=True, extra="forbid", arbitrary_types_allowed=True)
    wire: ClassVar[bool] = False


def message_type(type_name: str) -> type[Message] | None:
    """The registered class for ``type_name``, or None."""
    return _REGISTRY.get(type_name)


def registered_types(*, wire_only: bool = False) -> dict[str, type[Message]]:
    """A copy of the registry: stable type name -> class (optionally only wire messages)."""
    return {name: klass for name, klass in _REGISTRY.items() if klass.wire or not wire_only}


def type_name_of(message: object) -> str:
    """The stable name of a message, or its Python class name for untyped values."""
    name = getattr(message, "type_name", None)
    return name if isinstance(name, str) and name else type(message).__name__

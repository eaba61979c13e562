"""msgpack codec for registered messages.

Wire form: a two-element msgpack array ``[type_name, fields_map]``. Decoding
looks the type up in the registry and validates the fields with pydantic;
an unknown type, a malformed frame or a wrong field raises
:class:`~castor.messages.errors.InvalidMessage` naming what was wrong. The
codec never returns a partially valid message.
"""

from __future__ import annotations

from typing import Any

import msgpack
from pydantic import ValidationError

from castor.messages.base import Message, message_type
from castor.messages.errors import InvalidMessage


def to_wire(message: Message) -> list[Any]:
    """The msgpack-ready ``[type_name, fields]`` form of ``message``."""
    if not isinstance(message, Message) or not message.type_name or not message.wire:
        raise InvalidMessage(f"not a wire message: {type(message).__name__}")
    return [message.type_name, message.model_dump(mode="json")]


def from_wire(value: Any) -> Message:
    """Validate a ``[type_name, fields]`` value back into its message."""
    if not (isinstance(value, (list, tuple)) and len(value) == 2):
        raise InvalidMessage("a message is a [type_name, fields] pair")
    type_name, fields = value
    if not isinstance(type_name, str):
        raise InvalidMessage("message type name must be a string")
    klass = message_type(type_name)
    if klass is None or not klass.wire:
        raise InvalidMessage(f"unknown message type {type_name!r}", data={"type": type_name})
    if not isinstance(fields, dict):
        raise InvalidMessage(f"fields of {type_name!r} must be a map", data={"type": type_name})
    try:
        return klass.model_validate(fields)
    except ValidationError as exc:
        raise InvalidMessage(
            f"invalid fields for {type_name!r}",
            data={"type": type_name, "errors": _describe(exc)},
        ) from None


def encode(message: Message) -> bytes:
    """Serialise a message to msgpack bytes; unencodable values raise InvalidMessage."""
    wire = to_wire(message)
    try:
        packed: bytes = msgpack.packb(wire, use_bin_type=True)
        return packed
    except (OverflowError, TypeError, ValueError) as exc:
        raise InvalidMessage(f"{message.type_name!r} cannot be encoded: {type(exc).__name__}") from None


def decode(data: bytes) -> Message:
    """Parse msgpack bytes into a message; every failure is InvalidMessage."""
    try:
        value = msgpack.unpackb(data, raw=False, strict_map_key=True)
    except Exception as exc:  # msgpack raises several unrelated types
        raise InvalidMessage(f"undecodable msgpack: {type(exc).__name__}") from None
    return from_wire(value)


def _describe(exc: ValidationError) -> list[dict[str, str]]:
    # Field locations and messages only: input values may be private.
    return [
        {"loc": ".".join(str(p) for p in err["loc"]), "msg": err["msg"], "type": err["type"]}
        for err in exc.errors(include_input=False, include_url=False)
    ]

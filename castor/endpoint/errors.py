"""Endpoint-specific errors and the wire-error → exception mapping."""

from __future__ import annotations

from typing import Any

from castor.messages.errors import (
    MAX_WIRE_CODE_CHARS,
    MAX_WIRE_MESSAGE_CHARS,
    Cancelled,
    CastorError,
    ErrorCode,
    cut_text,
)


class ConnectionClosed(Cancelled):
    """The connection closed before the call was answered (code ``cancelled``).

    ``data.reason`` says why (``eof``, ``stopped``, ``outbound queue overflow``…);
    ``may_have_started`` is true once the request was handed to the transport.
    """


def error_from_wire(wire: Any) -> CastorError:
    """The most specific :class:`CastorError` for a wire error map.

    A peer written in another language may send a code castor does not know:
    it becomes a plain ``CastorError`` with code ``internal`` and the original
    code kept in ``data.wire_code`` rather than an exception in the reader.
    The message is cut at ``MAX_WIRE_MESSAGE_CHARS`` and such a code at ``MAX_WIRE_CODE_CHARS``.
    """
    if not isinstance(wire, dict):
        return CastorError(f"malformed error from peer: {wire!r:.200}")
    code = wire.get("code")
    try:
        ErrorCode(str(code))  # a missing code (None) is no ErrorCode either
    except ValueError:
        data = dict(wire.get("data") or {}) if isinstance(wire.get("data"), dict) else {}
        data["wire_code"] = cut_text(str(code), MAX_WIRE_CODE_CHARS)
        return CastorError(cut_text(str(wire.get("message", "")), MAX_WIRE_MESSAGE_CHARS), data=data)
    if wire.get("data") is not None and not isinstance(wire.get("data"), dict):
        wire = {**wire, "data": {"value": wire["data"]}}
    return CastorError.from_wire(wire)

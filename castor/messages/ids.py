"""The one safe-id rule: what an id from outside may look like before castor uses it.

Actor path segments (session ids among them), cast ids and socket ids all end up as one segment
of something castor builds — an actor path, a directory or file name under the artifact root —
so they share one rule and one refusal:

- one to 128 characters, ASCII letters, digits, ``.``, ``_`` and ``-`` only;
- the first character is a letter or a digit (so never ``.``, ``..``, a hidden name, or a
  name a shell reads as an option).

Anything else (a separator, NUL, a newline, a colon, a backslash, a non-ASCII letter, the empty
string, a non-string) is refused with ``forbidden`` (:class:`~castor.messages.errors.Forbidden`),
``data.reason`` ``"invalid <field>"`` and the offending value, escaped and cut to 80 characters,
under ``data[<field>]``. The rule only says whether an id is safe to use as one segment; whether
the thing it names exists, or belongs to the caller, is for the code that looks it up.
"""

from __future__ import annotations

import re

from castor.messages.errors import Forbidden

MAX_ID_LENGTH = 128
"""The longest id the rule accepts, in characters."""

SAFE_ID_PATTERN = r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}"
"""The rule as a regular expression (to be matched against the whole id)."""

_SAFE_ID = re.compile(SAFE_ID_PATTERN)
_SHOWN = 80


def is_safe_id(value: object) -> bool:
    """Whether ``value`` is a string that satisfies the safe-id rule."""
    return isinstance(value, str) and _SAFE_ID.fullmatch(value) is not None


def check_safe_id(value: object, field: str = "id") -> str:
    """Return ``value`` if it satisfies the safe-id rule, else raise ``Forbidden``.

    ``field`` names the id in the message and in ``data`` (``"cast_id"``, ``"socket_id"``,
    ``"segment"``)."""
    if is_safe_id(value):
        return value  # type: ignore[return-value]  # is_safe_id checked it is a str
    if not isinstance(value, str):
        raise Forbidden(f"{field} must be a string", data={"reason": f"invalid {field}"})
    shown = value.encode("unicode_escape", "backslashreplace").decode("ascii")[:_SHOWN]
    raise Forbidden(f"invalid {field}: {shown!r}", data={"reason": f"invalid {field}", field: shown})

"""Targeted edits of a config file's JSON text: change one top-level value, keep every other byte.

``castor loadout NAME`` changes ``activeLoadout`` only. Rewriting the whole file from its parsed
form would reorder nothing but still lose the user's formatting, comments-free layout choices and
literal unicode (``→`` would come back as ``\\u2192``). :func:`set_top_level_string` instead:

| file | edit |
|---|---|
| the key is present (possibly several times: the last one counts, as for any JSON reader) | only that value's text is replaced |
| the key is absent | ``"key": value`` is appended as the object's last member, in the file's own indentation |
| an empty object | ``{"key": value}`` keeps the file's surrounding whitespace |

The result is parsed again and must equal the intended object (the parsed file with the key
set); :class:`EditRefused` otherwise, and the caller falls back to a full rewrite. Pure.
"""  # noqa: E501 - table rows cannot wrap

from __future__ import annotations

import json
from typing import Any

_WS = " \t\r\n"
_DECODER = json.JSONDecoder()


class EditRefused(ValueError):
    """The text could not be edited in place (not one JSON object, or the check failed)."""


def _skip_ws(text: str, i: int) -> int:
    while i < len(text) and text[i] in _WS:
        i += 1
    return i


def _members(text: str) -> tuple[int, int, list[tuple[str, int, int]]]:
    """The top-level object's ``{`` and ``}`` offsets and its members ``(key, value start,
    value end)``, in file order."""
    start = _skip_ws(text, 0)
    if start >= len(text) or text[start] != "{":
        raise EditRefused("not a JSON object")
    members: list[tuple[str, int, int]] = []
    i = _skip_ws(text, start + 1)
    if i < len(text) and text[i] == "}":
        return start, i, members
    while True:
        if i >= len(text) or text[i] != '"':
            raise EditRefused("expected a key")
        try:
            key, i = _DECODER.raw_decode(text, i)
        except json.JSONDecodeError as exc:
            raise EditRefused(f"bad key: {exc.msg}") from None
        i = _skip_ws(text, i)
        if i >= len(text) or text[i] != ":":
            raise EditRefused("expected ':'")
        value_start = _skip_ws(text, i + 1)
        try:
            _, value_end = _DECODER.raw_decode(text, value_start)
        except (ValueError, RecursionError) as exc:  # a JSONDecodeError, or an integer past 4300 digits
            raise EditRefused(f"bad value: {getattr(exc, 'msg', exc)}") from None
        members.append((key, value_start, value_end))
        i = _skip_ws(text, value_end)
        if i < len(text) and text[i] == ",":
            i = _skip_ws(text, i + 1)
            continue
        if i < len(text) and text[i] == "}":
            if text[_skip_ws(text, i + 1):]:
                raise EditRefused("text after the object")
            return start, i, members
        raise EditRefused("expected ',' or '}'")


def _indent_of_first_member(text: str, open_at: int, first_key_at: int) -> str | None:
    """The whitespace before the first member's key after its line break, or None (one line)."""
    gap = text[open_at + 1:first_key_at]
    if "\n" not in gap:
        return None
    return gap[gap.rindex("\n") + 1:]


def set_top_level_string(text: str, key: str, value: str) -> str:
    """``text`` with the top-level ``key`` set to the string ``value`` (see module doc)."""
    try:
        original = json.loads(text)
    except (ValueError, RecursionError) as exc:  # a JSONDecodeError, or an integer past 4300 digits
        raise EditRefused(f"not JSON: {getattr(exc, 'msg', exc)}") from None
    if not isinstance(original, dict):
        raise EditRefused("not a JSON object")
    intended: dict[str, Any] = dict(original)
    intended[key] = value
    literal = json.dumps(value, ensure_ascii=False)
    open_at, close_at, members = _members(text)
    hits = [m for m in members if m[0] == key]
    if hits:
        _, start, end = hits[-1]
        edited = text[:start] + literal + text[end:]
    elif not members:
        edited = text[:open_at + 1] + f"{json.dumps(key, ensure_ascii=False)}: {literal}" + text[close_at:]
    else:
        first_key_at = _skip_ws(text, open_at + 1)
        indent = _indent_of_first_member(text, open_at, first_key_at)
        last_end = members[-1][2]
        sep = f",\n{indent}" if indent is not None else ", "
        if indent is not None and "\r\n" in text[open_at:first_key_at]:
            sep = f",\r\n{indent}"
        edited = text[:last_end] + sep + f"{json.dumps(key, ensure_ascii=False)}: {literal}" + text[last_end:]
    try:
        reread = json.loads(edited)
    except (ValueError, RecursionError) as exc:  # a JSONDecodeError, or an integer past 4300 digits
        raise EditRefused(f"the edited text is not JSON: {getattr(exc, 'msg', exc)}") from None
    if reread != intended:
        raise EditRefused("the edited text does not parse to the intended object")
    return edited

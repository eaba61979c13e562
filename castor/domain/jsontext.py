"""JSON text: reading it safely from outside (``loads_strict``, ``well_formed``) and writing
it for people (``pretty_json``).

``loads_strict``: ``json.loads`` that refuses ``NaN``, ``Infinity`` and ``-Infinity`` (Python
accepts them; JSON and every other reader do not), raising ``ValueError`` like any bad JSON.

``well_formed``: a value whose strings can be written as UTF-8.

A JSON escape such as ``"\\ud800"`` (in a model's answer, a utility's or a memory backend's
output, a config or settings file) or an undecodable byte in a command-line argument
(``surrogateescape``) puts a *lone surrogate* code point into a Python string. UTF-8 cannot
encode it, so nothing holding it could be written to a file or sent as msgpack, and every
retry would fail the same way. Each lone surrogate becomes U+FFFD (what a UTF-8 decoder shows
for a broken sequence); everything else is returned unchanged, as the same object.

``pretty_json``: the 2-space JSON that prompts and artifacts show, without the slow path when
it is not needed. ``json.dumps(value, indent=2)`` always runs the pure-Python encoder; for the
values prompts render most (no item, no guidance, an empty ``data``, a scalar) the indented text
equals the compact one, which the C encoder produces. The result is always exactly
``json.dumps(value, indent=2, ensure_ascii=False)``.
"""

from __future__ import annotations

import json
import re
from typing import Any

_LONE_SURROGATE = re.compile("[\ud800-\udfff]")


def well_formed(value: Any) -> Any:
    """``value`` with every lone surrogate in its strings (keys and nested values too) replaced
    by U+FFFD; the very same object when there is none (see the module doc)."""
    kind = type(value)
    if kind is str:
        if value.isascii() or not _LONE_SURROGATE.search(value):  # isascii: the common case, in C
            return value
        return _LONE_SURROGATE.sub("\ufffd", value)
    if kind is dict:
        for key, item in value.items():  # the common case first: ASCII text and scalars only
            if (type(key) is not str or not key.isascii() or type(item) in _NESTED
                    or (type(item) is str and not item.isascii())):
                return _well_formed_dict(value)
        return value
    if kind is list or kind is tuple:
        items = [well_formed(item) for item in value]
        return value if all(a is b for a, b in zip(value, items, strict=True)) else kind(items)
    return value


_NESTED = frozenset((dict, list, tuple))


def _well_formed_dict(value: dict[Any, Any]) -> dict[Any, Any]:
    fixed = None
    for key, item in value.items():
        new_key = key if type(key) is str and key.isascii() else well_formed(key)
        item_kind = type(item)
        if item_kind is str:
            new_item = item if item.isascii() else well_formed(item)
        elif item_kind in _NESTED:
            new_item = well_formed(item)
        else:
            new_item = item  # what well_formed returns for anything else
        if fixed is None and (new_key is not key or new_item is not item):
            fixed = {}
            for done_key, done_item in value.items():  # the unchanged ones before this item
                if done_key is key:
                    break
                fixed[done_key] = done_item
        if fixed is not None:
            fixed[new_key] = new_item
    return value if fixed is None else fixed


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def loads_strict(text: str | bytes) -> Any:
    """``json.loads`` without the non-standard constants (see the module doc)."""
    return json.loads(text, parse_constant=_reject_constant)


def pretty_json(value: Any) -> str:
    """``json.dumps(value, indent=2, ensure_ascii=False)``, by the C encoder when that gives the
    same text (see the module doc)."""
    if value is None:
        return "null"
    if isinstance(value, (dict, list)):
        if not value:
            return "{}" if isinstance(value, dict) else "[]"
        return json.dumps(value, indent=2, ensure_ascii=False)
    if isinstance(value, (str, int, float)):
        return json.dumps(value, ensure_ascii=False)
    return json.dumps(value, indent=2, ensure_ascii=False)

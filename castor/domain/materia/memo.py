"""Memoised values derived from an immutable object, keyed by the object's identity.

``derived(obj, name, compute)`` returns ``compute()`` the first time it is asked for
``(obj, name)`` and the same value afterwards, for as long as ``obj`` lives. It is what lets
the engine stay a pure function while not re-deriving, on every cast or step, what only
depends on the resolved config (its JSON text, its hash, its JSON for the state document):
the config is immutable by contract (the engine never mutates it and shares it between
states; ``ResolvedConfigCache`` hands one object to many casts), so the value cannot go stale.

Guarantees: an entry dies with its object (a weakref callback removes it), so an id reused
by a later object never sees an earlier object's values. Computing twice in a race is
harmless (both results are equal; one wins). The object must support weak references.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable
from typing import Any, TypeVar

T = TypeVar("T")

_ENTRIES: dict[int, tuple[weakref.ref[Any], dict[str, Any]]] = {}


def derived(obj: Any, name: str, compute: Callable[[], T]) -> T:
    # A value derived before, found in this frame (no call of _values: the engine asks ~25 times a step).
    entry = _ENTRIES.get(id(obj))
    if entry is not None and entry[0]() is obj:
        values = entry[1]
        value = values.get(name, _NONE)
        if value is not _NONE:
            return value  # type: ignore[no-any-return]
    else:
        values = _values(obj)
    value = values[name] = compute()
    return value


_NONE = object()  # no value derived yet (a derived value may be None)


def known(obj: Any, name: str) -> Any:
    """The value derived for ``(obj, name)`` so far, or None when none was (nothing is computed)."""
    entry = _ENTRIES.get(id(obj))
    if entry is None or entry[0]() is not obj:
        return None
    return entry[1].get(name)


def remember(obj: Any, name: str, value: Any) -> None:
    """Make ``value`` what ``(obj, name)`` derives from now on (the caller vouches that it is what
    the name derives: a value built up in steps, like a growing report's rendered records)."""
    _values(obj)[name] = value


def _values(obj: Any) -> dict[str, Any]:
    key = id(obj)
    entry = _ENTRIES.get(key)
    if entry is None or entry[0]() is not obj:
        def forget(dead: weakref.ref[Any], key: int = key) -> None:
            _forget(key, dead)

        ref = weakref.ref(obj, forget)
        entry = (ref, {})
        _ENTRIES[key] = entry
    return entry[1]


def _forget(key: int, dead: weakref.ref[Any]) -> None:
    entry = _ENTRIES.get(key)
    if entry is not None and entry[0] is dead:
        del _ENTRIES[key]

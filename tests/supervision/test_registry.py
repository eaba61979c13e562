"""Registry: the path map and its per-parent index stay consistent."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from castor.supervision.registry import Registry

pytestmark = pytest.mark.timeout(10)


def _h(path: str) -> SimpleNamespace:
    return SimpleNamespace(path=path)


def test_children_are_the_direct_ones_in_path_order_and_follow_unregister():
    reg = Registry()
    a, ab, ac, abd, x = (_h(p) for p in ("/r/a", "/r/a/b", "/r/a/c", "/r/a/b/d", "/r/x"))
    for handle in (ac, abd, x, a, ab):
        reg.register(handle)
    assert reg.children("/r/a") == [ab, ac] and reg.children("/r/a/") == [ab, ac]
    assert reg.children("/r") == [a, x] and reg.children("/r/a/b") == [abd] and reg.children("/none") == []
    stale = _h("/r/a/b")
    reg.unregister(stale)  # not the registered handle: nothing changes
    assert reg.children("/r/a") == [ab, ac]
    reg.unregister(ab)
    assert reg.children("/r/a") == [ac] and reg.find("/r/a/b") is None
    newer = _h("/r/a/c")
    reg.register(newer)  # same path, a new handle: replaces the old one in both maps
    assert reg.children("/r/a") == [newer] and reg.lookup("/r/a/c") is newer
    reg.unregister(newer)
    assert reg.children("/r/a") == [] and [h.path for h in reg.handles("/r")] == ["/r/a", "/r/a/b/d", "/r/x"]

"""The one path rule, pure part (castor.domain.paths) and its disk part (castor.adapters.fs.confine)."""

from __future__ import annotations

import os

import pytest

from castor.adapters.fs import ConfinedRoot, confine, safe_join
from castor.domain import paths
from castor.messages.errors import Forbidden


@pytest.mark.parametrize("value, reason", [
    ("", paths.REASON_EMPTY), ("a\x00b", paths.REASON_NUL), ("/etc/passwd", paths.REASON_ABSOLUTE),
    ("..", paths.REASON_PARENT), ("../x", paths.REASON_PARENT), ("a/../b", paths.REASON_PARENT),
    ("a/..", paths.REASON_PARENT), (b"bytes", paths.REASON_NOT_TEXT), (None, paths.REASON_NOT_TEXT),
])
def test_refusals_are_decided_without_the_disk(value, reason):
    assert paths.refusal(value) == reason
    assert paths.lexical_target("/root", value) == (None, reason)


@pytest.mark.parametrize("value, target", [
    ("a", "/r/a"), ("./a//b/.", "/r/a/b"), (".", "/r"), ("a/...", "/r/a/..."), ("..a/b..", "/r/..a/b.."),
])
def test_acceptable_relative_values_are_joined_and_normalised(value, target):
    assert paths.lexical_target("/r", value) == (target, None)


def test_absolute_values_only_inside_the_root_and_only_when_allowed():
    assert paths.lexical_target("/r", "/r/x", allow_absolute=True) == ("/r/x", None)
    assert paths.lexical_target("/r", "/r", allow_absolute=True) == ("/r", None)
    assert paths.lexical_target("/r", "//r/x", allow_absolute=True) == ("/r/x", None)
    assert paths.lexical_target("/r", "/rx/y", allow_absolute=True) == (None, paths.REASON_OUTSIDE)
    assert paths.lexical_target("/r", "/etc", allow_absolute=True) == (None, paths.REASON_OUTSIDE)
    assert paths.lexical_target("/r", "/r/../etc", allow_absolute=True) == (None, paths.REASON_PARENT)
    assert paths.inside("/", "/anything") and not paths.inside("/r", "/rr")


def test_confine_resolves_symlinks_and_refuses_the_ones_that_leave(tmp_path):
    root = tmp_path / "root"
    (root / "d").mkdir(parents=True)
    outside = tmp_path / "outside"
    outside.mkdir()
    (root / "out").symlink_to(outside)
    (root / "in").symlink_to(root / "d")
    assert confine(root, "in/x") == (root / "d" / "x").resolve()
    assert confine(root, str(root / "d"), allow_absolute=True) == (root / "d").resolve()
    for value in ("out", "out/x", "out/../root/d"):
        with pytest.raises(Forbidden) as refused:
            confine(root, value)
        assert refused.value.data["reason"] in paths.CONFINEMENT_REASONS
    with pytest.raises(Forbidden) as refused:
        confine(root, str(root / "d"))  # absolute without allow_absolute
    assert refused.value.data["reason"] == paths.REASON_ABSOLUTE
    # A root reached through a symlink: an absolute value spelled either way is inside.
    alias = tmp_path / "alias"
    alias.symlink_to(root)
    assert confine(alias, str(alias / "d"), allow_absolute=True) == (root / "d").resolve()
    assert confine(alias, str(root / "d"), allow_absolute=True) == (root / "d").resolve()


def test_every_joiner_gives_the_same_refusals(tmp_path):
    """safe_join, ConfinedRoot and confine share the rule: same reason for the same value."""
    root = tmp_path / "root"
    root.mkdir()
    (root / "out").symlink_to(tmp_path)
    confined = ConfinedRoot(root)
    for value in ("", "a\x00", "/abs", "..", "a/../b", "out/x"):
        reasons = set()
        for join in (lambda v: safe_join(root, v), confined.join_text, lambda v: confine(root, v)):
            with pytest.raises(Forbidden) as refused:
                join(value)
            reasons.add(refused.value.data["reason"])
        assert len(reasons) == 1, (value, reasons)
    assert os.listdir(root) == ["out"]

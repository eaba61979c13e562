"""The short item label (``itemLabelShort``) events, manifest entries and the footer carry:
pi-materia's rule -- whitespace runs collapsed, trimmed, at most 80 characters (UTF-16 code units,
as JavaScript counts them) with the last one an ellipsis when cut, and absent when nothing is left."""

from __future__ import annotations

import pytest

from castor.domain.materia.state import short_label

from .scripted import Driver, config, resolved

pytestmark = pytest.mark.timeout(10)


def test_a_long_label_is_cut_to_80_characters_ending_in_an_ellipsis() -> None:
    assert short_label("x" * 80) == "x" * 80
    cut = short_label("y" * 81)
    assert cut == "y" * 79 + "…" and len(cut) == 80
    assert short_label("  a \n\t b  ") == "a b"


def test_a_blank_label_has_no_short_form() -> None:
    assert short_label("") is None
    assert short_label(" \n\t ") is None
    assert short_label(None) is None


def test_the_80_character_bound_counts_utf16_code_units_as_javascript_does() -> None:
    # an emoji is two UTF-16 code units: 40 of them are 80 units, 41 are 82
    assert short_label("😀" * 40) == "😀" * 40
    assert short_label("😀" * 41) == "😀" * 39 + "\ufffd…"  # a pair cut in half leaves a lone surrogate: U+FFFD
    assert short_label("a" + "😀" * 40) == "a" + "😀" * 39 + "…"


def test_javascript_whitespace_is_collapsed_and_nothing_else() -> None:
    assert short_label("\ufeffa\u00a0\u2028b\ufeff") == "a b"  # BOM and NBSP are whitespace to JavaScript
    assert short_label("a\x1cb\x85c") == "a\x1cb\x85c"  # Python's isspace() takes these; JavaScript's \\s does not


def test_a_loop_items_event_fields_carry_the_short_label() -> None:
    long_title = "A very descriptive item label " * 4
    cfg = resolved(config({"Socket-1": {"type": "agent", "materia": "A",
                                        "foreach": {"items": "state.items", "as": "it", "cursor": "c"}}}))
    d = Driver(cfg, data={"items": [{"id": "one", "title": long_title}, {"id": "two", "title": "   "}]})
    start = d.events("socket_start")[0].data
    assert start["itemLabel"] == long_title and len(start["itemLabelShort"]) == 80
    assert start["itemLabelShort"].endswith("…")


def test_an_item_with_an_empty_id_names_its_artifacts_without_an_item_part() -> None:
    """pi-materia adds ``-<item key>`` to artifact names only for a non-empty key: an item whose id
    is "" writes ``sockets/<socket>/<visit>.md`` (not ``<visit>-task.md``)."""
    cfg = resolved(config({"Socket-1": {"type": "agent", "materia": "A",
                                        "foreach": {"items": "state.items", "as": "it", "cursor": "c"}}}))
    d = Driver(cfg, data={"items": [{"id": "", "title": "untitled"}]})
    d.reply("done")
    names = set(d.artifacts())
    assert "sockets/Socket-1/1.md" in names and not any("task" in name for name in names), names
    assert any(name.startswith("contexts/Socket-1-1") for name in names), names


def test_an_item_with_an_empty_id_is_not_a_task_in_the_usage_report() -> None:
    """pi-materia counts a turn in ``byTask``/``byAttempt`` only under a non-empty item key."""
    cfg = resolved(config({"Socket-1": {"type": "agent", "materia": "A",
                                        "foreach": {"items": "state.items", "as": "it", "cursor": "c"}}}))
    d = Driver(cfg, data={"items": [{"id": "", "title": "untitled"}]})
    d.reply("done", usage={"input": 2, "output": 1, "totalTokens": 3, "cost": {"total": 0.5}})
    usage = d.state.usage
    assert usage.tokens.total == 3 and usage.bySocket["Socket-1"].tokens.total == 3
    assert usage.byTask == {} and usage.byAttempt == {}
    assert usage.turns[0].taskId == ""  # the turn itself still names its (empty) item key

"""An expression castor's dotted paths cannot read -- JSONPath written where a path is read -- is
a load-time ``unreadable-expression`` warning naming the field and the dotted path meant; the
config still loads and runs as pi-materia runs it (the expression reads nothing)."""

from __future__ import annotations

from typing import Any

import pytest

from castor.domain.materia.expressions import MISSING, Scope, resolve_value, unreadable_path
from castor.domain.materia.handoff import apply_assign
from castor.domain.materia.resolve import load_config, resolve_config


def _cfg(socket: dict[str, Any], **loadout: Any) -> dict[str, Any]:
    return {"activeLoadout": "L", "materia": {"A": {"prompt": "p", "tools": "none"}},
            "loadouts": {"L": {"entry": "Socket-1", "sockets": {"Socket-1": {
                "type": "agent", "materia": "A", "parse": "json", "edges": [{"to": "end"}], **socket}}, **loadout}}}


@pytest.mark.parametrize(("expr", "meant"), [
    ("$['x']", "$.x"), ('$["a"]["b"]', "$.a.b"), ("$.items[0].name", "$.items.0.name"),
    ("state.items[2]", "state.items.2"), ("$[0]", "$.0"), ("$foo", "$.foo"),
    ("$..x", None), ("$.items[*]", None), ("$.items.*", None), ("$.a[?(@.ok)]", None), ("$.a.", None),
    ("$['a.b']", None),
])
def test_jsonpath_reads_nothing_and_is_named_with_the_dotted_path_meant(expr: str, meant: str | None) -> None:
    scope = Scope(data={"items": [1, 2, 3]}, parsed={"x": 1, "a": {"b": 2, "ok": True}, "items": [{"name": "n"}],
                                                     "foo": 3, "0": 4, "a.b": 5})
    assert resolve_value(expr, scope) is MISSING  # as pi-materia reads it: nothing, every run
    found = unreadable_path(expr)
    assert found is not None and found[1] == meant
    if meant is not None:
        assert resolve_value(meant, scope) is not MISSING  # the advice reads what was meant


@pytest.mark.parametrize("expr", ["$", "$.foo.bar", "$.items.0", "state", "state.a.b", "item.x", "lastJson.x",
                                  "lastOutput", "workItems", " $.x "])
def test_a_dotted_path_is_no_warning(expr: str) -> None:
    assert unreadable_path(expr) is None


def test_a_jsonpath_assign_source_loads_with_a_warning_naming_the_field_and_the_syntax() -> None:
    cfg = _cfg({"assign": {"x": "$['x']", "ok": "$.x", "deep": "$..x"},
                "foreach": {"items": "$.list[*]", "as": "it"}})
    rc = resolve_config(load_config([("t.json", cfg)]))
    found = sorted((w.code, w.path) for w in rc.warnings)
    assert found == [("unreadable-expression", "/loadouts/L/sockets/Socket-1/assign/deep"),
                     ("unreadable-expression", "/loadouts/L/sockets/Socket-1/assign/x"),
                     ("unreadable-expression", "/loadouts/L/sockets/Socket-1/foreach/items")]
    (bracket,) = [w for w in rc.warnings if w.path.endswith("/assign/x")]
    assert bracket.severity == "warning" and bracket.source == "t.json"
    assert 'Socket-1.assign["x"]' in bracket.message and 'Write "$.x".' in bracket.message
    assert '"$.a.b"' in bracket.message  # castor's syntax, spelt out
    assert rc.pipeline.sockets["Socket-1"].socket.assign["x"] == "$['x']"  # loaded unchanged


def test_a_loop_iterator_items_in_jsonpath_is_named_at_the_loop() -> None:
    cfg = _cfg({}, loops={"w": {"sockets": ["Socket-1"], "iterator": {"items": "state.tasks[*]", "as": "t"}}})
    rc = resolve_config(load_config([("t.json", cfg)]))
    assert [(w.code, w.path) for w in rc.warnings] == [
        ("unreadable-expression", "/loadouts/L/loops/w/iterator/items")]


@pytest.mark.parametrize(("target", "key", "meant"), [
    ("$.result", "$", "result"), ("state.plan", "state", "plan"), ("lastJson.a", "lastJson", "a"),
    ("$['r']", "$['r']", "r"), ("items['a']", "items['a']", "items.a"), ("items[0]", "items[0]", "items.0"),
])
def test_an_assign_target_written_as_an_expression_is_named_with_the_key_it_writes(
        target: str, key: str, meant: str | None) -> None:
    """``"$.result": "$.x"`` wrote ``data["$"]["result"]``, which ``$.result`` (the output) never
    reads; ``"state.plan"`` wrote ``data.state.plan``, which ``state.plan`` (``data.plan``) never reads."""
    rc = resolve_config(load_config([("t.json", _cfg({"assign": {target: "$.x", "fine": "$.x"}}))]))
    (found,) = rc.warnings
    assert (found.code, found.path) == ("expression-as-assign-target",
                                        "/loadouts/L/sockets/Socket-1/assign/" + target)
    assert f'writes the key "{key}"' in found.message
    assert (f'Write "{meant}"' in found.message) if meant else "Write" not in found.message
    data = apply_assign({}, {target: "$.x"}, Scope(data={}, parsed={"x": 1}))
    assert data == {key: 1} or list(data) == [key]  # the key the message names
    if "[" not in target:  # the expression it looks like reads elsewhere (a bracketed key reads as written)
        assert resolve_value(target, Scope(data=data, parsed={"y": 2})) is MISSING
    if meant is not None:
        assert resolve_value("state." + meant, Scope(data=apply_assign({}, {meant: "$.x"},
                                                                       Scope(data={}, parsed={"x": 1})))) == 1


@pytest.mark.parametrize("target", ["result", "a.b", "item.x", "workItems", "$result"])
def test_a_plain_dotted_target_is_no_warning(target: str) -> None:
    assert not resolve_config(load_config([("t.json", _cfg({"assign": {target: "$.x"}}))])).warnings


def test_an_empty_expression_reads_nothing_as_pi_materia_reads_it_and_is_named() -> None:
    """``assign: {"x": ""}`` read the whole of the cast's data (pi-materia's ``getPath(data, "")``
    reads the key ``""``: nothing), so each visit nested a copy of all the data in itself: doubled."""
    data = apply_assign({"a": 1}, {"x": "", "y": "  "}, Scope(data={"a": 1}, parsed={"p": 1}))
    assert data == {"a": 1}
    cfg = _cfg({"assign": {"x": ""}, "foreach": {"items": "", "as": "it"}})
    rc = resolve_config(load_config([("t.json", cfg)]))
    assert sorted((w.code, w.path) for w in rc.warnings) == [
        ("unreadable-expression", "/loadouts/L/sockets/Socket-1/assign/x"),
        ("unreadable-expression", "/loadouts/L/sockets/Socket-1/foreach/items")]

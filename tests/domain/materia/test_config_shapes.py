"""A loadout, its ``sockets``, a socket, its ``edges`` or an edge of the wrong JSON shape.

pi-materia names graph codes for problems *inside* the right shapes (a missing ``to`` is
``missing-endpoint``, a loop's ``sockets`` that is not a non-empty array or its ``exits`` that is
not an array is ``invalid-loop``), and nothing for a loadout that is a string. castor reported a
loadout that is not an object as ``invalid-loop``, a socket that is not an object as
``invalid-socket-id``, ``edges`` that is not an array as ``invalid-edge-condition`` and an edge that
is not an object as ``missing-endpoint``: codes and messages that point the user at a problem the
config does not have. Each is now named for what it is (``not-an-object`` for a loadout or its
``sockets`` map, ``invalid-socket`` for a socket or its edges), with the JSON kind it found and the
JSON pointer of the value; the codes the spec names stay.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from castor.adapters.materia.config_loader import validate_file

UTILITY = {"type": "utility", "utility": "noop"}


def _errors(tmp_path: Path, config: dict[str, object]) -> list[tuple[str, str, str]]:
    path = tmp_path / "c.json"
    path.write_text(json.dumps(config))
    return [(i.code, i.path, i.message) for i in validate_file(path) if not i.is_warning]


def _one_loadout(loadout: object) -> dict[str, object]:
    return {"activeLoadout": "hello", "loadouts": {"L": loadout}}


@pytest.mark.timeout(30)
@pytest.mark.parametrize(("value", "kind"), [("x", "a string"), (["x"], "an array"), (3, "a number")])
def test_a_loadout_that_is_not_an_object(tmp_path: Path, value: object, kind: str) -> None:
    [(code, path, message)] = _errors(tmp_path, _one_loadout(value))
    assert (code, path) == ("not-an-object", "/loadouts/L")
    assert 'loadout "L" must be an object' in message and f"not {kind}" in message


@pytest.mark.timeout(30)
def test_a_null_loadout_deletes_it_as_in_pi_materia(tmp_path: Path) -> None:
    assert _errors(tmp_path, _one_loadout(None)) == []


@pytest.mark.timeout(30)
@pytest.mark.parametrize(("value", "kind"), [("x", "a string"), (["Socket-1"], "an array"), ([], "an array")])
def test_sockets_that_are_not_an_object(tmp_path: Path, value: object, kind: str) -> None:
    [(code, path, message)] = _errors(tmp_path, _one_loadout({"sockets": value}))
    assert (code, path) == ("not-an-object", "/loadouts/L/sockets")
    assert '"sockets" must be an object' in message and f"not {kind}" in message


@pytest.mark.timeout(30)
def test_absent_or_empty_sockets_stay_a_missing_endpoint(tmp_path: Path) -> None:
    for loadout in ({"entry": "Socket-1"}, {"sockets": {}}):
        errors = _errors(tmp_path, _one_loadout(loadout))
        assert [e[:2] for e in errors] == [("missing-endpoint", "/loadouts/L/sockets")]


@pytest.mark.timeout(30)
@pytest.mark.parametrize(("value", "kind"), [("x", "a string"), (["a"], "an array"), (None, "null")])
def test_a_socket_that_is_not_an_object(tmp_path: Path, value: object, kind: str) -> None:
    [(code, path, message)] = _errors(tmp_path, _one_loadout({"sockets": {"Socket-1": value}}))
    assert (code, path) == ("invalid-socket", "/loadouts/L/sockets/Socket-1")
    assert "Socket-1 must be an object" in message and f"not {kind}" in message
    assert "socket id" not in message


@pytest.mark.timeout(30)
@pytest.mark.parametrize(("value", "kind"), [("Socket-1", "a string"), ({"to": "end"}, "an object"), (1, "a number")])
def test_edges_that_are_not_an_array(tmp_path: Path, value: object, kind: str) -> None:
    [(code, path, message)] = _errors(tmp_path, _one_loadout({"sockets": {"Socket-1": {**UTILITY, "edges": value}}}))
    assert (code, path) == ("invalid-socket", "/loadouts/L/sockets/Socket-1/edges")
    assert "Socket-1.edges must be an array" in message and f"not {kind}" in message
    assert "condition" not in message


@pytest.mark.timeout(30)
@pytest.mark.parametrize(("value", "kind"), [("Socket-1", "a string"), (None, "null"), (["end"], "an array")])
def test_an_edge_that_is_not_an_object(tmp_path: Path, value: object, kind: str) -> None:
    [(code, path, message)] = _errors(tmp_path, _one_loadout({"sockets": {"Socket-1": {**UTILITY, "edges": [value]}}}))
    assert (code, path) == ("invalid-socket", "/loadouts/L/sockets/Socket-1/edges/0")
    assert "Socket-1.edges[0] must be an object" in message and f"not {kind}" in message


@pytest.mark.timeout(30)
def test_the_codes_pi_materia_names_stay(tmp_path: Path) -> None:
    """An edge object without ``to`` is ``missing-endpoint`` at its ``to``; a loop's ``sockets``
    that is a string and ``exits`` that is an object are ``invalid-loop``."""
    sockets = {"Socket-1": {**UTILITY, "edges": [{"when": "always"}]}}
    assert [e[:2] for e in _errors(tmp_path, _one_loadout({"sockets": sockets}))] == [
        ("missing-endpoint", "/loadouts/L/sockets/Socket-1/edges/0/to")]
    sockets = {"Socket-1": dict(UTILITY)}
    loops = {"a": {"sockets": "Socket-1"}, "b": {"sockets": ["Socket-1"], "exits": {"id": "x"}}}
    assert sorted(e[:2] for e in _errors(tmp_path, _one_loadout({"sockets": sockets, "loops": loops}))) == [
        ("invalid-loop", "/loadouts/L/loops/a/sockets"), ("invalid-loop", "/loadouts/L/loops/b/exits")]


@pytest.mark.timeout(30)
@pytest.mark.parametrize(("value", "kind"), [("x", "a string"), ([], "an array")])
def test_loadouts_that_are_not_an_object(tmp_path: Path, value: object, kind: str) -> None:
    [(code, path, message)] = _errors(tmp_path, {"loadouts": value})
    assert (code, path) == ("not-an-object", "/loadouts")
    assert '"loadouts" must be an object' in message and f"not {kind}" in message


@pytest.mark.timeout(30)
@pytest.mark.parametrize(("config", "code", "path", "said"), [
    ({"materia": "x"}, "invalid-materia", "/materia", "mapping names to materia, not a string"),
    ({"materia": {"M": ["p"]}}, "invalid-materia", "/materia/M", 'materia "M" must be an object, not an array'),
    ({"budget": 5}, "invalid-budget", "/budget", "budget must be an object, not a number"),
    ({"limits": []}, "invalid-limits", "/limits", "limits must be an object, not an array"),
    ({"compaction": True}, "invalid-compaction", "/compaction", "compaction must be an object, not a boolean"),
    ({"compaction": {"proactiveThresholdTiers": ["x"]}}, "invalid-compaction", "/compaction/proactiveThresholdTiers/0",
     "each tier must be an object, not a string"),
])
def test_the_other_objects_say_what_they_found(tmp_path: Path, config: dict[str, object], code: str, path: str,
                                               said: str) -> None:
    [(found_code, found_path, message)] = _errors(tmp_path, config)
    assert (found_code, found_path) == (code, path) and said in message

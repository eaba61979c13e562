"""castor.domain.materia.memo (derived values live exactly as long as their object) and castor.domain.jsontext."""

from __future__ import annotations

import gc
import json

from castor.domain.materia import memo


class Box:
    pass


def test_computed_once_per_object_and_forgotten_with_it() -> None:
    calls = []
    a, b = Box(), Box()
    assert memo.derived(a, "x", lambda: calls.append("a") or 1) == 1
    assert memo.derived(a, "x", lambda: calls.append("a2") or 2) == 1
    assert memo.derived(b, "x", lambda: calls.append("b") or 3) == 3
    assert memo.derived(a, "y", lambda: calls.append("ay") or 4) == 4
    assert calls == ["a", "b", "ay"]
    key = id(a)
    del a
    gc.collect()
    assert key not in memo._ENTRIES
    c = Box()  # may reuse the id: never inherits a value
    assert memo.derived(c, "x", lambda: 5) == 5


def test_pretty_json_is_exactly_the_indented_encoder() -> None:
    import json

    from castor.domain.jsontext import pretty_json

    for value in [None, {}, [], "x\n\"é", 0, -1.5, True, False, float("inf"), {"a": [1, {"b": None}]}, [[]], ["é"]]:
        assert pretty_json(value) == json.dumps(value, indent=2, ensure_ascii=False)


def test_well_formed_replaces_lone_surrogates_everywhere_and_keeps_clean_values() -> None:
    from castor.domain.jsontext import well_formed

    clean = {"a": ["x", {"b": "\U0001f642"}], "n": 1}
    assert well_formed(clean) is clean  # nothing to fix: the very same object, no copy
    dirty = {"k\udcff": ["ok", {"b": "x\ud800y"}], "n": 1, "t": ("\udfff",)}
    fixed = well_formed(dirty)
    assert fixed == {"k\ufffd": ["ok", {"b": "x\ufffdy"}], "n": 1, "t": ("\ufffd",)}
    fixed_text = json.dumps(fixed, ensure_ascii=False)
    assert fixed_text.encode("utf-8")  # UTF-8 can write it now
    assert dirty["k\udcff"][1]["b"] == "x\ud800y"  # the input is not changed in place
    flat_clean = {"a": "plain", "n": 2, "none": None, "u": "é"}
    assert well_formed(flat_clean) is flat_clean
    late = {"a": "plain", "n": 2, "u": "é", "bad": "x\ud800", "z": 0.5}
    assert list(well_formed(late).items()) == [("a", "plain"), ("n", 2), ("u", "é"), ("bad", "x\ufffd"), ("z", 0.5)]

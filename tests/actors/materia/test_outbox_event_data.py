"""An event's data is encoded once per transition: its outbox entry is made from the data's text
as ``events.jsonl`` writes it (json's compact text), and that text is handed to its line."""

from __future__ import annotations

import datetime
import json
from types import SimpleNamespace
from typing import Any

import pytest

from castor.actors.materia.cast_actor import CastActor, _outbox_json
from castor.adapters.fs import compact_json
from castor.adapters.materia import artifacts
from castor.adapters.materia.artifacts import CastArtifacts, _event_lines
from castor.domain.materia.cast_messages import EFFECT_ADAPTER, EmitEvent

pytestmark = pytest.mark.timeout(60)

_SERIALIZER = EmitEvent.__pydantic_serializer__
NO_FLOAT = [{}, {"socket": "Socket-1", "visit": 3, "parsed": False, "materiaModel": {"source": "active", "label": "x"}},
            {"text": "é \u2028 \x1f \x7f \" \\ / \n\t", "n": -(10 ** 30), "none": None,
             "list": [1, "a", [True, None], {"k": "v"}]}]
FLOATS = [{"f": 1e-05, "g": 1e20, "h": 0.1, "list": [{"k": 2.5}]}, {"cost": 0.00001234}]


@pytest.mark.parametrize("data", NO_FLOAT + FLOATS)
def test_an_event_entry_is_made_from_its_lines_data_text_and_loads_as_the_same_effect(data: dict[str, Any]) -> None:
    effect = EmitEvent(type="socket_complete \u00e9\"", data=data, ts_ms=1796623433006)
    kept: dict[int, Any] = {}
    entry = _outbox_json(effect, None, kept)
    assert kept[id(effect)] == (effect, compact_json(data))
    assert EFFECT_ADAPTER.validate_python(json.loads(entry)) == effect
    if data in NO_FLOAT:  # the serialiser's own bytes, where json and pydantic agree
        assert entry == _SERIALIZER.to_json(effect)
    else:  # a float as json writes it (repr), the event line's text
        assert f'"data":{compact_json(data)}'.encode() in entry


@pytest.mark.parametrize("data", [{"x": float("nan")}, {"when": datetime.datetime(2026, 12, 7)}, {"s": "\ud800"}])
def test_data_json_cannot_write_is_left_to_the_serialiser_as_before(data: dict[str, Any]) -> None:
    effect = EmitEvent.model_construct(type="e", data=data, ts_ms=1)
    kept: dict[int, Any] = {}
    try:
        before: bytes | None = _SERIALIZER.to_json(effect)
    except ValueError:
        before = None
    if before is None:
        with pytest.raises(ValueError):
            _outbox_json(effect, None, kept)
    else:
        assert _outbox_json(effect, None, kept) == before
    assert kept == {}


def test_a_transitions_event_lines_use_the_data_text_its_outbox_made(tmp_path, monkeypatch) -> None:
    """The encode and the files of one transition: each event's data goes through the encoder once."""
    effects = [EmitEvent(type="socket_start", data={"socket": "S", "visit": 1, "f": 1e-05}, ts_ms=5),
               EmitEvent(type="cast_end", data={"ok": True}, ts_ms=6)]
    recorded: list[Any] = []
    cast = SimpleNamespace(_dirs_made=True, _event_data_json={},
                           artifacts=SimpleNamespace(write_transition=lambda *a, **k: recorded.append((a, k))))
    entries = {id(e): _outbox_json(e, None, cast._event_data_json) for e in effects}  # what _encode keeps
    assert len(entries) == 2
    CastActor._perform_files(cast, effects)  # type: ignore[arg-type]
    (_, _, events), kwargs = recorded[0]
    assert kwargs["data_json"] == [compact_json(e.data) for e in effects]
    assert cast._event_data_json == {}  # handed on once, not kept
    # the adapter writes the given text, encoding nothing again; the lines are what it wrote before
    run = CastArtifacts(tmp_path, "20261207-000000-aaaa").create()
    expected = _event_lines(events)
    monkeypatch.setattr(artifacts, "compact_json", lambda value: pytest.fail("data encoded again"))
    run.write_transition({}, [], events, data_json=kwargs["data_json"])
    assert (run.run_dir / "events.jsonl").read_text(encoding="utf-8").split("\n")[:-1] == expected

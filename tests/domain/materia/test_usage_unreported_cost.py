"""What a turn recorded as reporting no usage (``unreported``) costs a cast, and what the usage
warnings say.

A turn whose agent sent no usage counts nothing: its figures are the shared :data:`NO_AMOUNTS`, it
adds nothing new to the report's totals and tables, and concurrent casts' turns at the same socket
hold one record (:func:`turn_record`) -- the record still says everything it said (where the turn
ran, ``unreported: ["tokens"]``), usage.json is byte for byte what pydantic writes, and the user
is warned once, naming the agent that answered. The unreadable-figures warning says what is wrong
with each figure (negative, not finite, not a number), and a token count that is not a whole
number is said to be one."""

from __future__ import annotations

import gc
from typing import Any

import pytest

from castor.domain.materia.budget import (
    NO_AMOUNTS,
    NO_USAGE,
    UsageReport,
    extract_usage,
    unreadable_figures,
    usage_file_text,
    usage_state_json,
)
from castor.domain.materia.cast_messages import Notify, TurnEnded
from castor.domain.materia.engine import _unreadable_warning
from castor.domain.materia.memo import known

from .scripted import Driver, config, resolved

pytestmark = pytest.mark.timeout(30)

SOCKETS = ("Socket-1", "Socket-2", "Socket-3")


def _chain(names: tuple[str, ...] = SOCKETS, **top: Any) -> Driver:
    sockets = {name: {"type": "agent", "materia": "A",
                      **({"edges": [{"when": "always", "to": names[i + 1]}]} if i + 1 < len(names) else {})}
               for i, name in enumerate(names)}
    return Driver(resolved(config(sockets, **top)))


def _answer(d: Driver, usage: dict[str, Any] | None, agent: str | None = "scripted agent (answers.json)") -> None:
    d.send(TurnEnded, visit_id=d.pending().visit_id, text="done", stop_reason="stop", usage=usage, agent=agent)


def _notices(d: Driver, level: str) -> list[str]:
    return [e.message for e in d.effects if isinstance(e, Notify) and e.level == level]


def test_a_usage_that_counts_nothing_is_the_one_shared_usage() -> None:
    assert extract_usage({}) is NO_USAGE and extract_usage(None) is NO_USAGE
    assert extract_usage({"input": 0, "output": None}) is NO_USAGE
    assert NO_USAGE.tokens is NO_AMOUNTS and NO_USAGE.cost is NO_AMOUNTS
    counted = extract_usage({"input": 3})
    assert counted is not NO_USAGE and counted.tokens.input == 3
    # a float zero or a fraction is a figure of its own, never the shared ints
    assert extract_usage({"input": 0.5}).tokens.input == 0.5


def test_concurrent_casts_unreported_turns_at_one_socket_share_one_record_that_says_it_all() -> None:
    casts = [_chain() for _ in range(3)]
    for d in casts:
        for _ in SOCKETS:
            _answer(d, {})
    reports = [d.state.usage for d in casts]
    for n, socket in enumerate(SOCKETS):
        records = {id(report.turns[n]) for report in reports}
        assert len(records) == 1, f"{socket}: one record for every cast's turn there"
        record = reports[0].turns[n]
        assert record.socket == socket and record.unreported == ["tokens"] and record.materia == "A"
        assert record.tokens is NO_AMOUNTS and record.cost is NO_AMOUNTS
    # what is written is what pydantic writes of the report, shared records or not
    for report in reports:
        assert usage_file_text(report) == report.model_dump_json(indent=2, exclude_none=True)
        assert usage_state_json(report) == report.__pydantic_serializer__.to_json(report)
        assert "tokens" in report.model_dump()["turns"][0]["unreported"]
    # a different attempt, task or socket is a record of its own
    assert len({id(t) for t in reports[0].turns}) == len(SOCKETS)


def test_a_turn_that_counted_nothing_adds_nothing_new_to_the_report() -> None:
    d = _chain()
    _answer(d, {})
    before = d.state.usage
    _answer(d, {})
    after = d.state.usage
    # Socket-2 is new in bySocket; byMateria already had "A": the same entry, the same table
    assert after.byMateria is before.byMateria and after.byMateria["A"] is NO_USAGE
    assert after.tokens is before.tokens and after.cost is before.cost
    assert after.bySocket["Socket-2"] is NO_USAGE and after.bySocket is not before.bySocket


def test_a_report_keeps_no_whole_text_nor_a_second_copy_of_its_turns() -> None:
    d = _chain()
    for _ in SOCKETS:
        _answer(d, {"input": 5, "output": 1})  # reported turns: records of their own
    report = d.state.usage
    text = usage_file_text(report)
    usage_state_json(report)
    gc.collect()
    assert known(report, "json") is None and known(report, "state_json") is None
    kept = known(report, "usage_list_texts") or {}
    assert not [key for key in kept if key[0] == "turns"], kept
    # each record's own text is kept with the record, once
    assert all(known(turn, "indented") is not None for turn in report.turns)
    assert text == report.model_dump_json(indent=2, exclude_none=True)


def test_a_transition_renders_usage_json_once_and_writes_it_once() -> None:
    d = _chain()
    tr = d.send(TurnEnded, visit_id=d.pending().visit_id, text="done", stop_reason="stop", usage={})
    writes = [e for e in tr.effects if getattr(e, "path", None) == ("usage.json",)]
    # (written before the step adds the next visit's model selection, as every transition does)
    assert len(writes) == 1 and '"unreported": [\n        "tokens"\n      ]' in writes[0].content, writes


def test_the_no_usage_warning_names_the_agent_that_answered_and_is_said_once() -> None:
    d = _chain(budget={"maxTokens": 1000})
    for _ in SOCKETS:
        _answer(d, {})
    (said,) = [m for m in _notices(d, "warning") if "reported no token counts" in m]
    assert "the answer of the scripted agent (answers.json) carried no usage" in said, said
    assert "harness" not in said, said
    assert [t.unreported for t in d.state.usage.turns] == [["tokens"]] * len(SOCKETS)
    assert len(d.events("usage_unreported")) == len(SOCKETS)
    d2 = _chain(budget={"maxTokens": 1000})
    _answer(d2, {}, agent=None)
    (said,) = [m for m in _notices(d2, "warning") if "reported no token counts" in m]
    assert "(its answer carried no usage castor reads)" in said, said


@pytest.mark.parametrize(("usage", "wrong", "not_said"), [
    ({"input": -5, "output": 1}, "are negative (input=-5)", "not numbers"),
    ({"input": float("nan"), "output": 1}, "are not finite (input=NaN)", "not numbers"),
    ({"input": "Infinity", "output": 1}, 'are not finite (input="Infinity")', "not numbers"),
    ({"input": "12", "output": 1}, 'are not numbers (input="12")', "negative"),
    ({"input": -1, "output": "x"}, 'are negative (input=-1) and not numbers (output="x")', "not finite"),
])
def test_the_unreadable_warning_says_what_is_wrong_with_each_figure(usage: dict[str, Any], wrong: str,
                                                                     not_said: str) -> None:
    said = _unreadable_warning("Socket-1", unreadable_figures(usage))
    assert f"has figures that {wrong}; they count as not reported" in said, said
    assert not_said not in said, said


def test_a_token_count_that_is_not_whole_is_said_to_be_so() -> None:
    d = _chain(budget={"maxCostUsd": 5})
    _answer(d, {"input": 12.5})
    (said,) = [m for m in _notices(d, "info") if "at no reported cost" in m]
    assert "used 12.5 tokens (not a whole number: the count as reported) at no reported cost" in said, said
    d2 = _chain(budget={"maxCostUsd": 5})
    _answer(d2, {"input": 12})
    (said,) = [m for m in _notices(d2, "info") if "at no reported cost" in m]
    assert "used 12 tokens at no reported cost" in said, said


def test_the_shared_records_kept_after_their_casts_are_bounded() -> None:
    from castor.domain.materia import budget

    names = ("Socket-9071", "Socket-9072")
    d = _chain(names)
    _answer(d, {})
    assert [r.socket for r in list(budget._COUNTED_NOTHING.values()) if r.socket in names] == ["Socket-9071"]
    kept = d.state.usage.turns[0]
    del d
    gc.collect()
    # the latest are kept for the casts that follow (their texts rendered), never more than the bound
    assert budget._RECENT.maxlen == budget.RECENT_RECORDS_KEPT and kept in budget._RECENT
    for n in range(budget.RECENT_RECORDS_KEPT):
        budget.turn_record({"socket": f"Socket-{10_000 + n}", "attempt": 1, "tokens": NO_AMOUNTS,
                            "cost": NO_AMOUNTS, "costKind": "actual", "unreported": ["tokens"]})
    del kept
    gc.collect()
    assert not [r for r in list(budget._COUNTED_NOTHING.values()) if r.socket in names]
    assert len(budget._RECENT) == budget.RECENT_RECORDS_KEPT


def test_an_empty_report_is_still_written_as_before() -> None:
    report = UsageReport()
    assert usage_file_text(report) == report.model_dump_json(indent=2, exclude_none=True)


def test_a_usage_map_is_read_without_reading_the_aliases_it_does_not_give() -> None:
    """An agent that sends no usage sent an empty map: reading it looked up every alias spelling
    (about 240 figure reads a turn, most of the turn's engine work); a name absent or null is now
    skipped without a read, and an empty map is nothing to read at all."""
    from castor.domain.materia import budget

    read: list[Any] = []

    def spy(value: Any) -> float | None:
        read.append(value)
        return budget.non_negative_number(value)

    assert budget._first({"a": None, "b": 3, "c": 4}, ("x", "a", "b", "c"), spy) == 3
    assert read == [3]
    assert unreadable_figures({}) == [] and extract_usage({}) is NO_USAGE


def test_the_tables_joined_from_their_entries_are_pydantics_text_for_any_key() -> None:
    """The report's tables (bySocket, byMateria, byTask, byAttempt) are joined from each entry's
    key and value texts, not rendered whole at each turn: the text is pydantic's, whatever the keys."""
    from castor.domain.materia.budget import Amounts, TurnRecord, turn_record

    report = UsageReport()
    keys = ["Socket-1", 'S"q\\b', "Só\u2028\x01t", "", "Socket-1"]
    for n, key in enumerate(keys):
        fields = {"socket": key, "attempt": n + 1, "materia": key or None, "taskId": key or None,
                  "costKind": "actual", "unreported": ["tokens"], "tokens": NO_AMOUNTS, "cost": NO_AMOUNTS}
        report = report.add_turn(turn_record(fields))
        report = report.add_turn(TurnRecord(**{**fields, "tokens": Amounts(input=n, total=n), "unreported": None}))
        assert usage_file_text(report) == report.model_dump_json(indent=2, exclude_none=True)
        assert usage_state_json(report) == report.__pydantic_serializer__.to_json(report)

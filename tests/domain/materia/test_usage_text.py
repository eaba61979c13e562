"""A usage report's two texts -- compact in the state document, indented in ``usage.json`` -- are
joined from each turn record's text rendered once, and are byte for byte what pydantic writes for
the whole report (``to_json``; ``model_dump_json(indent=2, exclude_none=True)``)."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import TypeAdapter

from castor.domain.materia import budget
from castor.domain.materia.budget import (
    SELECTION_FIELDS,
    Amounts,
    TurnRecord,
    UsageReport,
    model_selection,
    usage_file_text,
    usage_file_text_json,
    usage_state_json,
)
from castor.domain.materia.cast_messages import WriteArtifact


def full_compact(report: UsageReport) -> bytes:
    return UsageReport.__pydantic_serializer__.to_json(report)


def full_indented(report: UsageReport) -> str:
    return report.model_dump_json(indent=2, exclude_none=True)


def assert_same_texts(report: UsageReport) -> None:
    assert usage_state_json(report) == full_compact(report)
    text = usage_file_text(report)
    assert text == full_indented(report)
    # the text's JSON string, joined from its pieces' escapes, is what pydantic writes for it
    assert usage_file_text_json(text) == TypeAdapter(str).dump_json(text)


OPTIONAL = [name for name, field in TurnRecord.model_fields.items()
            if not field.is_required() and field.default is None]


def record(n: int, *, every_field: bool, text: str = "m") -> TurnRecord:
    """A turn record with every optional field given (``every_field``) or none of them."""
    extra: dict[str, Any] = {}
    if every_field:
        for name in OPTIONAL:
            kind = str(TurnRecord.model_fields[name].annotation)
            extra[name] = n % 2 == 0 if "bool" in kind else ["cost", f"é{n}"] if "list" in kind else f"{text}{n}"
    return TurnRecord(socket=f"s{n}", attempt=n + 1, tokens=Amounts(input=n, output=1.5 * n, total=2.5 * n),
                      cost=Amounts(input=0.1 * n, total=0.30000000000000004), **extra)


def grown(records: list[TurnRecord], *, render_each_step: bool) -> UsageReport:
    report = UsageReport()
    for i, rec in enumerate(records):
        report = report.add_turn(rec)
        if i % 3 == 1:
            report = report.add_selection(model_selection(socket=rec.socket, materia="mat", visit=i,
                                                          requested_model="codex/x" if i == 4 else "prov/m",
                                                          requested_thinking=None, thinking="high",
                                                          thinking_fallback_reason=None, item_key="k"))
        if render_each_step:
            assert_same_texts(report)
    return report


def test_an_empty_report_is_written_as_pydantic_writes_it() -> None:
    assert_same_texts(UsageReport())


@pytest.mark.parametrize("every_field", [False, True])
@pytest.mark.parametrize("count", [1, 2, 7])
@pytest.mark.parametrize("render_each_step", [False, True])
def test_a_grown_report_is_written_as_pydantic_writes_it(count: int, every_field: bool,
                                                        render_each_step: bool) -> None:
    records = [record(n, every_field=every_field or n % 2 == 0, text="ünï \"q\" \\ \t ✓ 𝄞") for n in range(count)]
    report = grown(records, render_each_step=render_each_step)
    assert_same_texts(report)
    # a report copied by pydantic (no parent's text to start from) renders every record
    copied = report.model_copy(update={"costEstimated": True})
    assert_same_texts(copied)


def test_each_turn_record_and_selection_is_rendered_once_as_the_report_grows(monkeypatch: pytest.MonkeyPatch) -> None:
    rendered: list[tuple[str, str, str]] = []
    compact, indented = budget._compact_item, budget._indented_item

    def which(name: str, item: Any) -> str:
        return item.socket if name == "turns" else f"{item['socket']}/{item['visit']}"

    monkeypatch.setattr(budget, "_compact_item",
                        lambda name, item: rendered.append(("c", name, which(name, item))) or compact(name, item))
    monkeypatch.setattr(budget, "_indented_item",
                        lambda name, item: rendered.append(("i", name, which(name, item))) or indented(name, item))
    report = grown([record(n, every_field=True) for n in range(6)], render_each_step=True)
    assert len(report.modelSelections) == 2
    assert sorted(rendered) == sorted({(form, name, which(name, item)) for form in "ci"
                                       for name in ("turns", "modelSelections") for item in getattr(report, name)})


def test_a_report_with_every_field_and_selection_is_written_as_pydantic_writes_it() -> None:
    report = UsageReport(model="m", provider="p", api="a", thinkingLevel="high", costKind="subscription",
                         costEstimated=True, modelSelections=[{name: "x" for name in SELECTION_FIELDS}])
    report = report.add_turn(record(1, every_field=True))
    assert_same_texts(report)


optional_text = st.none() | st.text(max_size=8)
figures = st.integers(0, 10**12) | st.floats(0, 1e9, allow_nan=False)
amounts = st.builds(Amounts, input=figures, output=figures, cacheRead=figures, total=figures)
records = st.builds(
    TurnRecord, socket=st.text(max_size=6), materia=optional_text, taskId=optional_text,
    attempt=st.integers(1, 5), tokens=amounts, cost=amounts, model=optional_text, provider=optional_text,
    thinking=optional_text, requestedModel=optional_text, modelExplicit=st.none() | st.booleans(),
    costFromProvider=st.none() | st.booleans(), costKind=st.sampled_from(["actual", "subscription"]),
    unreadable=st.none() | st.lists(st.text(max_size=4), max_size=2),
    unreported=st.none() | st.lists(st.sampled_from(["tokens", "cost"]), max_size=2))
selections = st.dictionaries(st.text(max_size=5), st.none() | st.text(max_size=5) | st.integers(), max_size=3)


@settings(max_examples=60, deadline=None)
@given(steps=st.lists(st.tuples(st.booleans(), records, selections), max_size=8),
       render_each_step=st.lists(st.booleans(), min_size=8, max_size=8))
def test_any_report_is_written_as_pydantic_writes_it(steps: list[tuple[bool, TurnRecord, dict[str, Any]]],
                                                     render_each_step: list[bool]) -> None:
    report = UsageReport()
    for (is_turn, rec, selection), render in zip(steps, render_each_step, strict=False):
        report = report.add_turn(rec) if is_turn else report.add_selection(selection)
        if render:
            assert_same_texts(report)
    assert_same_texts(report)


def test_the_leading_fields_are_rendered_again_only_when_a_new_report_changes_them(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A selection that names no model leaves the totals, model fields and tables as they were: a
    report made by it starts from its parent's text of them; one that names a model, a subscription
    model or a turn changes them, and its texts are rendered afresh -- every text pydantic's own."""
    serializer = budget._USAGE_SERIALIZER
    leading: list[str] = []

    class Counting:
        def to_json(self, report: UsageReport, **options: Any) -> bytes:
            # the fields before the lists but the tables, which are joined from their entries' texts
            if options.get("include") == budget._SCALARS:
                leading.append("i" if "indent" in options else "c")
            return serializer.to_json(report, **options)

    monkeypatch.setattr(budget, "_USAGE_SERIALIZER", Counting())

    def select(report: UsageReport, n: int, requested_model: str | None = None) -> UsageReport:
        return report.add_selection(model_selection(socket=f"s{n}", materia="m", visit=n, item_key=None,
                                                    requested_model=requested_model, requested_thinking=None,
                                                    thinking=None, thinking_fallback_reason=None))

    report = UsageReport()
    assert_same_texts(report)
    assert sorted(leading) == ["c", "i"]
    for n in range(4):  # no model named: nothing before the lists changes
        report = select(report, n)
        assert_same_texts(report)
    assert sorted(leading) == ["c", "i"]
    changes = [lambda r: select(r, 5, "prov/m"),  # the report names the model asked for
               lambda r: r.add_selection({"socket": "s6", "requestedModel": "codex/x", "model": None}),  # subscription
               lambda r: r.add_turn(record(7, every_field=True))]  # a turn: totals and tables
    for change in changes:
        leading.clear()
        before = report
        report = change(report)
        assert_same_texts(report)
        assert sorted(leading) == ["c", "i"]
        assert usage_file_text(before) == full_indented(before)  # the parent's texts are still its own
    assert report.costKind == "subscription" and "costKind" in report.model_fields_set


def test_a_table_grown_at_a_new_key_is_its_parents_text_with_the_entry_added(monkeypatch: pytest.MonkeyPatch) -> None:
    """A turn at a new socket, materia, task or attempt adds its entry last to each such table: the
    new report's text of that table is its parent's with the entry's text added, in both layouts,
    not joined again from every entry -- and still pydantic's own, from an empty table on, for a
    turn that counted nothing and one that counted, odd keys included."""
    joined: list[str] = []
    table_text = budget._table_text
    monkeypatch.setattr(budget, "_table_text",
                        lambda name, table, form: joined.append(name) or table_text(name, table, form))
    report = UsageReport()
    assert_same_texts(report)
    joined.clear()
    nothing = budget.NO_AMOUNTS
    for n, key in enumerate(["a", ODD, "é ✓", "d"]):
        counted = n % 2 == 1
        rec = TurnRecord(socket=f"s{key}", materia=f"m{key}", taskId=f"t{key}", attempt=n + 1,
                         tokens=Amounts(input=n, total=n) if counted else nothing,
                         cost=Amounts(total=0.5) if counted else nothing)
        report = report.add_turn(rec)
        assert_same_texts(report)
    assert joined == []
    # an entry there already changes: its table is joined again (its text is not its parent's)
    report = report.add_turn(TurnRecord(socket="sa", tokens=Amounts(input=1, total=1), cost=Amounts()))
    assert_same_texts(report)
    assert sorted(set(joined)) == ["bySocket"]


def test_a_report_marked_estimated_is_pydantics_copy_and_renders_no_item_again(monkeypatch: pytest.MonkeyPatch) -> None:
    """``estimated()`` (a turn with no usage, the engine's) gives what ``model_copy`` gives -- every
    field, the set of given fields, both texts -- and starts from its parent's item texts."""
    report = grown([record(n, every_field=True) for n in range(5)], render_each_step=True)
    expected = report.model_copy(update={"costEstimated": True})
    texts = (full_compact(expected), full_indented(expected))
    rendered: list[str] = []
    compact, indented = budget._compact_item, budget._indented_item
    monkeypatch.setattr(budget, "_compact_item", lambda name, item: rendered.append(name) or compact(name, item))
    monkeypatch.setattr(budget, "_indented_item", lambda name, item: rendered.append(name) or indented(name, item))
    marked = report.estimated()
    assert marked == expected and marked.model_fields_set == expected.model_fields_set
    assert marked.costEstimated
    assert (usage_state_json(marked), usage_file_text(marked)) == texts
    assert rendered == []


ODD = "q\"uo\\te é ✓ 𝄞 \u2028\u2029 \x00\x01\x08\t\n\x0b\x0c\r\x1b\x1f\x7f\x80 </script> '"


@pytest.mark.timeout(60)
def test_usage_json_in_an_outbox_entry_is_pydantics_for_odd_keys_and_characters() -> None:
    # odd characters in table keys (sockets, materia, tasks), turn fields, selections' keys and values
    report = UsageReport()
    for n in range(4):
        rec = record(n, every_field=True, text=ODD).model_copy(update={"socket": f"{ODD}{n}", "materia": ODD,
                                                                      "taskId": f"t{ODD}"})
        report = report.add_turn(rec)
        report = report.add_selection({ODD: f"{ODD}{n}", "socket": ODD, "visit": n, f"k{n}\x00": None})
        text = usage_file_text(report)
        assert text == full_indented(report)
        entry = WriteArtifact(path=("usage.json",), content=text)
        whole = WriteArtifact.__pydantic_serializer__.to_json(entry)
        joined = usage_file_text_json(text)
        assert joined is not None
        assert b"".join((b'{"kind":"write_artifact","path":["usage.json"],"content":', joined,
                         b',"manifest":null}')) == whole
        # loaded back (a replay after a crash), it writes the same usage.json
        assert WriteArtifact.model_validate_json(whole).content == text
    # only the latest text made, and once: another text (equal or not) is left to pydantic
    text = usage_file_text(report)
    assert usage_file_text_json(str(text + " ")[:-1]) is None
    assert usage_file_text_json(text) is not None
    assert usage_file_text_json(text) is None

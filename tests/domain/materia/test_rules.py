"""Pure rules: handoff extraction/validation/application, expressions, routing, loops, limits,
budget, failure classification, revive arithmetic (spec §4–§6, conformance 28–45, 54–68)."""

from __future__ import annotations

import json
import time
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from castor.domain.materia import compaction
from castor.domain.materia.budget import TurnRecord, UsageReport, check_budget, extract_usage
from castor.domain.materia.config import Budget, Compaction, Edge, Limits, Socket
from castor.domain.materia.expressions import (
    MISSING,
    AssignError,
    ConditionError,
    Scope,
    evaluate_condition,
    resolve_value,
    set_path,
)
from castor.domain.materia.failures import (
    RecoveryAllowance,
    allowance_for,
    classify_turn_failure,
    decide_recovery,
)
from castor.domain.materia.handoff import (
    HandoffError,
    apply_assign,
    apply_envelope,
    extract_json,
    requires_satisfied,
    validate_handoff,
)
from castor.domain.materia.loops import empty_loop_target, exhaustion_target, iteration_for
from castor.domain.materia.revive import NotRevivable, RecoveryExhaustion, grant_revive
from castor.domain.materia.routing import LimitExceeded, count_visit, next_target

from .scripted import config, resolved

# ----------------------------------------------------------------------------- extraction


@pytest.mark.timeout(60)
@pytest.mark.parametrize(("reply", "expected"), [
    ("```" + " " * 100_000, None),  # an unclosed fence, then a model's runaway whitespace
    ("```" + " \t" * 50_000 + "json\n{\"a\": 1}\n```", {"a": 1}),
    ("```" + " " * 100_000 + "json" + " " * 100_000, None),
])
def test_a_fence_followed_by_long_whitespace_is_read_in_linear_time(reply: str, expected: Any) -> None:
    # The fence pattern's two [ \t]* around the optional "json" tag split a run of spaces every way
    # and scanned the rest of the reply for each split: 2,000 spaces after "```" took 53 s, holding
    # the cast's actor (and its abort) on one model reply.
    started = time.monotonic()
    if expected is None:
        with pytest.raises(HandoffError):
            extract_json(reply)
    else:
        assert extract_json(reply) == expected
    assert time.monotonic() - started < 2.0


def test_47_fenced_and_no_json() -> None:
    assert extract_json('Here you go ```json {"a":1} ```') == {"a": 1}
    with pytest.raises(HandoffError) as err:
        extract_json("not json")
    assert err.value.reason == "no-json" and "No JSON found in agent output" in err.value.message


def test_extraction_tolerates_stray_brackets_and_trailing_prose() -> None:
    """Deliberate difference (§12 item 12): a stray bracket before the object no longer breaks it."""
    assert extract_json('Plan [draft] {oops} then {"satisfied": true} done.') == {"satisfied": True}
    assert extract_json('```\nnot json\n```\nActually: {"x": [1, {"y": "}"}]} bye') == {"x": [1, {"y": "}"}]}
    assert extract_json('{"a": "quote \\" and } brace"} tail {') == {"a": 'quote " and } brace'}
    assert extract_json('["x"]') == ["x"]  # a top-level array parses; validation rejects it
    assert extract_json('{"note": "a raw\nline break"}') == {"note": "a raw\nline break"}  # taken (deliberate)


@pytest.mark.parametrize("reply", [
    # a trailing comma
    '```json\n{\n "summary": "two steps",\n "workItems": [\n  {"id": "a"},\n  {"id": "b"},\n ]\n}\n```',
    '{"summary": "cut short", "workItems": [{"id": "a"}, {"id": "b"',  # truncated: never closes
    'Here: {"workItems": [{"id": "a"}] "risks": []}',  # a missing comma
])
def test_a_broken_reply_is_unparseable_not_its_first_inner_object(reply: str) -> None:
    """Every opener used to be tried, so a reply with one slip was taken as its first work item: the
    generator assigned no workItems, the loop ran nothing and the cast completed having done
    nothing. An opener inside a value that does not parse is part of it, never the reply's value."""
    with pytest.raises(HandoffError) as err:
        extract_json(reply)
    assert err.value.reason == "unparseable", err.value.message


def test_the_first_value_not_inside_another_wins() -> None:
    assert extract_json('Sure. [{"id": "a"}] done') == [{"id": "a"}]  # an array, then refused by validation
    assert extract_json('list [1, 2] then {"b": 2}') == {"b": 2}
    assert extract_json('a smiley :-{ and then {"a": 1}') == {"a": 1}  # a lone bracket in prose covers nothing


@pytest.mark.parametrize("reply", ['[{"satisfied": true}]', '```json\n[{"satisfied": true}]\n```'])
def test_30_a_reply_that_is_an_array_is_that_array_not_its_first_object(reply: str) -> None:
    """A whole reply (or fenced block) that is JSON is taken as JSON.parse takes it: an array of
    objects was searched for its first object and routed on it, though a top-level array must fail."""
    assert extract_json(reply) == [{"satisfied": True}]
    with pytest.raises(HandoffError) as err:
        validate_handoff(extract_json(reply), "Socket-1", require_satisfied=True)
    assert "expected a JSON object at the top level" in err.value.message


@pytest.mark.parametrize("literal", ["NaN", "Infinity", "-Infinity"])
def test_nan_and_infinity_are_not_json(literal: str) -> None:
    """They were taken (and written as such into the socket's JSON and state.json, which no strict
    reader then parses); JSON.parse refuses them, and so does castor now."""
    with pytest.raises(HandoffError) as err:
        extract_json(f'{{"satisfied": true, "x": {literal}}}')
    assert err.value.reason == "unparseable"


def test_a_number_out_of_range_is_null_as_json_stringify_writes_it() -> None:
    assert extract_json('{"satisfied": true, "x": 1e999, "y": -1e999, "z": 1.5}') == {
        "satisfied": True, "x": None, "y": None, "z": 1.5}


def test_json_nested_deeper_than_the_bound_is_refused_not_a_crash_at_the_save() -> None:
    """300 levels parsed, then the state could not be saved (its serializer stops near 255): the
    cast's actor crashed, restarted, re-sent the turn (another paid turn), crashed again."""
    from castor.domain.materia.handoff import MAX_DEPTH

    ok = '{"x": ' + "[" * (MAX_DEPTH - 1) + "]" * (MAX_DEPTH - 1) + "}"
    assert extract_json(ok)["x"] is not None
    deep = '{"satisfied": true, "x": ' + "[" * MAX_DEPTH + "]" * MAX_DEPTH + "}"
    with pytest.raises(HandoffError) as err:
        extract_json(deep)
    assert err.value.reason == "unparseable" and f"deeper than {MAX_DEPTH} levels" in err.value.message


def test_unparseable_json_is_typed() -> None:
    with pytest.raises(HandoffError) as err:
        extract_json('{"a": ')
    assert err.value.reason == "unparseable" and "Could not parse JSON" in err.value.message
    with pytest.raises(HandoffError):
        extract_json("[" * 50_000)  # deep nesting never escapes as RecursionError


json_values = st.recursive(
    # integers JavaScript holds exactly (beyond 2**53 a reply's number is the nearest double, as in
    # JSON.parse: test_numbers_are_read_as_javascript_holds_them)
    st.none() | st.booleans() | st.integers(min_value=-2**53, max_value=2**53) | st.text(max_size=20),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4),
    max_leaves=20,
)
noise = st.text(alphabet=st.characters(blacklist_characters="{}[]`\"\\"), max_size=60)


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=400))
def test_extraction_never_raises_untyped_errors(text: str) -> None:
    try:
        extract_json(text)
    except HandoffError:
        pass


@settings(max_examples=200, deadline=None)
@given(st.dictionaries(st.text(max_size=8), json_values, max_size=5), noise, noise, st.booleans())
def test_extraction_finds_object_in_noise(obj: dict[str, Any], before: str, after: str, fenced: bool) -> None:
    body = json.dumps(obj)
    text = f"{before}\n```json\n{body}\n```\n{after}" if fenced else f"{before} {body} {after}"
    assert extract_json(text) == obj


# ----------------------------------------------------------------------------- validation


def sock(**fields: Any) -> Socket:
    return Socket.model_validate({"type": "agent", "materia": "A", "parse": "json", **fields})


def test_29_satisfied_required_when_routing_depends_on_it() -> None:
    s = sock(edges=[{"when": "satisfied", "to": "Socket-2"}])
    assert requires_satisfied(s)
    with pytest.raises(HandoffError) as err:
        validate_handoff({"passed": True}, "Socket-1", require_satisfied=True)
    msg = err.value.message
    assert msg.startswith('Invalid handoff JSON output for socket "Socket-1":')
    assert 'must include reserved boolean field "satisfied"' in msg
    assert 'Legacy field "passed" is not canonical' in msg
    assert requires_satisfied(sock(advance={"cursor": "c", "items": "x", "when": " not_satisfied "}))
    assert not requires_satisfied(sock(edges=[{"when": "always", "to": "end"}]))


@pytest.mark.parametrize(
    ("value", "fragment"),
    [(["x"], "expected a JSON object at the top level"), (None, "expected a JSON object"),
     ({"satisfied": "true"}, '"satisfied" must be a boolean'), ({"feedback": ["x"]}, '"feedback" must be a string'),
     ({"missing": "x"}, '"missing" must be an array')],
)
def test_30_handoff_validation_messages(value: Any, fragment: str) -> None:
    with pytest.raises(HandoffError) as err:
        validate_handoff(value, "Socket-1", require_satisfied=False)
    assert fragment in err.value.message


def test_43_evaluator_cannot_shrink_work_items() -> None:
    data = {"workItems": [{"id": "a"}, {"id": "b"}]}
    out = apply_envelope(data, {"workItems": [{"id": "a"}], "satisfied": True}, adopt_work_items=False)
    assert out["envelope"]["workItems"] == [{"id": "a"}]
    assert out["workItems"] == [{"id": "a"}, {"id": "b"}]
    gen = apply_envelope(data, {"workItems": [{"id": "z"}]}, adopt_work_items=True)
    assert gen["workItems"] == [{"id": "z"}]
    assert data == {"workItems": [{"id": "a"}, {"id": "b"}]}  # input untouched


def test_44_guidance_shallow_merge() -> None:
    out = apply_envelope({"guidance": {"framework": "keep", "style": "concise"}},
                         {"guidance": {"style": "detailed", "new": 1}}, adopt_work_items=False)
    assert out["guidance"] == {"framework": "keep", "style": "detailed", "new": 1}


def test_45_reserved_fields_stay_in_envelope() -> None:
    out = apply_envelope({}, {"feedback": "f", "missing": ["m"], "satisfied": False, "localDiagnostic": 1,
                              "summary": "  ", "decisions": []}, adopt_work_items=False)
    assert "feedback" not in out and "missing" not in out and "satisfied" not in out
    assert out["envelope"] == {"feedback": "f", "missing": ["m"], "satisfied": False, "summary": "  ",
                               "decisions": []}
    assert "summary" not in out and "decisions" not in out


def test_an_output_with_no_canonical_field_leaves_no_envelope() -> None:
    """castor wrote ``envelope: {}`` after every JSON object output, and a later command read it in
    its ``state``; pi-materia writes the envelope only when it holds something."""
    assert apply_envelope({"answer": 7}, {"value": 7}, adopt_work_items=False) == {"answer": 7}
    kept = {"envelope": {"satisfied": True}}
    assert apply_envelope(kept, {"value": 7}, adopt_work_items=False) == kept


def test_assign_paths() -> None:
    scope = Scope(data={}, parsed={"a": {"b": [10, 20]}, "feedback": "fb"}, last_output="raw")
    out = apply_assign({"x": 5}, {"deep.er.v": "$.a.b.1", "x.y": "$.feedback", "all": "$", "raw": "lastOutput",
                                  "gone": "$.nope"}, scope)
    assert out == {"deep": {"er": {"v": 20}}, "x": {"y": "fb"}, "all": scope.parsed, "raw": "raw"}
    with pytest.raises(Exception) as err:
        apply_assign({}, {"": "$"}, scope)
    assert "non-empty" in str(err.value)
    # pi-materia drops empty segments (split(".").filter(Boolean)); castor refused them after the paid turn
    assert apply_assign({}, {"a..b": "$.feedback", "result.": "$.feedback", ".y": "$.feedback"}, scope) == \
        {"a": {"b": "fb"}, "result": "fb", "y": "fb"}


def test_an_assign_target_naming_no_key_is_a_config_error() -> None:
    with pytest.raises(ValueError, match="names no key"):
        Socket.model_validate({"type": "agent", "materia": "A", "assign": {" . ": "$.x"}})


@pytest.mark.parametrize(("target", "value"), [(".".join(["k"] * 300), 1), (".".join(["k"] * 150), "deep")])
def test_an_assign_that_would_nest_data_too_deep_is_refused_not_a_crash_at_the_save(target: str, value: Any) -> None:
    """A target of 300 segments (or 150 with a reply 100 deep, each within the bounds alone) made
    the state unserializable: the cast's actor crashed at every save, re-sending the turn each time."""
    parsed = {"x": 1}
    if value == "deep":
        inner: Any = 1
        for _ in range(100):
            inner = {"a": inner}
        parsed = {"x": inner}
    with pytest.raises(AssignError) as err:
        apply_assign({}, {target: "$.x"}, Scope(data={}, parsed=parsed))
    assert "deeper than 200 levels" in err.value.message and len(err.value.message) < 300
    assert apply_assign({}, {".".join(["k"] * 150): "$.x"}, Scope(data={}, parsed={"x": 1}))["k"]["k"]


def test_digits_are_ascii_digits_as_in_javascript() -> None:
    """"²" and "١" are digits to str.isdigit; int() and json.loads refused them, and the ValueError
    crashed the cast's actor at every restart (re-sending the turn). "01" crashed json.loads too."""
    scope = Scope(data={"n": 1}, parsed={"items": [1, 2, 3], "n": 1})
    assert resolve_value("$.items.²", scope) is MISSING and resolve_value("$.items.2", scope) == 3
    assert evaluate_condition("$.n == ١", scope) is False  # a path into state.data, as pi-materia reads it
    assert evaluate_condition("$.n == 01", scope) is True and evaluate_condition("$.n == 1.0", scope) is True


def test_expressions_and_conditions() -> None:
    scope = Scope(data={"item": {"id": "a"}, "n": 2, "list": [1]}, parsed={"done": True, "satisfied": False},
                  last_json={"k": "v"})
    assert resolve_value("state.n", scope) == 2 and resolve_value("item.id", scope) == "a"
    assert resolve_value("lastJson.k", scope) == "v" and resolve_value("list.5", scope) is MISSING
    assert evaluate_condition("$.done == true", scope)
    assert evaluate_condition("not_satisfied", scope) and not evaluate_condition("satisfied", scope)
    assert evaluate_condition("exists(item.id)", scope) and evaluate_condition("!exists($.nope)", scope)
    assert evaluate_condition("state.n != 3", scope) and evaluate_condition("item.id == 'a'", scope)
    with pytest.raises(ConditionError):
        evaluate_condition("maybe", scope)


@pytest.mark.timeout(30)
@pytest.mark.parametrize("condition", ["a" + " " * 200_000 + "b", "$.n ==" + " " * 200_000 + "1\nx"])
def test_a_long_condition_is_read_in_linear_time(condition: str) -> None:
    # "^(.+?)\s*(==|!=)\s*(.+)$" backtracked over every run of spaces once per position before it:
    # 8,000 spaces took 0.4 s and a config's megabyte-long advance.when held the cast's actor (and
    # its abort) for hours at every completion of that socket.
    started = time.monotonic()
    with pytest.raises(ConditionError):
        evaluate_condition(condition, Scope(data={}, parsed={"n": 1}))
    assert time.monotonic() - started < 1.0


@pytest.mark.timeout(30)
@pytest.mark.parametrize(("condition", "expected"), [
    ("$.n == 1", True), ("$.n==1", True), ("$.n  !=  2", True), ("$.s == 'a == b'", True),
    ("$.n == 1 == 1", False), ("$.t ==\n1", True), ("$.n\n== 1", True),
])
def test_comparisons_split_at_the_first_operator_as_pi_materias_pattern_does(condition: str, expected: bool) -> None:
    scope = Scope(data={"1 == 1": 9}, parsed={"n": 1, "s": "a == b", "t": 1})
    assert evaluate_condition(condition, scope) is expected


@pytest.mark.timeout(30)
@pytest.mark.parametrize("condition", ["$.n ==\n1\n2", "a\nb == 1"])
def test_a_comparison_whose_sides_cross_a_line_break_is_unsupported(condition: str) -> None:
    with pytest.raises(ConditionError):
        evaluate_condition(condition, Scope(data={}, parsed={"n": 1}))


@pytest.mark.timeout(30)
def test_a_literal_with_an_exponent_is_a_path_as_in_pi_materia() -> None:
    # pi-materia's number literal is -?digits(.digits)? -- "1e3" is not one, so it is read as a path
    # into state.data (castor read it as 1000).
    scope = Scope(data={"1e3": 5}, parsed={"n": 1000, "m": 5})
    assert evaluate_condition("$.n == 1e3", scope) is False and evaluate_condition("$.m == 1e3", scope) is True
    assert evaluate_condition("$.n == 1000", scope) is True and evaluate_condition("$.n == -1000.0", scope) is False


@pytest.mark.timeout(30)
@pytest.mark.parametrize("condition", ["exists()", "!exists()"])
def test_exists_with_nothing_inside_is_unsupported_as_in_pi_materia(condition: str) -> None:
    # pi-materia's exists(...) needs an expression inside; "exists()" matched castor's pattern and read
    # the empty path -- the whole of state.data -- so it was silently true (and "!exists()" false).
    with pytest.raises(ConditionError):
        evaluate_condition(condition, Scope(data={"n": 1}, parsed={}))


# ----------------------------------------------------------------------------- routing & limits


def test_28_first_matching_edge() -> None:
    s = sock(edges=[{"when": "satisfied", "to": "Socket-2"}, {"when": "not_satisfied", "to": "Socket-3"},
                    {"when": "always", "to": "Socket-4"}])
    for parsed, expected in (({"satisfied": True}, "Socket-2"), ({"satisfied": False}, "Socket-3"), ({}, "Socket-4"),
                             ({"satisfied": "true"}, "Socket-4"), ("text", "Socket-4")):
        assert next_target("Socket-1", s, parsed, {}, Limits()) == expected
    assert next_target("Socket-1", sock(edges=[{"when": "satisfied", "to": "Socket-2"}]), {}, {}, Limits()) == "end"


def test_32_edge_limit() -> None:
    s = sock(edges=[{"when": "always", "to": "Socket-2", "maxTraversals": 1}])
    counts: dict[str, int] = {}
    assert next_target("Socket-1", s, {}, counts, Limits()) == "Socket-2"
    with pytest.raises(LimitExceeded) as err:
        next_target("Socket-1", s, {}, counts, Limits())
    assert "edge traversal limit exceeded for Socket-1->Socket-2 (2/1)" in err.value.message


def test_edge_limit_fallbacks_and_socket_level_enforcement() -> None:
    plain = sock(edges=[{"when": "always", "to": "Socket-2"}])
    counts = {"Socket-1->Socket-2": 25}
    with pytest.raises(LimitExceeded):
        next_target("Socket-1", plain, {}, counts, Limits())  # runtime fallback 25
    capped = sock(edges=[{"when": "always", "to": "Socket-2"}], limits={"maxEdgeTraversals": 1})
    counts = {"Socket-1->Socket-2": 1}
    with pytest.raises(LimitExceeded):  # deliberate difference §12 item 11: enforced
        next_target("Socket-1", capped, {}, counts, Limits(max_edge_traversals=99))


def test_33_visit_limit() -> None:
    s = sock(limits={"maxVisits": 1})
    visits: dict[str, int] = {}
    assert count_visit("Socket-1", s, visits, Limits()) == 1
    with pytest.raises(LimitExceeded) as err:
        count_visit("Socket-1", s, visits, Limits())
    assert "socket visit limit exceeded for Socket-1 (2/1)" in err.value.message
    assert visits == {"Socket-1": 1}


def _exit_pipeline(exits: list[dict[str, Any]], *, advance_done: str | None = None, in_loop: bool = True):
    sockets = {
        "Socket-1": {"type": "agent", "materia": "G", "parse": "json", "edges": [{"when": "always", "to": "Socket-2"}]},
        "Socket-2": {"type": "agent", "materia": "J", "parse": "json",
                     "advance": {"cursor": "workItemIndex", "items": "state.workItems", "when": "satisfied",
                                 **({"done": advance_done} if advance_done else {})},
                     "edges": [{"when": "satisfied", "to": "Socket-2"}, {"when": "not_satisfied", "to": "Socket-2"}]},
        "Socket-3": {"type": "agent", "materia": "A"}, "Socket-4": {"type": "agent", "materia": "A"},
        "Socket-5": {"type": "agent", "materia": "A"},
    }
    loops = {"lp": {"sockets": ["Socket-2"], "consumes": {"from": "Socket-1"}, "exits": exits}} if in_loop else None
    return resolved(config(sockets, loops=loops)).pipeline


def test_35_36_exhaustion_precedence() -> None:
    exits = [{"id": "a", "from": "Socket-2", "condition": "always", "targetSocketId": "Socket-5"},
             {"id": "s", "from": "Socket-2", "condition": "satisfied", "targetSocketId": "Socket-3"},
             {"id": "n", "from": "Socket-2", "condition": "not_satisfied", "targetSocketId": "Socket-4"}]
    p = _exit_pipeline(exits)
    assert exhaustion_target(p, "Socket-2", True) == "Socket-3"
    assert exhaustion_target(p, "Socket-2", False) == "Socket-4"
    assert exhaustion_target(p, "Socket-2", None) == "Socket-5"
    only_sat = _exit_pipeline([exits[1]])
    assert exhaustion_target(only_sat, "Socket-2", False) == "end"


def test_37_legacy_advance_done() -> None:
    outside = _exit_pipeline([], advance_done="Socket-3", in_loop=False)
    assert exhaustion_target(outside, "Socket-2", True) == "Socket-3"
    inside = _exit_pipeline([])
    assert exhaustion_target(inside, "Socket-2", True) == "end"


def test_38_empty_loop_target_and_fallback() -> None:
    exits = [{"id": "a", "from": "Socket-2", "condition": "always", "targetSocketId": "Socket-5"}]
    p = _exit_pipeline(exits)
    it = iteration_for(p, "Socket-2")
    assert it is not None and it.cursor == "workItemIndex"
    assert empty_loop_target(p, "Socket-2", it) == "Socket-5"
    assert empty_loop_target(_exit_pipeline([]), "Socket-2", it) == "end"


# ----------------------------------------------------------------------------- budget & usage


def test_83_84_usage_extraction() -> None:
    u = extract_usage({"inputTokens": 3, "outputTokens": 5})
    assert u.tokens.total == 8
    c = extract_usage({"cost": {"input": 0.005, "output": 0.03, "cacheRead": 0.0005, "total": 0.005}})
    assert c.cost.total == pytest.approx(0.0355)
    assert extract_usage({"prompt_tokens": 1, "completion_tokens": 2, "total_tokens": 10}).tokens.total == 10
    assert extract_usage("garbage").tokens.total == 0
    report = UsageReport()
    for _ in range(3):
        report = report.add_turn(TurnRecord(socket="Socket-1", taskId="a", attempt=1, tokens=u.tokens, cost=u.cost))
    assert report.tokens.total == 24 and len(report.turns) == 3 and report.byAttempt["a:1"].tokens.total == 24


def test_budget_warn_once_then_stop() -> None:
    budget = Budget(max_tokens=100, warn_at_percent=75)
    report = UsageReport().add_turn(TurnRecord(socket="s", tokens=extract_usage({"total": 80}).tokens,
                                               cost=extract_usage({}).cost))
    first = check_budget(budget, report, already_warned=False)
    assert first.warn and not first.limit_hit
    assert not check_budget(budget, report, already_warned=True).warn
    over = report.add_turn(TurnRecord(socket="s", tokens=extract_usage({"total": 20}).tokens,
                                      cost=extract_usage({}).cost))
    hit = check_budget(budget, over, already_warned=True)
    assert hit.limit_hit and hit.over_token and hit.stop
    assert not check_budget(Budget(max_tokens=100, stop_at_limit=False), over, already_warned=True).stop
    assert not check_budget(Budget(), over, already_warned=False).warn


# ----------------------------------------------------------------------------- failure classes


@pytest.mark.parametrize(
    ("message", "expected"),
    [
        ("context window exceeded", "context_window"),
        ("maximum tokens exceeded before response", "context_window"),
        ("WebSocket closed 1000 context_length_exceeded", "context_window"),
        ('Codex error: {"type":"error","error":{"code":"context_length_exceeded"}}', "context_window"),
        ("bash timed out after 120s", "tool_timeout"),
        ("tool call timed out", "tool_timeout"),
        ("WebSocket error", "transient_transport"),
        ('failed for socket "Build": WebSocket closed 1006', "transient_transport"),
        ("provider: Stream ended without finish_reason", "transient_transport"),
        ("terminated", "transient_transport"),
        ('Codex error: {"type":"error","message":"overloaded"} stream ended without finish_reason', None),
        ("error: {\"code\": 500} WebSocket error", None),
        ("WebSocket error while reading the config", None),
        ("provider auth failed", None),
        ("invalid_request_error: bad tool schema", None),
    ],
)
def test_classification_precedence(message: str, expected: str | None) -> None:
    assert classify_turn_failure(message) == expected


def test_generic_turn_failure_only_when_allowed_and_safe() -> None:
    assert classify_turn_failure("upstream hiccup", allow_generic=True) == "turn_failure"
    assert classify_turn_failure("upstream hiccup") is None
    assert classify_turn_failure("provider auth failed", allow_generic=True) is None
    assert classify_turn_failure("invalid_request_error: x", allow_generic=True) is None
    assert classify_turn_failure('Codex error: {"type":"error"}', allow_generic=True) is None


def test_recovery_bound_and_tool_timeout_minimum() -> None:
    a = allowance_for(None, "context_window")
    assert (a.original_max_attempts, a.effective_max_attempts) == (1, 1)
    assert decide_recovery("context_window", 0, a).retry and decide_recovery("context_window", 0, a).compact
    assert not decide_recovery("context_window", 1, a).retry
    t = allowance_for(None, "tool_timeout")
    assert t.effective_max_attempts == 3 and not decide_recovery("tool_timeout", 0, t).compact
    lifted = allowance_for(a, "tool_timeout")
    assert (lifted.original_max_attempts, lifted.effective_max_attempts) == (3, 3)


# ----------------------------------------------------------------------------- revive


def _exhaustion(reason: str = "boom", key: str = "k") -> RecoveryExhaustion:
    return RecoveryExhaustion(reason="context_window", key=key, attempts=1, original_max_attempts=1,
                              effective_max_attempts=1, revive_count=0, failed_reason=reason, socket="Socket-1",
                              mode="normal", exhausted_at=1.0)


@pytest.mark.parametrize(("original", "expected"), [(1, [2, 3]), (2, [4, 6])])
def test_65_revive_is_additive(original: int, expected: list[int]) -> None:
    allowances = {"k": RecoveryAllowance(original_max_attempts=original, effective_max_attempts=original),
                  "other": RecoveryAllowance()}
    seen = []
    for count in (1, 2):
        grant = grant_revive(cast_id="c", active=False, failed=True, failed_reason="boom",
                             exhaustion=_exhaustion(), allowances=allowances)
        allowances["k"] = grant.allowance
        assert grant.increment == original and grant.allowance.revive_count == count
        seen.append(grant.allowance.effective_max_attempts)
    assert seen == expected
    assert allowances["other"] == RecoveryAllowance()


def test_67_68_revive_rejections() -> None:
    allowances = {"k": RecoveryAllowance()}
    with pytest.raises(NotRevivable) as err:
        grant_revive(cast_id="c", active=False, failed=True, failed_reason="x", exhaustion=None, allowances=allowances)
    assert "not revivable" in err.value.message and "Use /materia recast" in err.value.message
    with pytest.raises(NotRevivable) as err:
        grant_revive(cast_id="c", active=False, failed=True, failed_reason="other", exhaustion=_exhaustion(),
                     allowances=allowances)
    assert "does not match the current terminal failure" in err.value.message
    with pytest.raises(NotRevivable) as err:
        grant_revive(cast_id="c", active=False, failed=True, failed_reason="boom", exhaustion=_exhaustion(),
                     allowances={"k": RecoveryAllowance(original_max_attempts=2, effective_max_attempts=1)})
    assert "recovery allowance metadata is missing or invalid" in err.value.message


# ----------------------------------------------------------------------------- proactive compaction


def test_62_proactive_threshold_tiers() -> None:
    d = compaction.decide_proactive({"tokens": 120_000, "contextWindow": 272_000}, model_context_window=200_000,
                                    config=None)
    assert d is not None
    assert (d.context_window, d.threshold.percent, d.percent, d.threshold.tier) == (200_000, 55, 60, "gte-200k")
    assert compaction.decide_proactive({"tokens": 1000, "contextWindow": 100_000}, model_context_window=None,
                                       config=None) is None
    single = Compaction(proactive_threshold_percent=42, proactive_threshold_tiers=[{"thresholdPercent": 90}])
    assert compaction.threshold_for(single, 50_000).mode == "single_percent"
    assert compaction.decide_proactive(None, model_context_window=1, config=None) is None


def test_edge_model_roundtrip() -> None:
    assert Edge.model_validate({"to": "end"}).when == "always"


# ----------------------------------------------------------------------------- isolated context (§5.4)


@pytest.mark.timeout(5)
def test_isolated_context_keeps_the_newest_tagged_message_and_what_follows() -> None:
    from castor.domain.materia.prompts import CLOSE_TAG, OPEN_TAG, isolate_context

    def text(role: str, body: str) -> dict[str, Any]:
        return {"role": role, "content": [{"type": "text", "text": body}]}

    old_prompt = {"role": "custom", "content": f"{OPEN_TAG}\nold socket\n{CLOSE_TAG}"}
    new_prompt = {"role": "custom", "content": f"{OPEN_TAG}\nnew socket\n{CLOSE_TAG}"}
    quoting = text("assistant", f"I saw {OPEN_TAG} and {CLOSE_TAG}")  # assistant/tool text never anchors
    tool = {"role": "toolResult", "content": [{"type": "text", "text": f"{OPEN_TAG}{CLOSE_TAG}"}]}
    messages = [text("user", "chat"), old_prompt, text("assistant", "a1"), new_prompt, quoting, tool,
                text("user", "refine it")]
    cut = isolate_context(messages, "SYNTHETIC")
    assert cut == [text("user", "SYNTHETIC"), new_prompt, quoting, tool, text("user", "refine it")]
    assert messages[0] == text("user", "chat")  # the input is not modified
    untagged = [text("user", "chat"), text("assistant", "a")]
    assert isolate_context(untagged, "SYNTHETIC") == untagged


@pytest.mark.timeout(60)
def test_json_extraction_work_is_bounded_on_pathological_replies(monkeypatch) -> None:
    """Megabytes of openers fail as unparseable after scanning at most the budget (before the
    bound each of 256 openers was a linear scan in Python: minutes of a cast actor's time)."""
    from castor.domain.materia import handoff

    scanned = []
    real = handoff._balanced_span

    def counting(text, start, budget):
        before = budget[0]
        try:
            return real(text, start, budget)
        finally:
            scanned.append(before - budget[0])

    monkeypatch.setattr(handoff, "_balanced_span", counting)
    for text in ("[" * 5_000_000, "{" * 2_000_000 + "x", '{"a": [' * 300_000):
        scanned.clear()
        with pytest.raises(handoff.HandoffError) as err:
            handoff.extract_json(text)
        assert err.value.reason == "unparseable"
        assert 0 < sum(scanned) <= handoff._SCAN_BUDGET
    assert handoff.extract_json('prose [1, 2 ] then {"a": {"b": [1]}} } trailing') == {"a": {"b": [1]}}


@pytest.mark.timeout(10)
def test_conditions_keep_null_and_undefined_apart_and_read_an_arrays_length():
    """As pi-materia's evaluateCondition: ``exists`` is ``!== undefined`` (a stored null exists),
    ``==`` is ``===`` (a missing key is not null), and a path reads an array's ``length``. castor
    took null for missing and missing for null, so a loadout's advance silently went the other way."""
    scope = Scope(data={"xs": [1, 2, 3], "empty": []}, parsed={"x": None, "xs": ["a"]})
    assert evaluate_condition("exists($.x)", scope) and not evaluate_condition("!exists($.x)", scope)
    assert evaluate_condition("$.x == null", scope)
    assert not evaluate_condition("state.nope == null", scope) and evaluate_condition("$.nope != null", scope)
    assert evaluate_condition("state.xs.length == 3", scope) and evaluate_condition("empty.length == 0", scope)
    assert evaluate_condition("exists($.xs.length)", scope) and resolve_value("$.xs.length", scope) == 1
    assert resolve_value("state.xs.0.length", scope) is MISSING  # a number is a primitive: no length


@pytest.mark.timeout(10)
def test_codex_subscription_is_recognised_in_any_case() -> None:
    """pi-materia lower-cases the names first: "OpenAI-Codex/gpt-5.5" is a subscription."""
    from castor.domain.materia.budget import is_subscription

    assert is_subscription("OpenAI-Codex/gpt-5.5") and is_subscription(None, "Codex/gpt-5.5")
    assert is_subscription("OPENAI-CODEX-responses") and not is_subscription("openai/gpt-5", "codex-mini")


def test_a_budget_limit_of_zero_is_a_limit_not_none() -> None:
    """pi-materia: ``maxTokens !== undefined && total >= maxTokens``. castor took 0 for "no limit",
    so a spending cap of 0 let a cast spend without one."""
    used = UsageReport().add_turn(TurnRecord(socket="s", tokens=extract_usage({"total": 50}).tokens,
                                             cost=extract_usage({"cost": {"total": 1.0}}).cost))
    for budget in (Budget(max_tokens=0), Budget(max_cost_usd=0)):
        hit = check_budget(budget, used, already_warned=False)
        # reached at once, with no percentage (pi-materia's ``maxTokens ? … : 0``): no warning of 1e18 %
        assert hit.limit_hit and hit.stop and not hit.warn and hit.percent == 0
    half = check_budget(Budget(max_tokens=0, max_cost_usd=4), used, already_warned=False)
    assert half.percent == 25 and type(half.percent) is int and half.limit_hit  # the cost's percentage shows
    nothing = check_budget(Budget(max_tokens=0), UsageReport(), already_warned=False)
    assert nothing.limit_hit and nothing.percent == 0 and not nothing.warn  # 0 >= 0: reached, as pi-materia
    assert not check_budget(Budget(), used, already_warned=False).limit_hit


def test_a_report_made_by_add_turn_or_add_selection_is_the_model_copy_pydantic_makes() -> None:
    from castor.domain.materia.budget import Amounts, model_selection

    report = UsageReport()
    selection = model_selection(socket="A", materia="m", visit=1, requested_model="openai-codex/x",
                                requested_thinking="high", thinking="high", thinking_fallback_reason=None,
                                item_key="k", attempt=2)
    after = report.add_selection(selection)
    expected = report.model_copy(update={"modelSelections": [selection], "model": "x", "provider": "openai-codex",
                                         "thinkingLevel": "high"})
    expected.costKind = "subscription"
    assert after == expected and after.__pydantic_fields_set__ == expected.__pydantic_fields_set__
    assert after.model_dump_json() == expected.model_dump_json()
    turned = after.add_turn(TurnRecord(socket="A", materia="m", taskId="k", tokens=Amounts(input=3),
                                       cost=Amounts(total=0.5), model="y"))
    assert turned.__pydantic_fields_set__ >= {"tokens", "cost", "turns", "bySocket", "byTask", "model"}
    assert type(turned) is UsageReport and turned.__pydantic_extra__ is None and turned.__pydantic_private__ is None
    assert report.modelSelections == [] and after.turns == []  # nothing changed in place
    assert UsageReport.model_validate_json(turned.model_dump_json()) == turned


@pytest.mark.parametrize("budget", [Budget(max_tokens=100, max_cost_usd=1.0, warn_at_percent=50),
                                    Budget(max_tokens=0), Budget(max_cost_usd=0.3, stop_at_limit=False), Budget()])
@pytest.mark.parametrize("warned", [False, True])
def test_a_budget_check_built_without_validation_is_the_validated_one(budget: Budget, warned: bool) -> None:
    from castor.domain.materia.budget import Amounts, BudgetCheck

    for tokens, cost in ((0, 0.0), (60, 0.1), (100, 0.35), (7, 2.0)):
        report = UsageReport(tokens=Amounts(total=tokens), cost=Amounts(total=cost))
        check = check_budget(budget, report, already_warned=warned)
        validated = BudgetCheck(**check.__dict__)
        assert check == validated and list(check.__dict__) == list(validated.__dict__)
        assert [type(v) for v in check.__dict__.values()] == [type(v) for v in validated.__dict__.values()]
        assert check.model_dump_json() == validated.model_dump_json()


@pytest.mark.timeout(30)
def test_an_assign_through_a_list_writes_its_item_as_the_path_reads_it() -> None:
    """A list on an assign target's way was replaced by an object (``{"0": ...}``): the items were
    lost without a word, and ``state.items.0.done`` no longer read what was written."""
    data = {"items": [{"id": "a"}, {"id": "b"}], "grid": [[1, 2], [3]], "flags": [1, 2]}
    scope = Scope(data=data, parsed={"ok": True})
    out = apply_assign(data, {"items.1.done": "$.ok", "grid.0.1": "$.ok", "flags.2": "$.ok", "flags.0": "$.nope"},
                       scope)
    assert out == {"items": [{"id": "a"}, {"id": "b", "done": True}], "grid": [[1, True], [3]],
                   "flags": [None, 2, True]}
    assert resolve_value("state.items.1.done", Scope(data=out)) is True
    # the reverse: a numeric step into an object is its key, read back the same way
    out = apply_assign({"m": {"x": 1}}, {"m.0": "$.ok"}, scope)
    assert out == {"m": {"x": 1, "0": True}} and resolve_value("m.0", Scope(data=out)) is True


@pytest.mark.timeout(30)
@pytest.mark.parametrize(("target", "said"), [
    ("items.done", "'items' holds a list, and the step 'done' is no index"),
    ("items.5.done", "index 5 is past it"),
    ("items.3", "index 3 is past it (indexes written: 0 to 2)"),
    ("items.0.tags.x", "'items.0.tags' holds a list, and the step 'x'"),
    ("items." + "9" * 30, "is past it"),
    ("items.length", "the step 'length' is no index"),
])
def test_an_assign_a_list_has_no_slot_for_is_a_config_error_and_changes_nothing(target: str, said: str) -> None:
    data = {"items": [{"id": "a", "tags": ["t"]}, {"id": "b"}], "kept": 1}
    before = json.dumps(data)
    with pytest.raises(AssignError) as err:
        apply_assign(data, {"first": "$.ok", target: "$.ok"}, Scope(data=data, parsed={"ok": True}))
    assert err.value.code == "invalid_config" and said in err.value.message
    assert "nothing was written" in err.value.message
    assert json.dumps(data) == before
    with pytest.raises(AssignError):
        set_path(data, target, True)
    assert json.dumps(data) == before

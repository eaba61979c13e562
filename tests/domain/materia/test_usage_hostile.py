"""The usage path under malformed and huge input: every provider shape castor claims to read, with
one figure replaced by something that is not a usage figure (a boolean, a string, NaN, a negative,
a list, an object) or by an integer past 2**63. Each such figure is named (``unreadable``: the
turn's typed warning), and nothing else of the turn is lost: every other figure still counts."""

from __future__ import annotations

import json
import math
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from castor.domain.materia.budget import (
    DECIMAL_COST,
    MAX_FIGURE,
    MAX_USAGE_MAPS,
    PARTS,
    TurnUsage,
    extract_usage,
    plain_usage,
    sum_usage_maps,
    unreadable_figures,
)
from castor.domain.materia.cast_messages import TurnEnded
from castor.ports.agent import TurnUsage as AgentTurnUsage

from .scripted import Driver, config, resolved

# Each shape castor reads, with the path of every figure in it. Every figure differs, so a figure
# that a malformed one replaced shows in the totals.
SHAPES: dict[str, dict[str, Any]] = {
    "pi": {"input": 100, "output": 50, "cacheRead": 10, "cacheWrite": 5, "totalTokens": 165,
           "cost": {"input": 0.2, "output": 0.3, "cacheRead": 0.05, "cacheWrite": 0.07, "total": 0.62}},
    "codex": {"input_tokens": 100, "cached_input_tokens": 10, "output_tokens": 50,
              "cost": {"input_cost_usd": 0.2, "output_cost_usd": 0.3, "cached_input_cost_usd": 0.05,
                       "total_cost_usd": 0.55}},
    "anthropic": {"input_tokens": 100, "output_tokens": 50, "cache_read_input_tokens": 10,
                  "cache_creation": {"ephemeral_5m_input_tokens": 5, "ephemeral_1h_input_tokens": 3},
                  "input_cost_usd": 0.2, "output_cost_usd": 0.3},
    "openai": {"prompt_tokens": 100, "completion_tokens": 50, "prompt_tokens_details": {"cached_tokens": 20}},
    "openrouter": {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15, "cost": 0.6},
    "google": {"usageMetadata": {"promptTokenCount": 100, "candidatesTokenCount": 50, "thoughtsTokenCount": 7,
                                 "cachedContentTokenCount": 10, "toolUsePromptTokenCount": 3}},
    "bedrock": {"inputTokens": 100, "outputTokens": 50, "cacheReadInputTokens": 10, "cacheWriteInputTokens": 5},
    "cohere": {"billed_units": {"input_tokens": 80, "output_tokens": 50}, "tokens": {"input_tokens": 120}},
}


def _paths(value: Any, at: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    if isinstance(value, dict):
        return [p for key, inner in value.items() for p in _paths(inner, (*at, key))]
    return [at]


def _replaced(usage: dict[str, Any], path: tuple[str, ...], value: Any) -> dict[str, Any]:
    out = json.loads(json.dumps(usage))
    cursor = out
    for key in path[:-1]:
        cursor = cursor[key]
    cursor[path[-1]] = value
    return out


BAD = st.one_of(
    st.booleans(),
    st.sampled_from([float("nan"), float("inf"), -float("inf"), -1, -0.5, "NaN", "1e400", " 0.25", "$1",
                     [], [5], {}, {"x": 1}]),
    st.text(max_size=20).filter(lambda s: not DECIMAL_COST.fullmatch(s)),  # a decimal string is a cost
)
# Figures of a shape that another figure of it stands before (Cohere's billed units before its
# tokens): a malformed one there is not read, as a later alias is not, and so is not named.
SHADOWED = {("cohere", ("tokens", "input_tokens"))}
# Figures with a fallback the same shape gives (Cohere's tokens for a malformed billed unit): the
# fallback counts, nothing is left out, and nothing is named.
FALLS_BACK = {("cohere", ("billed_units", "input_tokens"))}
HUGE = st.integers(min_value=2**63, max_value=2**200)

REVIEWER = "Socket-2"


def text_cast() -> Driver:
    return Driver(resolved(config({"Socket-1": {"type": "agent", "materia": "A",
                                                "edges": [{"when": "always", "to": REVIEWER}]},
                                   REVIEWER: {"type": "agent", "materia": "A"}})))


CASES = [(name, path) for name, usage in SHAPES.items() for path in _paths(usage)]


def _finite(turn: TurnUsage) -> None:
    for amounts in (turn.tokens, turn.cost):
        for name in (*PARTS, "total"):
            figure = getattr(amounts, name)
            assert not isinstance(figure, bool) and math.isfinite(figure) and 0 <= figure <= MAX_FIGURE, (name, figure)


@pytest.mark.parametrize(("shape", "path"), CASES, ids=[f"{s}:{'.'.join(p)}" for s, p in CASES])
@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(bad=BAD)
def test_a_malformed_figure_is_named_and_every_other_figure_still_counts(shape: str, path: tuple[str, ...],
                                                                         bad: Any) -> None:
    usage = SHAPES[shape]
    whole = extract_usage(usage)
    hurt = _replaced(usage, path, bad)
    read = extract_usage(hurt)
    _finite(read)
    named = unreadable_figures(hurt)
    if (shape, path) not in SHADOWED | FALLS_BACK and bad != {}:  # an empty object says nothing, as null does
        assert named, f"{'.'.join(path)}={bad!r} was dropped without a word"
        assert any(note.startswith(f"{path[-1]}=") or f".{path[-1]}=" in note for note in named), named
    # Nothing else is lost: a figure the malformed one did not feed counts as before (a total made
    # of the parts may shrink by the malformed part, never more).
    assert read.tokens.total <= whole.tokens.total or shape == "codex" or (shape, path) in FALLS_BACK
    assert read.cost.total <= whole.cost.total + 1e-9
    assert sum_usage_maps([hurt, usage])["totalTokens"] >= whole.tokens.total
    json.dumps(sum_usage_maps([hurt]), allow_nan=False)  # the summed map a turn keeps is plain JSON
    json.dumps(plain_usage(hurt), allow_nan=False)


@pytest.mark.parametrize(("shape", "path"), CASES, ids=[f"{s}:{'.'.join(p)}" for s, p in CASES])
@settings(max_examples=10, deadline=None)
@given(huge=HUGE)
def test_an_integer_past_2_63_counts_as_the_largest_figure_never_an_error(shape: str, path: tuple[str, ...],
                                                                          huge: int) -> None:
    hurt = _replaced(SHAPES[shape], path, huge)
    read = extract_usage(hurt)
    _finite(read)
    # counted as the largest figure (never less than reported); a token total the map gives stays
    # the total, as pi-materia reads it
    figures = [getattr(amounts, name) for amounts in (read.tokens, read.cost) for name in (*PARTS, "total")]
    assert MAX_FIGURE in figures or (shape, path) in SHADOWED, figures
    assert f"{path[-1]}={huge} (counted as 10^18)"[:20] in " ".join(unreadable_figures(hurt)), "named, as counted"
    json.dumps(sum_usage_maps([hurt, hurt]), allow_nan=False)


@settings(max_examples=200, deadline=None)
@given(st.recursive(st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8),
                    lambda inner: (st.lists(inner, max_size=4)
                                   | st.dictionaries(st.text(max_size=12), inner, max_size=6)),
                    max_leaves=30))
def test_any_json_value_as_a_usage_reads_finite_and_the_sum_is_plain_json(usage: Any) -> None:
    _finite(extract_usage(usage))
    summed = sum_usage_maps([usage])
    json.dumps(summed, allow_nan=False)
    assert isinstance(unreadable_figures(summed), list)


@pytest.mark.parametrize("shape", sorted(SHAPES))
@settings(max_examples=15, deadline=None)
@given(data=st.data())
def test_a_turn_with_a_malformed_figure_completes_with_the_rest_of_its_usage_and_says_what_it_left_out(
        shape: str, data: st.DataObject) -> None:
    """Through the engine: the turn answers its socket, its record counts what could be read, the
    figure left out is named (the record, a usage_unreadable event, one warning), and the cast's
    state stays plain JSON (it is saved after every step)."""
    path = data.draw(st.sampled_from(_paths(SHAPES[shape])))
    bad = data.draw(st.one_of(BAD, HUGE))
    usage = plain_usage(_replaced(SHAPES[shape], path, bad))  # what the harness link hands the engine
    d = text_cast()
    turn = d.pending()
    d.send(TurnEnded, visit_id=turn.visit_id, text="built", stop_reason="stop", usage=usage)
    assert d.pending().socket_id == REVIEWER, "the turn answered its socket"
    (record,) = d.state.usage.turns
    read = extract_usage(usage)
    assert (record.tokens, record.cost) == (read.tokens, read.cost)
    named = unreadable_figures(usage)
    assert (record.unreadable or []) == named
    if (shape, path) not in SHADOWED | FALLS_BACK and bad != {}:  # a huge integer too: counted as the cap
        assert named, f"{'.'.join(path)}={bad!r} was dropped without a word on its way to the engine"
    if named:
        assert d.events("usage_unreadable")[-1].data["figures"] == named
    json.dumps(d.state.model_dump(mode="json"), allow_nan=False)


def test_usage_maps_past_the_number_read_are_named_not_dropped_silently() -> None:
    """A turn of more assistant messages than castor reads usage maps of (MAX_USAGE_MAPS; the wire
    carries 65,536): the first are counted and the rest are named, so the totals say they left
    some out rather than look complete."""
    counted = sum_usage_maps([{"input": 1}] * MAX_USAGE_MAPS)
    assert counted["totalTokens"] == MAX_USAGE_MAPS and unreadable_figures(counted) == []
    over = sum_usage_maps([{"input": 1}] * (MAX_USAGE_MAPS + 5) + ["junk"])
    assert over["totalTokens"] == MAX_USAGE_MAPS
    assert unreadable_figures(over)[0] == f"usages=[{MAX_USAGE_MAPS + 6} maps: the last 6 not read]"


@pytest.mark.parametrize("figure", [float("nan"), float("inf"), -float("inf")])
def test_a_non_finite_figure_is_named_by_every_agent_not_dropped_on_the_way(figure: float) -> None:
    """A NaN or infinity (JSON's NaN / Infinity, msgpack's float) reaches the engine by its name, as
    the Pi extension sends it, so it is named like any figure that is not a number."""
    from castor.adapters.agents.openai_http import _usage
    from castor.endpoint.harness_link import outcome_from_wire

    usage = {"input": 5, "output": 2, "totalTokens": figure, "cost": {"total": figure}}
    name = json.dumps(json.dumps(figure))  # "NaN", "Infinity", "-Infinity", as a string
    expected = [f"totalTokens={name}", f"cost.total={name}"]
    wired = outcome_from_wire("t1", {"usage": usage}).usage
    assert wired is not None and unreadable_figures(wired.raw) == expected
    assert extract_usage(wired.raw).tokens.total == 7
    served = _usage({"prompt_tokens": 5, "completion_tokens": 2, "total_tokens": figure, "cost": figure})
    assert served is not None and unreadable_figures(served.raw) == [f"total_tokens={name}", f"cost={name}"]
    json.dumps(wired.raw, allow_nan=False)
    json.dumps(served.raw, allow_nan=False)


@pytest.mark.parametrize("usage", ["lots", 5, [1, 2], True])
def test_an_openai_compatible_servers_usage_that_is_not_a_map_is_named_as_the_harness_links_is(usage: Any) -> None:
    from castor.adapters.agents.openai_http import _usage
    from castor.endpoint.harness_link import outcome_from_wire

    served = _usage(usage)
    assert served is not None and served.raw is not None
    assert unreadable_figures(served.raw) == [f"usage={json.dumps(usage)}"]
    wired = outcome_from_wire("t1", {"usage": usage}).usage
    assert wired is not None and unreadable_figures(wired.raw) == unreadable_figures(served.raw)
    # no usage sent is a usage that counts nothing (the engine records the turn as reporting none),
    # not a malformed one
    assert _usage(None) == AgentTurnUsage() and AgentTurnUsage().raw is None


@pytest.mark.parametrize("usage", ["lots", 5, [1, 2], True])
def test_a_scripted_turns_usage_that_is_not_a_map_is_named_as_the_wire_names_it_not_a_refused_script(
        tmp_path: Any, usage: Any) -> None:
    """``--agent script:FILE`` with a turn whose ``usage`` is no map refused the whole script
    (``invalid_config``) while the same shape over the wire is named unreadable and the turn kept."""
    from castor.adapters.agents.scripted import ScriptAnswer, load_script
    from castor.endpoint.harness_link import outcome_from_wire

    answer = ScriptAnswer.model_validate({"text": "kept", "usage": usage})
    wired = outcome_from_wire("t1", {"usage": usage}).usage
    assert answer.usage is not None and wired is not None
    assert unreadable_figures(answer.usage.raw) == unreadable_figures(wired.raw) == [f"usage={json.dumps(usage)}"]
    assert answer.outcome("t1").text == "kept"
    script = tmp_path / "answers.json"
    script.write_text(json.dumps([{"text": "kept", "usage": usage}, "next"]))
    loaded = load_script(script)
    assert [a.text for a in loaded.by_socket["*"]] == ["kept", "next"]


def _warnings(d: Driver) -> list[str]:
    from castor.domain.materia.cast_messages import Notify

    return [e.message for e in d.effects if isinstance(e, Notify) and e.level == "warning"]


def test_an_integer_past_2_63_is_named_as_counted_at_the_cap_and_the_cap_is_kept() -> None:
    """A figure past what castor counts (2**64 input tokens, as the wire carries it) counted as 10^18
    without a word of its own: the budget stopped on it, but usage.json and the warning said nothing
    of a figure castor had not counted as given. It is named now, the way an unreadable figure is
    (``turns[].unreadable``, the ``usage_unreadable`` event, the cast's one warning), saying it
    counts as 10^18; the cap stays, and the turn's other figures count."""
    from castor.endpoint.harness_link import outcome_from_wire

    huge = 2**64
    wired = outcome_from_wire("t1", {"usage": {"input": huge, "output": 5, "totalTokens": huge + 5}}).usage
    assert wired is not None
    read = extract_usage(wired.raw)
    assert (read.tokens.input, read.tokens.output, read.tokens.total) == (MAX_FIGURE, 5, MAX_FIGURE)
    named = unreadable_figures(wired.raw)
    assert named == [f"input={huge} (counted as 10^18)", f"totalTokens={huge + 5} (counted as 10^18)"], named
    d = text_cast()
    d.send(TurnEnded, visit_id=d.pending().visit_id, text="built", stop_reason="stop", usage=wired.raw)
    (record,) = d.state.usage.turns
    assert record.unreadable == named and record.tokens.input == MAX_FIGURE
    assert d.events("usage_unreadable")[-1].data["figures"] == named
    (said,) = _warnings(d)
    assert "past what castor counts" in said and f"input={huge}" in said and "not numbers" not in said, said


@pytest.mark.parametrize(("flag", "pis_total"), [(True, 11), (False, 10)])
def test_a_boolean_token_count_is_named_and_not_counted_even_in_the_total_pi_added_it_to(flag: bool,
                                                                                      pis_total: int) -> None:
    """A provider's ``completion_tokens: true`` reaches castor as Pi left it: ``output: true`` and a
    ``totalTokens`` Pi made by plain addition (10 + true = 11). The part was named, but the total
    counted the boolean as one token. Now the boolean counts nothing anywhere: the total is the
    parts castor counted, and the figure is named."""
    from castor.endpoint.harness_link import outcome_from_wire

    pi = {"input": 10, "output": flag, "cacheRead": 0, "cacheWrite": 0, "totalTokens": pis_total,
          "cost": {"input": 0.1, "output": 0, "cacheRead": 0, "cacheWrite": 0, "total": 0.1}}
    wired = outcome_from_wire("t1", {"usages": [pi]}).usage
    assert wired is not None
    assert wired.raw["totalTokens"] == 10 and wired.raw["output"] == 0, wired.raw
    assert unreadable_figures(wired.raw) == [f"output={json.dumps(flag)}"]
    assert extract_usage(pi).tokens.total == 10
    # a total beside it that holds more than the parts (a provider's own) keeps what it adds
    assert extract_usage({**pi, "totalTokens": pis_total + 7}).tokens.total == 17

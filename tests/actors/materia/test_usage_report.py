"""usage.json's model fields, cost kind and model selections (pi-materia's UsageReport), and a
harness run's usage read from each assistant message in any provider's spelling."""

from __future__ import annotations

import math

import pytest

from castor.actors.materia.component import run_answer
from castor.domain.materia.budget import (
    STOPPED_UNREPORTED_KEY,
    Amounts,
    TurnRecord,
    UsageReport,
    cost_from_provider,
    model_selection,
    sum_usage_maps,
    turn_cost_kind,
)
from castor.endpoint.harness_link import outcome_from_wire


def _turn(**fields) -> TurnRecord:
    return TurnRecord(socket="Socket-1", tokens=Amounts(total=1), cost=Amounts(total=0.1), **fields)


@pytest.mark.timeout(10)
def test_the_report_takes_the_latest_model_fields_and_cost_kind_only_worsens() -> None:
    """costKind is pi-materia's (``actual`` unless a subscription model answered); whether every
    cost was the provider's billed figure is castor's own ``costEstimated``."""
    report = UsageReport()
    assert report.costKind == "actual" and report.model is None and not report.costEstimated
    report = report.add_turn(_turn(model="m-1", provider="acme", api="a", thinkingLevel="low", costFromProvider=True))
    assert (report.model, report.provider, report.api, report.thinkingLevel, report.costKind) == (
        "m-1", "acme", "a", "low", "actual")
    assert not report.costEstimated
    report = report.add_turn(_turn(model="m-2", costFromProvider=False))
    assert (report.model, report.provider, report.costKind, report.costEstimated) == ("m-2", "acme", "actual", True)
    report = report.add_turn(_turn(costFromProvider=True))
    assert report.costEstimated, "an estimate in the total stays an estimate"
    assert UsageReport().add_turn(_turn()).costEstimated, "a cost the usage did not mark is an estimate"


@pytest.mark.timeout(10)
@pytest.mark.parametrize("names", [("openai-codex", None, None), (None, None, "codex/gpt-5"),
                                   ("m", "openai-codex-responses", None)])
def test_a_codex_model_makes_the_cost_kind_subscription_for_good(names) -> None:
    provider, api, model = names
    kind = turn_cost_kind(model, provider, api, None)
    assert kind == "subscription"
    report = UsageReport().add_turn(_turn(costKind=kind)).add_turn(_turn(costKind="actual"))
    assert report.costKind == "subscription"


@pytest.mark.timeout(10)
def test_a_requested_codex_model_in_a_selection_makes_it_subscription() -> None:
    selection = model_selection(socket="Socket-1", materia="S", visit=1, requested_model="openai-codex/gpt-5",
                                requested_thinking=None, thinking=None, thinking_fallback_reason=None)
    assert selection["provider"] == "openai-codex" and selection["model"] == "gpt-5"
    assert selection["modelExplicit"] and not selection["thinkingExplicit"] and selection["source"] == "configured"
    assert UsageReport().add_selection(selection).costKind == "subscription"
    active = model_selection(socket="Socket-1", materia="S", visit=1, requested_model=" ", requested_thinking=None,
                             thinking=None, thinking_fallback_reason=None)
    assert active["label"] == "active Pi model" and active["source"] == "active" and "model" not in active


@pytest.mark.timeout(10)
def test_cost_kind_is_pi_materias_and_the_provider_marker_is_read_apart() -> None:
    """pi-materia writes ``actual`` for every cost that is not a subscription's, Pi's catalog
    estimates included; castor reads Pi's marker into ``costFromProvider`` beside it."""
    assert turn_cost_kind("m", "acme", None, None) == "actual"
    assert cost_from_provider({"cost": {"total": 1, "totalFromProvider": True}}) is True
    assert cost_from_provider({"cost": {"total": 1, "totalFromProvider": False}}) is False
    assert cost_from_provider({"costUsd": 1}) is None and cost_from_provider(None) is None


@pytest.mark.timeout(10)
def test_a_user_runs_usage_is_every_assistant_messages_in_its_own_spelling() -> None:
    data = {"messages": [
        {"role": "user", "text": "hi"},
        {"role": "assistant", "text": "", "stop_reason": "toolUse",
         "usage": {"prompt_tokens": 7, "completion_tokens": 1}},
        {"role": "toolResult", "text": "ok"},
        {"role": "assistant", "text": "final", "stop_reason": "stop",
         "usage": {"inputTokens": 3, "outputTokens": 4, "cost": {"input": 0.5, "output": 0.25}},
         "model": {"provider": "acme", "id": "m-1", "api": "x"}, "thinking_level": "medium"},
    ]}
    answer = run_answer(data)
    assert answer["text"] == "final" and answer["stop_reason"] == "stop"
    assert (answer["model"], answer["provider"], answer["api"], answer["thinking_level"]) == (
        "m-1", "acme", "x", "medium")
    usage = answer["usage"]
    assert usage["input"] == 10 and usage["output"] == 5 and usage["totalTokens"] == 15
    assert math.isclose(usage["cost"]["total"], 0.75)
    assert run_answer({"messages": [{"role": "assistant", "text": "x"}]})["usage"] is None


ZEROS = {"input": 0, "output": 0, "cacheRead": 0, "cacheWrite": 0, "totalTokens": 0, "cost": {"total": 0}}
STEP = {"role": "assistant", "text": "", "stop_reason": "toolUse",
        "usage": {"prompt_tokens": 7, "completion_tokens": 1}}


@pytest.mark.timeout(10)
@pytest.mark.parametrize("stopped_usage", [ZEROS, None])
def test_a_user_run_stopped_after_tool_steps_counts_them_and_marks_the_stopped_messages_share(stopped_usage) -> None:
    """The stopped message's zeros (Pi's, before its provider said what it used) are unknown, not
    nothing: the earlier steps count and the summed map says the stopped message reported nothing."""
    stopped = {"role": "assistant", "text": "half", "stop_reason": "aborted",
               **({"usage": stopped_usage} if stopped_usage else {})}
    usage = run_answer({"messages": [STEP, {"role": "toolResult", "text": "ok"}, stopped]})["usage"]
    assert usage["totalTokens"] == 8 and usage[STOPPED_UNREPORTED_KEY] is True
    assert run_answer({"messages": [stopped]})["usage"] is None, "nothing else reported: unknown"
    reported = {**stopped, "usage": {"input": 5, "output": 1}}
    usage = run_answer({"messages": [STEP, reported]})["usage"]
    assert usage["totalTokens"] == 14 and STOPPED_UNREPORTED_KEY not in usage
    answered = {**stopped, "stop_reason": "stop"}  # an answer's zeros are the provider's own figures
    assert STOPPED_UNREPORTED_KEY not in run_answer({"messages": [STEP, answered]})["usage"]


@pytest.mark.timeout(10)
def test_the_harness_saying_the_stopped_messages_usage_is_unknown_marks_the_summed_usage() -> None:
    params = {"text": "half", "stop_reason": "aborted", "aborted": True, "usages": [STEP["usage"]],
              "stopped_usage_unknown": True}
    outcome = outcome_from_wire("t1", params)
    assert outcome.usage is not None and outcome.usage.raw is not None
    assert outcome.usage.raw["totalTokens"] == 8 and outcome.usage.raw[STOPPED_UNREPORTED_KEY] is True
    for said in (False, "yes", 1, None):  # only true says it
        raw = outcome_from_wire("t1", {**params, "stopped_usage_unknown": said}).usage.raw  # type: ignore[union-attr]
        assert STOPPED_UNREPORTED_KEY not in raw


@pytest.mark.timeout(10)
def test_summed_usage_keeps_every_provider_figure_and_drops_none() -> None:
    summed = sum_usage_maps([{"input_tokens": 2, "cache_read_input_tokens": 1, "input_cost_usd": 0.1},
                             {"input": 3, "cost": {"total": 0.2, "totalFromProvider": True}}, "junk", None])
    assert summed["input"] == 5 and summed["cacheRead"] == 1 and summed["totalTokens"] == 6
    assert math.isclose(summed["cost"]["total"], 0.3) and summed["cost"]["totalFromProvider"] is False


@pytest.mark.timeout(10)
def test_huge_usage_figures_are_capped_so_the_state_can_always_be_saved() -> None:
    """1e308 tokens twice summed to infinity: state.json could not be written (the cast's actor
    crashed) nor read back (state_corrupt); the budget's percentage was infinite too."""
    from castor.domain.materia.budget import MAX_FIGURE, check_budget, extract_usage
    from castor.domain.materia.config import Budget

    huge = extract_usage({"input": 1e308, "output": 10**400, "cost": {"total": 1e308}})
    assert huge.tokens.input == MAX_FIGURE and huge.tokens.output == MAX_FIGURE
    report = UsageReport()
    for _ in range(3):
        report = report.add_turn(TurnRecord(socket="Socket-1", tokens=huge.tokens, cost=huge.cost))
    assert all(math.isfinite(v) for v in report.tokens.model_dump().values())
    assert report.tokens.total == MAX_FIGURE
    UsageReport.model_validate_json(report.model_dump_json())  # what state.json needs
    check = check_budget(Budget(max_tokens=1, max_cost_usd=1e-9), report, already_warned=False)
    assert math.isfinite(check.percent) and check.limit_hit


@pytest.mark.timeout(10)
@pytest.mark.parametrize(("raw", "total"), [
    ({"input": 12, "output": -5, "totalTokens": 7}, 12),  # Pi's plain sum of a negative: no floor
    ({"input": 12, "output": "5", "totalTokens": "125"}, 12),
    ({"prompt_tokens": 100, "completion_tokens": 20, "cached_tokens": 60, "total_tokens": 120}, 120),  # as given
    ({"input": 3, "output": -1, "totalTokens": 50}, 50),  # a provided total above the parts stands
])
def test_a_token_part_not_counted_never_lowers_the_total_below_the_parts_counted(raw, total) -> None:
    from castor.domain.materia.budget import extract_usage

    assert extract_usage(raw).tokens.total == total

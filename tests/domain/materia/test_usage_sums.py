"""Usage sums are decimal sums: no binary float drift reaches ``usage.json``, a view or the budget."""

from __future__ import annotations

import json

from castor.domain.materia.budget import (
    TurnRecord,
    UsageReport,
    check_budget,
    extract_usage,
    sum_usage_maps,
    unreadable_figures,
)
from castor.domain.materia.config import Budget


def _report(*usages: dict[str, object]) -> UsageReport:
    report = UsageReport()
    for usage in usages:
        turn = extract_usage(usage)
        report = report.add_turn(TurnRecord(socket="Socket-1", tokens=turn.tokens, cost=turn.cost))
    return report


def test_a_turns_cost_parts_add_up_to_their_decimal_sum() -> None:
    assert extract_usage({"cost": {"input": 0.1, "output": 0.2}}).cost.total == 0.3
    # Pi sums its parts in JavaScript and sends the drifted figure as the provided total
    assert extract_usage({"cost": {"input": 0.1, "output": 0.2, "total": 0.30000000000000004}}).cost.total == 0.3


def test_a_casts_totals_are_the_decimal_sum_of_its_turns_and_are_written_so() -> None:
    report = _report(*[{"input": 1, "cost": {"total": 0.1}}] * 3)
    assert report.cost.total == 0.3
    assert "0.30000000000000004" not in json.dumps(report.model_dump())
    assert _report(*[{"cost": {"total": 0.1}}] * 10).cost.total == 1
    assert sum_usage_maps([{"cost": {"total": 0.1}}, {"cost": {"total": 0.2}}])["cost"]["total"] == 0.3


def test_a_cost_that_adds_up_to_the_limit_exactly_reaches_it() -> None:
    # 0.7 + 0.1 is 0.7999999999999999 in binary floats: the limit of 0.8 was never reached
    report = _report({"cost": {"total": 0.7}}, {"cost": {"total": 0.1}})
    check = check_budget(Budget(max_cost_usd=0.8), report, already_warned=True)
    assert check.over_cost and check.stop


def test_integer_token_counts_stay_exact_and_a_fraction_counts_as_written() -> None:
    assert _report({"input": 2**53 + 1}).tokens.total == 2**53 + 1
    assert _report({"input": 12.5}, {"input": 0.1}).tokens.total == 12.6


GEMINI = {"promptTokenCount": 100, "candidatesTokenCount": 50, "thoughtsTokenCount": 5,
          "cachedContentTokenCount": 10, "totalTokenCount": 155}


def test_googles_usage_counts_as_pi_reads_it_at_the_top_level_or_in_usage_metadata() -> None:
    for usage in (GEMINI, {"usageMetadata": GEMINI}):
        tokens = extract_usage(usage).tokens
        assert (tokens.input, tokens.output, tokens.cacheRead, tokens.total) == (90, 55, 10, 155)
    # without a total: the parts, the cached tokens once
    assert extract_usage({"promptTokenCount": 100, "candidatesTokenCount": 50,
                          "cachedContentTokenCount": 10}).tokens.total == 150
    # a map's own names win
    assert extract_usage({**GEMINI, "input": 7}).tokens.total == 7


def test_openais_nested_cached_tokens_are_cache_read_tokens_counted_once() -> None:
    chat = {"prompt_tokens": 100, "completion_tokens": 50, "prompt_tokens_details": {"cached_tokens": 20},
            "completion_tokens_details": {"reasoning_tokens": 30}}
    tokens = extract_usage(chat).tokens
    assert (tokens.input, tokens.output, tokens.cacheRead, tokens.total) == (100, 50, 20, 150)
    responses = {"input_tokens": 100, "output_tokens": 50, "total_tokens": 150,
                 "input_tokens_details": {"cached_tokens": 20}, "output_tokens_details": {"reasoning_tokens": 30}}
    tokens = extract_usage(responses).tokens
    assert (tokens.cacheRead, tokens.total) == (20, 150)


def test_a_per_message_usage_that_is_not_a_map_is_named_not_skipped_without_a_word() -> None:
    summed = sum_usage_maps([5, {"input": 1}, None])
    assert summed["unreadable"] == ["usage=5"] and summed["input"] == 1


def test_the_budget_percentage_is_decimal_so_a_warning_at_exactly_its_percent_is_given() -> None:
    # $0.30 of $0.40 is 0.7499999999999999 * 100 in binary floats: the 75% warning never came
    check = check_budget(Budget(max_cost_usd=0.4), _report({"cost": {"total": 0.3}}), already_warned=False)
    assert check.percent == 75 and check.warn and not check.limit_hit


def test_anthropics_nested_cache_creation_counts_as_cache_write_tokens_when_no_flat_count_is_given() -> None:
    # Anthropic's usage splits its cache writes by lifetime in a nested object; a usage map giving
    # only that object (its flat cache_creation_input_tokens absent or null) counted no cache writes
    nested = {"ephemeral_5m_input_tokens": 30, "ephemeral_1h_input_tokens": 12}
    for flat in ({}, {"cache_creation_input_tokens": None}):
        usage = {"input_tokens": 100, "output_tokens": 50, "cache_read_input_tokens": 10,
                 "cache_creation": nested, **flat}
        tokens = extract_usage(usage).tokens
        assert (tokens.cacheWrite, tokens.total) == (42, 202)
        assert unreadable_figures(usage) == []
    # the flat count, when given, is Anthropic's own sum of the nested ones: read once
    both = {"input_tokens": 100, "cache_creation_input_tokens": 42, "cache_creation": nested}
    assert extract_usage(both).tokens.cacheWrite == 42
    # an object with no count in it adds nothing
    assert extract_usage({"input_tokens": 1, "cache_creation": {"ephemeral_5m_input_tokens": "3"}}).tokens.total == 1


def test_googles_tool_use_prompt_tokens_count_as_input_so_a_usage_without_a_total_counts_them() -> None:
    # Gemini bills the prompt of a tool call it made itself (toolUsePromptTokenCount) as input, apart
    # from promptTokenCount; read as Pi reads Google's names, a usage without totalTokenCount left it out
    usage = {"usageMetadata": {"promptTokenCount": 100, "candidatesTokenCount": 50, "toolUsePromptTokenCount": 7}}
    tokens = extract_usage(usage).tokens
    assert (tokens.input, tokens.total) == (107, 157)
    with_total = {"usageMetadata": {**usage["usageMetadata"], "totalTokenCount": 157}}
    assert extract_usage(with_total).tokens.total == 157


def test_bedrock_converses_cache_token_names_are_read() -> None:
    # Amazon Bedrock's Converse API names its cache tokens cacheReadInputTokens and
    # cacheWriteInputTokens (its inputTokens leaves them out): they counted as no cache tokens
    usage = {"inputTokens": 100, "outputTokens": 50, "cacheReadInputTokens": 10, "cacheWriteInputTokens": 5}
    tokens = extract_usage(usage).tokens
    assert (tokens.cacheRead, tokens.cacheWrite, tokens.total) == (10, 5, 165)
    assert extract_usage({**usage, "totalTokens": 165}).tokens.total == 165

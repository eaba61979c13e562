"""Provider usage shapes read beyond pi-materia's aliases, and a cost written as a decimal string."""

from __future__ import annotations

import json
from typing import Any

import pytest

from castor.domain.materia.budget import extract_usage, sum_usage_maps, unreadable_figures

# ------------------------------------------------------------------ a cost written as a decimal string


@pytest.mark.parametrize(("usage", "total"), [
    ({"input": 10, "cost": "0.25"}, 0.25),  # OpenRouter-style bare cost, sent as a string by a proxy
    ({"input": 10, "cost": {"total": "0.25"}}, 0.25),
    ({"input": 10, "cost": {"input": "0.1", "output": "0.2"}}, 0.3),  # parts as strings: their decimal sum
    ({"input": 10, "total_cost_usd": "1.5"}, 1.5),
    ({"input": 10, "cost_usd": "3"}, 3),
    ({"input": 10, "cost": ".5"}, 0.5),
    ({"input": 10, "cost": "0"}, 0),
    ({"input": 10, "cost": "1" + "0" * 30}, 1e18),  # as large as castor counts
])
def test_a_cost_written_as_a_decimal_string_counts_as_that_number(usage: dict[str, Any], total: float) -> None:
    assert extract_usage(usage).cost.total == total
    # read as a number, and one past what castor counts is named as counted at the cap, as a number is
    assert unreadable_figures(usage) == ([] if total < 1e18 else [f'cost="{usage["cost"]}" (counted as 10^18)'])
    assert sum_usage_maps([usage, usage])["cost"]["total"] == min(total * 2, 1e18)


@pytest.mark.parametrize("text", ["NaN", "nan", "inf", "Infinity", "-0.25", "+0.25", "1e400", "1e-3", " 0.25",
                                  "0.25 ", "0.25usd", "$0.25", "0,25", "", ".", "1.2.3", "0x10", "٣", "1_000",
                                  "0." + "1" * 500])
def test_a_cost_string_that_is_not_exactly_a_non_negative_decimal_stays_unreadable(text: str) -> None:
    usage = {"input": 10, "cost": {"total": text}}
    assert extract_usage(usage).cost.total == 0
    assert unreadable_figures(usage) and unreadable_figures(usage)[0].startswith("cost.total=")


def test_a_token_count_written_as_a_string_stays_unreadable() -> None:
    """Through Pi a string token count turns its totalTokens into a concatenation ("1050" for 10 +
    "5"): a token string is never read as a number."""
    usage = {"input": 10, "output": "5", "totalTokens": "1050"}
    assert extract_usage(usage).tokens.total == 10
    assert unreadable_figures(usage) == ['output="5"', 'totalTokens="1050"']


# ------------------------------------------------------------------ Cohere v2: billed units and tokens

COHERE = {"billed_units": {"input_tokens": 5, "output_tokens": 418},
          "tokens": {"input_tokens": 71, "output_tokens": 418}}


def test_cohere_v2s_billed_units_are_the_turns_tokens() -> None:
    """Cohere's ``tokens`` also counts what Cohere adds to the prompt itself and does not bill: the
    billed units are what the turn cost, so they win; ``tokens`` is no total and is never named."""
    usage = extract_usage(COHERE)
    assert (usage.tokens.input, usage.tokens.output, usage.tokens.total) == (5, 418, 423)
    assert unreadable_figures(COHERE) == []
    assert sum_usage_maps([COHERE, COHERE])["totalTokens"] == 846


def test_cohere_v2s_tokens_fill_a_part_its_billed_units_lack() -> None:
    usage = extract_usage({"billed_units": {"output_tokens": 7, "search_units": 1}, "tokens": {"input_tokens": 71}})
    assert (usage.tokens.input, usage.tokens.output, usage.tokens.total) == (71, 7, 78)
    only_tokens = extract_usage({"tokens": {"input_tokens": 71, "output_tokens": 418}})
    assert only_tokens.tokens.total == 489


def test_cohere_v2s_cached_tokens_are_part_of_its_input() -> None:
    usage = extract_usage({**COHERE, "cached_tokens": 3})
    assert (usage.tokens.input, usage.tokens.cacheRead, usage.tokens.total) == (5, 3, 423)


def test_a_cohere_map_with_its_own_token_names_keeps_them() -> None:
    usage = extract_usage({**COHERE, "input_tokens": 9, "output_tokens": 1})
    assert (usage.tokens.input, usage.tokens.output) == (9, 1)


@pytest.mark.parametrize("bad", ["5", -1, float("nan"), True, [5], 2**70])
def test_a_malformed_cohere_figure_falls_back_or_is_named(bad: Any) -> None:
    usage = {"billed_units": {"input_tokens": bad, "output_tokens": 2}, "tokens": {"input_tokens": 71}}
    read = extract_usage(usage)
    assert read.tokens.input == (1e18 if bad == 2**70 else 71) and read.tokens.output == 2
    alone = {"billed_units": {"input_tokens": bad, "output_tokens": 2}}
    assert extract_usage(alone).tokens.input == (1e18 if bad == 2**70 else 0)
    if bad != 2**70:
        assert unreadable_figures(alone) == [f"billed_units.input_tokens={json.dumps(bad)}"]


# ------------------------------------------------------------------ Codex: cached input is part of the input


@pytest.mark.parametrize("usage", [
    {"input_tokens": 100, "cached_input_tokens": 20, "output_tokens": 50, "reasoning_output_tokens": 10},
    {"inputTokens": 100, "cachedInputTokens": 20, "outputTokens": 50, "reasoningOutputTokens": 10},
])
def test_codexs_token_count_without_a_total_counts_cached_input_once(usage: dict[str, Any]) -> None:
    """Codex's ``token_count`` (``last_token_usage``) counts ``cached_input_tokens`` inside
    ``input_tokens``, and ``reasoning_output_tokens`` inside ``output_tokens``."""
    read = extract_usage(usage)
    assert (read.tokens.input, read.tokens.cacheRead, read.tokens.output, read.tokens.total) == (100, 20, 50, 150)
    assert sum_usage_maps([usage, usage])["totalTokens"] == 300


def test_a_codex_total_given_is_the_total_and_more_cached_than_input_still_counts_each_token() -> None:
    assert extract_usage({"input_tokens": 100, "cached_input_tokens": 20, "output_tokens": 50,
                          "total_tokens": 170}).tokens.total == 170
    # inconsistent (more cached than input): never less than either figure
    assert extract_usage({"input_tokens": 10, "cached_input_tokens": 30, "output_tokens": 5}).tokens.total == 35

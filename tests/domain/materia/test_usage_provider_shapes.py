"""Provider usage shapes read beyond pi-materia's aliases, and a cost written as a decimal string."""

from __future__ import annotations

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
    assert unreadable_figures(usage) == []
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

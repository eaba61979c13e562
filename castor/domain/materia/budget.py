"""Usage accounting and the budget rule (spec §5.11, §8.3).

- :func:`extract_usage` reads a provider/harness usage map with the many alias spellings and
  never under-reports cost (``total = max(provided, sum of parts)``).
- :func:`check_budget` runs after every ``socket_complete``: warn once at ``warnAtPercent``
  (default 75), then at a limit emit ``budget_limit`` and stop unless ``stopAtLimit is False``.
"""

from __future__ import annotations

import math
from typing import Any

from pydantic import BaseModel, Field

from castor.domain.materia.config import DEFAULT_WARN_AT_PERCENT, Budget

PARTS = ("input", "output", "cacheRead", "cacheWrite")
_TOKEN_ALIASES = {
    "input": ("input", "inputTokens", "input_tokens", "promptTokens", "prompt_tokens"),
    "output": ("output", "outputTokens", "output_tokens", "completionTokens", "completion_tokens"),
    "cacheRead": ("cacheRead", "cacheReadTokens", "cache_read", "cached_tokens", "cache_read_input_tokens"),
    "cacheWrite": ("cacheWrite", "cacheWriteTokens", "cache_write", "cache_creation_input_tokens"),
}
_TOTAL_ALIASES = ("totalTokens", "total", "tokens", "total_tokens")


class Amounts(BaseModel):
    input: float = 0
    output: float = 0
    cacheRead: float = 0
    cacheWrite: float = 0
    total: float = 0

    def plus(self, other: Amounts) -> Amounts:
        return Amounts(**{k: getattr(self, k) + getattr(other, k) for k in (*PARTS, "total")})


class TurnUsage(BaseModel):
    tokens: Amounts = Field(default_factory=Amounts)
    cost: Amounts = Field(default_factory=Amounts)


class TurnRecord(BaseModel):
    socket: str
    materia: str | None = None
    taskId: str | None = None
    attempt: int = 1
    tokens: Amounts
    cost: Amounts
    model: str | None = None


class UsageReport(BaseModel):
    """The ``usage.json`` document (camelCase on purpose: it is written as is)."""

    tokens: Amounts = Field(default_factory=Amounts)
    cost: Amounts = Field(default_factory=Amounts)
    bySocket: dict[str, TurnUsage] = Field(default_factory=dict)
    byMateria: dict[str, TurnUsage] = Field(default_factory=dict)
    byTask: dict[str, TurnUsage] = Field(default_factory=dict)
    byAttempt: dict[str, TurnUsage] = Field(default_factory=dict)
    turns: list[TurnRecord] = Field(default_factory=list)

    def add_turn(self, record: TurnRecord) -> UsageReport:
        out = self.model_copy(deep=True)
        out.tokens = out.tokens.plus(record.tokens)
        out.cost = out.cost.plus(record.cost)
        usage = TurnUsage(tokens=record.tokens, cost=record.cost)

        def bump(table: dict[str, TurnUsage], key: str) -> None:
            cur = table.get(key, TurnUsage())
            table[key] = TurnUsage(tokens=cur.tokens.plus(usage.tokens), cost=cur.cost.plus(usage.cost))

        bump(out.bySocket, record.socket)
        if record.materia:
            bump(out.byMateria, record.materia)
        if record.taskId is not None:
            bump(out.byTask, record.taskId)
            bump(out.byAttempt, f"{record.taskId}:{record.attempt}")
        out.turns.append(record)
        return out


def non_negative_number(value: Any) -> float | None:
    """A finite, non-negative number as a float, else None (a usage figure that was not reported)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
        return None
    return float(value)


def _first(raw: dict[str, Any], names: tuple[str, ...]) -> float | None:
    for name in names:
        value = non_negative_number(raw.get(name))
        if value is not None:
            return value
    return None


def extract_usage(raw: Any) -> TurnUsage:
    """Usage of one assistant turn; anything unreadable counts as 0."""
    if not isinstance(raw, dict):
        return TurnUsage()
    tokens = {part: _first(raw, names) or 0.0 for part, names in _TOKEN_ALIASES.items()}
    total = _first(raw, _TOTAL_ALIASES)
    tokens["total"] = total if total is not None else sum(tokens[p] for p in PARTS)
    cost_raw = raw.get("cost") if isinstance(raw.get("cost"), dict) else {}
    cost: dict[str, float] = {}
    for part in PARTS:
        snake = {"cacheRead": "cache_read", "cacheWrite": "cache_write"}.get(part, part)
        cost[part] = (non_negative_number(cost_raw.get(part)) or non_negative_number(raw.get(f"{part}Cost"))
                      or non_negative_number(raw.get(f"{snake}_cost_usd")) or 0.0)
    provided = non_negative_number(cost_raw.get("total"))
    if provided is None:
        provided = non_negative_number(raw.get("totalCost")) or non_negative_number(raw.get("total_cost_usd")) or non_negative_number(raw.get("costUsd"))
    if provided is None and non_negative_number(raw.get("cost")) is not None:
        provided = non_negative_number(raw.get("cost"))
    parts_sum = sum(cost[p] for p in PARTS)
    cost["total"] = max(provided or 0.0, parts_sum)
    return TurnUsage(tokens=Amounts(**tokens), cost=Amounts(**cost))


class BudgetCheck(BaseModel):
    percent: float
    warn: bool
    limit_hit: bool
    over_token: bool
    over_cost: bool
    stop: bool


def check_budget(budget: Budget, report: UsageReport, *, already_warned: bool) -> BudgetCheck:
    """Where ``report`` stands against ``budget``: the percentage used (the larger of tokens and
    cost), whether to warn now (once, at ``warnAtPercent``), and whether a limit is hit."""
    tokens_ratio = report.tokens.total / budget.max_tokens if budget.max_tokens else 0.0
    cost_ratio = report.cost.total / budget.max_cost_usd if budget.max_cost_usd else 0.0
    percent = max(tokens_ratio, cost_ratio) * 100
    warn_at = budget.warn_at_percent if budget.warn_at_percent is not None else DEFAULT_WARN_AT_PERCENT
    over_token = bool(budget.max_tokens) and report.tokens.total >= budget.max_tokens
    over_cost = bool(budget.max_cost_usd) and report.cost.total >= budget.max_cost_usd
    limit_hit = over_token or over_cost
    return BudgetCheck(
        percent=percent,
        warn=(not already_warned) and (budget.max_tokens or budget.max_cost_usd) is not None
        and bool(budget.max_tokens or budget.max_cost_usd) and percent >= warn_at,
        limit_hit=limit_hit,
        over_token=over_token,
        over_cost=over_cost,
        stop=limit_hit and budget.stop_at_limit is not False,
    )

"""Proactive compaction decision (spec §6.5), for the actor to call before a non-recovery send.

The engine cannot see the host's context usage, so a :class:`RunAgentTurn` effect carries
``proactive_compaction=True`` and the actor calls :func:`decide_proactive` with the usage it
reads from the host. A non-None decision means: emit ``proactive_compaction_start`` with
``decision.event_data()``, compact, then ``_complete`` / ``_failed{warning:true}`` — and send the
turn either way.
"""

from __future__ import annotations

import math
from typing import Any

from pydantic import BaseModel

from castor.domain.materia.config import Compaction

DEFAULT_TIERS = (("lt-128k", 0, 128_000, 75.0), ("128k-to-199999", 128_000, 200_000, 65.0),
                 ("gte-200k", 200_000, None, 55.0))


class Threshold(BaseModel):
    percent: float
    mode: str  # single_percent | configured_tiered | default_tiered
    tier: str | None = None


def _positive(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
        return None
    return float(value)


def threshold_for(config: Compaction | None, context_window: float | None) -> Threshold:
    if config and config.proactive_threshold_percent is not None:
        return Threshold(percent=config.proactive_threshold_percent, mode="single_percent")
    if config and config.proactive_threshold_tiers:
        for i, tier in enumerate(config.proactive_threshold_tiers):
            hi = tier.max_context_window
            if context_window is not None and tier.min_context_window <= context_window and (hi is None or context_window < hi):
                return Threshold(percent=tier.threshold_percent, mode="configured_tiered", tier=tier.id or f"tier-{i}")
    for tier_id, lo, hi, pct in DEFAULT_TIERS:
        if context_window is not None and lo <= context_window and (hi is None or context_window < hi):
            return Threshold(percent=pct, mode="default_tiered", tier=tier_id)
    return Threshold(percent=55.0, mode="default_tiered", tier="gte-200k")


class ProactiveDecision(BaseModel):
    threshold: Threshold
    tokens: float | None
    context_window: float | None
    percent: float

    def event_data(self) -> dict[str, Any]:
        return {"action": "compact", "reason": "context_pressure", "thresholdPercent": self.threshold.percent,
                "thresholdMode": self.threshold.mode, "thresholdTier": self.threshold.tier,
                "tokens": self.tokens, "contextWindow": self.context_window, "percent": self.percent}


def decide_proactive(
    usage: dict[str, Any] | None, *, model_context_window: float | None, config: Compaction | None
) -> ProactiveDecision | None:
    """None = no compaction needed (or usage unknown)."""
    if not isinstance(usage, dict):
        return None
    cw = _positive(model_context_window) or _positive(usage.get("contextWindow"))
    tokens = _positive(usage.get("tokens"))
    threshold = threshold_for(config, cw)
    if tokens is not None and cw is not None:
        percent = tokens / cw * 100
    else:
        pct = usage.get("percent")
        if isinstance(pct, bool) or not isinstance(pct, (int, float)):
            return None
        percent = float(pct)
    if percent < threshold.percent:
        return None
    return ProactiveDecision(threshold=threshold, tokens=tokens, context_window=cw, percent=percent)

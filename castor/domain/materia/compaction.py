"""Host-context compaction rules: the proactive decision and the result summary.

The engine cannot see the host's context usage, so a :class:`RunAgentTurn` effect carries
``proactive_compaction=True`` and the actor calls :func:`decide_proactive` with the usage it
reads from the host. A non-None decision means: tell the cast ``ProactiveCompactionStarted``
(the engine emits ``proactive_compaction_start`` with ``decision.event_data()``), compact, tell
``ProactiveCompactionFinished`` (``_complete{result}`` / ``_failed{error, warning:true}``) — and
send the turn either way.

| usage read from the host | decision |
|---|---|
| None (no host context, harness does not say) | None: skip, no events |
| ``tokens`` and a context window known | ``percent = tokens / cw * 100`` against the threshold |
| only ``percent`` | that percent against the threshold |
| neither | None: skip |
| percent below the threshold | None: skip |
| at or above | a :class:`ProactiveDecision` |

:func:`compaction_summary` is the one place that cuts a host's compaction result down to the
fields the spec keeps (``tokensBefore, tokensAfter, entriesRemoved, summaryTokens,
firstKeptEntryId``); a field of the wrong type is dropped, never passed on.
"""

from __future__ import annotations

import math
from typing import Any

from pydantic import BaseModel, ConfigDict

from castor.domain.materia.config import Compaction

DEFAULT_TIERS = (("lt-128k", 0, 128_000, 75.0), ("128k-to-199999", 128_000, 200_000, 65.0),
                 ("gte-200k", 200_000, None, 55.0))


#: The compaction result fields kept in events; everything else a host sends is dropped.
SUMMARY_NUMBERS = ("tokensBefore", "tokensAfter", "entriesRemoved", "summaryTokens")
SUMMARY_KEYS = (*SUMMARY_NUMBERS, "firstKeptEntryId")
#: What a proactive compaction asks the host to keep (the recovery one is
#: ``engine.COMPACTION_INSTRUCTIONS``).
PROACTIVE_COMPACTION_INSTRUCTIONS = (
    "Compact the conversation before the next turn of an active materia cast. Preserve the active cast "
    "state, the requirements of the current task and every durable artifact and event reference the next "
    "turn needs."
)
#: The ``skipped`` marker of a compaction answered by a host that has no accumulated context.
NO_HOST_CONTEXT = "no host context"


def compaction_summary(result: Any) -> dict[str, Any]:
    """The spec's result summary of a host compaction result.

    Keeps only :data:`SUMMARY_KEYS`; the counts must be finite non-negative numbers (ints stay
    ints) and ``firstKeptEntryId`` a non-empty string, else the field is left out. Anything that
    is not a map gives ``{}``.
    """
    if not isinstance(result, dict):
        return {}
    out: dict[str, Any] = {}
    for key in SUMMARY_NUMBERS:
        value = result.get(key)
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            continue
        if isinstance(value, float) and not math.isfinite(value):
            continue
        if value >= 0:
            out[key] = value
    kept = result.get("firstKeptEntryId")
    if isinstance(kept, str) and kept:
        out["firstKeptEntryId"] = kept
    return out


class Threshold(BaseModel):
    """The proactive compaction threshold for one context window.

    ``tier`` is the matched tier's id (None when it has none, or when no tier matched);
    ``tier_min``/``tier_max`` its context-window bounds (``tier_min`` None: no tier matched, as for an
    unknown window, which falls back to 55%). :meth:`event_tier` is the tier record the events carry.
    """

    model_config = ConfigDict(frozen=True)

    percent: float
    mode: str  # single_percent | configured_tiered | default_tiered
    tier: str | None = None
    tier_min: int | None = None
    tier_max: int | None = None

    def event_tier(self) -> dict[str, Any] | None:
        """``thresholdTier`` as pi-materia records it: ``{id?, minContextWindow, maxContextWindow?}``
        (an absent id or upper bound is left out), or None when no tier matched."""
        if self.tier_min is None:
            return None
        out: dict[str, Any] = {}
        if self.tier is not None:
            out["id"] = self.tier
        out["minContextWindow"] = self.tier_min
        if self.tier_max is not None:
            out["maxContextWindow"] = self.tier_max
        return out


def _positive(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
        return None
    return float(value)


def _known(value: Any) -> float | None:
    """A context window a configured tier can match: a finite number >= 0 (0 is in the first tier)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
        return None
    return float(value)


#: No usable context window: the most conservative default, and no tier.
FALLBACK_PERCENT = 55.0


def threshold_for(config: Compaction | None, context_window: float | None) -> Threshold:
    """The threshold for ``context_window``: a configured single percent wins; then the configured
    tier holding the window; then the default tiers. A window that is unknown, not finite or not
    positive gets :data:`FALLBACK_PERCENT` with no tier (compact early rather than overflow)."""
    if config and config.proactive_threshold_percent is not None:
        return Threshold(percent=config.proactive_threshold_percent, mode="single_percent")
    known = _known(context_window)
    if config and config.proactive_threshold_tiers and known is not None:
        for tier in config.proactive_threshold_tiers:
            hi = tier.max_context_window
            if tier.min_context_window <= known and (hi is None or known < hi):
                return Threshold(percent=tier.threshold_percent, mode="configured_tiered", tier=tier.id,
                                 tier_min=tier.min_context_window, tier_max=hi)
    window = _positive(context_window)
    if window is not None:
        for tier_id, lo, hi, pct in DEFAULT_TIERS:
            if lo <= window and (hi is None or window < hi):
                return Threshold(percent=pct, mode="default_tiered", tier=tier_id, tier_min=lo, tier_max=hi)
    return Threshold(percent=FALLBACK_PERCENT, mode="default_tiered")


class ProactiveDecision(BaseModel):
    """Why and at what threshold a proactive compaction runs; travels in the engine's events."""

    model_config = ConfigDict(frozen=True)

    threshold: Threshold
    tokens: float | None
    context_window: float | None
    percent: float

    def event_data(self) -> dict[str, Any]:
        data: dict[str, Any] = {"action": "compact", "reason": "context_pressure",
                                "thresholdPercent": self.threshold.percent, "thresholdMode": self.threshold.mode}
        tier = self.threshold.event_tier()
        if tier is not None:  # no tier matched (an unknown window): the key is absent, as in pi-materia
            data["thresholdTier"] = tier
        data.update({"tokens": self.tokens, "contextWindow": self.context_window, "percent": self.percent})
        return data


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

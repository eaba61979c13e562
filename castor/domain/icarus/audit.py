"""The ``icarus-context-filter`` audit entry and the release rule.

Privacy guarantees (enforced by construction, proven by a property test):

* The entry never holds the prompt, any span text, the raw name of an unknown
  section, or provider error text. It holds only enumerated codes, counts,
  lengths, rounded confidences, the model's provider/id (configuration, not
  context), a timestamp and a duration.
* Span ids are synthetic (``s1..sN`` in text order) and local to one entry.
* Usage the provider did not report is ``null`` (unknown), never zero; each
  unknown field inside a reported usage is ``null`` too, and a usage with no
  figure known at all (a harness that always sends the map) is ``null``.

Release rule (:func:`release`): filtered text may be handed back only after
its audit was persisted. If persisting failed, the *original* context is
released and a warning is due -- text is never discarded without a trail.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from castor.domain.icarus.classify import (
    ClassifierUsage,
    FilterResult,
    Outcome,
    Reason,
    SpanDecision,
)
from castor.domain.icarus.spans import PieceKind

CUSTOM_TYPE = "icarus-context-filter"
AUDIT_VERSION: Literal[1] = 1
#: Confidences are rounded in the audit: enough to explain a decision, and it
#: keeps an arbitrary float from the provider from becoming a side channel.
CONFIDENCE_DIGITS = 3


class _Model(BaseModel):
    model_config = ConfigDict(frozen=True, populate_by_name=True, extra="forbid")


class AuditClassifier(_Model):
    provider: str
    model: str
    local: bool
    selection: Literal["default", "exact"]


class AuditSpan(_Model):
    id: str
    kind: Literal["protected", "candidate"]
    section: str
    chars: int
    decision: SpanDecision
    confidence: float | None = None


class AuditCounts(_Model):
    candidates: int
    kept: int
    rejected: int
    unclassified: int
    protected: int


class AuditChars(_Model):
    original: int
    injected: int


class AuditEntry(_Model):
    """Version 1 of the audit schema (documented in docs/icarus.md "Audit")."""

    version: Literal[1] = AUDIT_VERSION
    at: str
    outcome: Outcome
    reason: Reason | None
    classifier: AuditClassifier | None
    spans: tuple[AuditSpan, ...]
    injected_ids: tuple[str, ...] = Field(alias="injectedIds")
    counts: AuditCounts
    chars: AuditChars
    usage: ClassifierUsage | None
    duration_ms: int | None = Field(alias="durationMs")

    def to_data(self) -> dict[str, Any]:
        """The JSON-ready ``data`` of the session entry (camelCase keys, nulls kept)."""
        return self.model_dump(mode="json", by_alias=True)


def iso_utc(at: datetime) -> str:
    """``2026-11-29T18:00:00.000Z`` (milliseconds, UTC)."""
    utc = at.astimezone(UTC) if at.tzinfo else at.replace(tzinfo=UTC)
    return utc.strftime("%Y-%m-%dT%H:%M:%S.") + f"{utc.microsecond // 1000:03d}Z"


def build_audit(result: FilterResult, *, at: datetime, duration_ms: int | None) -> AuditEntry:
    """The audit entry for one filtering result. Never reads span text."""
    spans: list[AuditSpan] = []
    injected: list[str] = []
    for n, v in enumerate(result.verdicts, start=1):
        sid = f"s{n}"
        conf = None if v.confidence is None else round(v.confidence, CONFIDENCE_DIGITS)
        kind: Literal["protected", "candidate"] = (
            "candidate" if v.piece.kind is PieceKind.CANDIDATE else "protected"
        )
        spans.append(AuditSpan(id=sid, kind=kind, section=v.piece.section, chars=v.piece.chars,
                               decision=v.decision, confidence=conf))
        if result.injected and v.decision is not SpanDecision.REJECT:
            injected.append(sid)
    decisions = [v.decision for v in result.verdicts]
    candidates = sum(1 for v in result.verdicts if v.piece.kind is PieceKind.CANDIDATE)
    sel = result.selection
    classifier = None
    if sel is not None and sel.model is not None and sel.selection in ("default", "exact"):
        classifier = AuditClassifier(provider=sel.model.provider, model=sel.model.id,
                                     local=sel.model.local, selection=sel.selection)
    return AuditEntry(
        at=iso_utc(at),
        outcome=result.outcome,
        reason=result.reason,
        classifier=classifier,
        spans=tuple(spans),
        injected_ids=tuple(injected),
        counts=AuditCounts(
            candidates=candidates,
            kept=decisions.count(SpanDecision.KEEP),
            rejected=decisions.count(SpanDecision.REJECT),
            unclassified=decisions.count(SpanDecision.UNCLASSIFIED),
            protected=decisions.count(SpanDecision.PROTECTED),
        ),
        chars=AuditChars(original=result.original_chars, injected=result.text_len),
        usage=result.usage if result.usage is not None and result.usage.reported else None,
        duration_ms=None if duration_ms is None else max(0, int(duration_ms)),
    )


def unconfirmed(entry: AuditEntry) -> AuditEntry:
    """The correcting entry for ``entry`` (a ``filtered`` one) whose persistence castor could not
    confirm in time, so that it released the original context: the same decision (``at``, classifier,
    spans with their decisions, usage, duration) as ``outcome: fallback``, ``reason:
    audit_unconfirmed``, every span injected and ``chars.injected`` the original's length. Read after
    a ``filtered`` entry with the same ``at``, it says that entry's filtering was not applied."""
    return entry.model_copy(update={
        "outcome": Outcome.FALLBACK, "reason": Reason.AUDIT_UNCONFIRMED,
        "injected_ids": tuple(span.id for span in entry.spans),
        "chars": AuditChars(original=entry.chars.original, injected=entry.chars.original)})


def needs_audit(result: FilterResult | None) -> bool:
    """Whether an audit *must* be persisted before the text is released.

    Required whenever filtering could discard text (``filtered``). Fallbacks,
    ``no_candidates`` and ``aborted`` release the original or nothing, so their
    audit is best effort. ``None`` (classifier ``none``) has no audit.
    """
    return result is not None and result.outcome is Outcome.FILTERED


def release(original: str, result: FilterResult | None, *, persisted: bool) -> tuple[str | None, bool]:
    """What to hand back, and whether a warning is due.

    * ``None`` result (classifier ``none``): the original, no warning.
    * a result whose audit is required but not persisted: the original
      (nothing is discarded without a trail) and a warning.
    * otherwise: the result's text (``None`` means inject nothing).
    """
    if result is None:
        return (original if original.strip() else None), False
    if needs_audit(result) and not persisted:
        return (original if original.strip() else None), True
    return result.text, False

"""Turn-failure classification and the same-socket recovery bound (pi-materia's rules).

:func:`classify_turn_failure` — precedence (first match wins):

| # | class | when | recovery |
|---|---|---|---|
| 1 | ``context_window`` | a context-overflow phrase (``context_length_exceeded``, ``context window``, ``token limit``, ``max tokens``, ``input too long``, ``request too large``, ``too many tokens``...) or an embedded provider error whose code/type says so | compact, then resend the same prompt |
| 2 | ``tool_timeout`` | ``tool/bash/command timed out`` or ``timed out after N / waiting for / during`` | resend, no compaction; allowance at least 3 |
| 3 | ``transient_transport`` | the message *ends* (after the start or a colon) with a WebSocket drop (``WebSocket error/closed/...``), ``stream ended without finish_reason``, or a bare ``terminated`` — and does **not** embed a structured provider error payload (``error: {`` / ``{"type":"error"``) | none: the cast stays active and awaiting, a warning event, nothing resent |
| 4 | ``turn_failure`` | only when the caller allows it (castor: the turn produced no assistant text) and the message is not an auth / permission / invalid-request / quota / billing error and embeds no provider payload | resend, no compaction |
| 5 | ``None`` | anything else | terminal: the cast fails |

Recovery is bounded per key ``[mode, socket, itemKey|"__singleton__", visit, refinementTurn]``
by an allowance (original/effective max attempts, revive count). ``revive`` raises the effective
maximum additively (see :mod:`.revive`).
"""  # noqa: E501 - table rows cannot wrap

from __future__ import annotations

import json
import re
from typing import Any, Literal

from pydantic import BaseModel

FailureClass = Literal["context_window", "tool_timeout", "transient_transport", "turn_failure"]
RECOVERABLE: tuple[str, ...] = ("context_window", "tool_timeout", "turn_failure")
MIN_ALLOWANCE = {"context_window": 1, "tool_timeout": 3, "turn_failure": 1}

_CONTEXT = re.compile(
    r"context[_-]?length[_-]?exceeded|context[_-]?window[_-]?exceeded|context (window|length|limit|overflow)"
    r"|token limit|max(imum)? tokens|input too long|request too large|too many tokens",
    re.IGNORECASE,
)
_TOOL_TIMEOUT = re.compile(
    r"\b(tool([_ -]call)?|bash|command)\s+timed?\s*out\b|\btimed?\s*out\s+(after\s+\d+|waiting for|during)\b",
    re.IGNORECASE,
)
_WEBSOCKET = re.compile(
    r"(^|:\s*)(error:\s*)?websocket (error|closed|close|connection (closed|error|lost)|disconnected)(\s+\d{3,4})?\.?$",
    re.IGNORECASE,
)
_STREAM_ENDED = re.compile(r"stream ended without finish[_-]?reason\.?$", re.IGNORECASE)
_TERMINATED = re.compile(r"(^|:\s*)terminated\.?$", re.IGNORECASE)
_EMBEDDED_PAYLOAD = re.compile(r"error:\s*\{|\{\s*\"type\"\s*:\s*\"error\"", re.IGNORECASE)
_NOT_RETRYABLE = re.compile(
    r"auth|unauthori[sz]ed|forbidden|permission|invalid[_ ]request|invalid api key|api[_ ]key|quota|billing"
    r"|insufficient|\b40[0-4]\b",
    re.IGNORECASE,
)


def _collapse(message: str) -> str:
    return re.sub(r"\s+", " ", message.strip())


def _embedded_provider_error(message: str) -> dict[str, Any] | None:
    """The first JSON object embedded in the message, if it looks like a provider error."""
    start = message.find("{")
    while start != -1:
        try:
            value, _ = json.JSONDecoder().raw_decode(message, start)
        except ValueError:
            start = message.find("{", start + 1)
            continue
        if isinstance(value, dict):
            inner = value.get("error") if isinstance(value.get("error"), dict) else value
            return inner
        start = message.find("{", start + 1)
    return None


def has_embedded_provider_payload(message: str) -> bool:
    return _EMBEDDED_PAYLOAD.search(message) is not None


def classify_turn_failure(message: str, *, allow_generic: bool = False) -> FailureClass | None:
    """Classify an agent-turn failure message (see the module table)."""
    msg = _collapse(str(message or ""))
    if _CONTEXT.search(msg):
        return "context_window"
    payload = _embedded_provider_error(msg)
    if payload is not None:
        signal = " ".join(str(payload.get(k, "")) for k in ("code", "type", "param", "message"))
        if _CONTEXT.search(signal):
            return "context_window"
    if _TOOL_TIMEOUT.search(msg):
        return "tool_timeout"
    embedded = has_embedded_provider_payload(msg)
    if not embedded and (_STREAM_ENDED.search(msg) or _TERMINATED.search(msg) or _WEBSOCKET.search(msg)):
        return "transient_transport"
    if allow_generic and msg and not embedded and not _NOT_RETRYABLE.search(msg):
        return "turn_failure"
    return None


class RecoveryAllowance(BaseModel):
    original_max_attempts: int = 1
    effective_max_attempts: int = 1
    revive_count: int = 0

    def valid(self) -> bool:
        return (self.original_max_attempts > 0 and self.effective_max_attempts >= self.original_max_attempts
                and self.revive_count >= 0)


def recovery_key(mode: str, socket_id: str, item_key: str | None, visit: int, refinement_turn: int) -> str:
    """Deliberate difference: the refinement turn is the real one, not always 0."""
    return json.dumps([mode, socket_id, item_key if item_key is not None else "__singleton__", visit,
                       refinement_turn], separators=(",", ":"))


def allowance_for(existing: RecoveryAllowance | None, failure: str) -> RecoveryAllowance:
    """The allowance to use for ``failure`` on a key: created at the class minimum, or an
    existing one lifted to that minimum (keeps ``revive`` additive on the lifted original)."""
    minimum = MIN_ALLOWANCE.get(failure, 1)
    if existing is None:
        return RecoveryAllowance(original_max_attempts=minimum, effective_max_attempts=minimum)
    if existing.original_max_attempts >= minimum:
        return existing
    return existing.model_copy(update={"original_max_attempts": minimum,
                                       "effective_max_attempts": max(existing.effective_max_attempts, minimum)})


class RecoveryDecision(BaseModel):
    retry: bool
    attempt: int  # the attempt number of the retry (prev + 1), or prev when exhausted
    allowance: RecoveryAllowance
    compact: bool


def decide_recovery(failure: str, previous_attempts: int, allowance: RecoveryAllowance) -> RecoveryDecision:
    if previous_attempts >= allowance.effective_max_attempts:
        return RecoveryDecision(retry=False, attempt=previous_attempts, allowance=allowance, compact=False)
    return RecoveryDecision(retry=True, attempt=previous_attempts + 1, allowance=allowance,
                            compact=failure == "context_window")

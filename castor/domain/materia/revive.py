"""Revive eligibility and the additive allowance rule.

Eligible only when the cast is inactive and failed, carries same-socket recovery exhaustion
metadata with a key, that metadata's ``failed_reason`` equals the cast's ``failed_reason`` (no
stale metadata), and the key's allowance is valid. Reviving adds ``original_max_attempts`` to
the effective maximum (linear growth: 1→2→3, 2→4→6) and counts the revive; no other key changes.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel

from castor.domain.materia.failures import RecoveryAllowance
from castor.domain.materia.surface import command
from castor.messages.errors import Conflict


class RecoveryExhaustion(BaseModel):
    kind: Literal["same_socket_recovery_exhausted"] = "same_socket_recovery_exhausted"
    reason: str
    key: str
    attempts: int
    original_max_attempts: int
    effective_max_attempts: int
    revive_count: int
    failed_reason: str
    socket: str
    item_key: str | None = None
    mode: str
    exhausted_at: float


class NotRevivable(Conflict):
    """``data["reason"]``: ``active`` | ``not-failed`` | ``missing-metadata`` | ``stale-metadata`` |
    ``bad-allowance``."""


class ReviveGrant(BaseModel):
    key: str
    prior_effective_max_attempts: int
    increment: int
    allowance: RecoveryAllowance


def _reject(cast_id: str, reason: str, text: str, surface: str | None) -> NotRevivable:
    # Only a failed cast can be recast: never point at a command that would refuse too.
    hint = "" if reason in ("active", "not-failed") else f" Use {command(surface, 'recast', cast_id)} instead."
    return NotRevivable(f"pi-materia cast {cast_id} is not revivable: {text}.{hint}", data={"reason": reason})


def grant_revive(
    *,
    cast_id: str,
    active: bool,
    failed: bool,
    failed_reason: str | None,
    exhaustion: RecoveryExhaustion | None,
    allowances: dict[str, RecoveryAllowance],
    surface: str | None = "harness",
) -> ReviveGrant:
    """Check eligibility and compute the new allowance. Raises NotRevivable."""
    if active:
        raise _reject(cast_id, "active", "it is still active", surface)
    if not failed:
        raise _reject(cast_id, "not-failed", "it has not failed", surface)
    if exhaustion is None or not exhaustion.key:
        raise _reject(
            cast_id, "missing-metadata", "missing structured same-socket recovery exhaustion metadata", surface
        )
    if exhaustion.failed_reason != failed_reason:
        raise _reject(cast_id, "stale-metadata",
                      "its recovery exhaustion metadata does not match the current terminal failure", surface)
    allowance = allowances.get(exhaustion.key)
    if allowance is None or not allowance.valid():
        raise _reject(cast_id, "bad-allowance", "recovery allowance metadata is missing or invalid", surface)
    increment = allowance.original_max_attempts
    new = allowance.model_copy(update={
        "effective_max_attempts": allowance.effective_max_attempts + increment,
        "revive_count": allowance.revive_count + 1,
    })
    return ReviveGrant(key=exhaustion.key, prior_effective_max_attempts=allowance.effective_max_attempts,
                       increment=increment, allowance=new)

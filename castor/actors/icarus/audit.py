"""AuditActor: persist the filter decision before filtered text is released.

One per session. Given the original context and a
:class:`~castor.domain.icarus.classify.FilterResult`, it builds the
``icarus-context-filter`` entry (:mod:`castor.domain.icarus.audit`), appends
it through :class:`~castor.ports.session.SessionPort` and only then
releases text.

Guarantees
----------
* Filtered text (``outcome: filtered``) leaves this actor **only after** the
  session port acknowledged the entry. If the append raises or misses its
  deadline (``audit_timeout`` seconds, default 2.0), the **original** context
  is released instead and a warning is attempted through the UI port
  (failures of the warning itself are swallowed).
* A ``filtered`` entry is sent to expire at the deadline (``expires=True``: a harness must
  refuse it after). When it is not confirmed, a correcting entry (``fallback``,
  ``audit_unconfirmed``, same ``at``, every span injected) is appended best effort after the
  release, so that an entry the harness persisted late, past its expiry, is not the record's
  last word on what was injected.
* Fallback, ``no_candidates`` and ``aborted`` entries are best effort: their
  text is the original or nothing, so a failed append only logs.
* Nothing it logs or notifies contains context, prompt or provider text.
"""

from __future__ import annotations

import time
from datetime import UTC, datetime
from typing import Any

from castor.actors.icarus.classifier import run_bounded
from castor.actors.icarus.messages import AuditAndRelease, Released
from castor.domain.icarus.audit import CUSTOM_TYPE, AuditEntry, build_audit, needs_audit, release, unconfirmed
from castor.domain.icarus.classify import FilterResult
from castor.ports.session import SessionPort, SessionUiPort
from castor.supervision import Actor, handles
from castor.supervision.threads import start_thread

DEFAULT_AUDIT_TIMEOUT = 2.0
AUDIT_WARNING = (
    "Icarus context filter: the decision audit could not be saved, "
    "so the unfiltered memory context was kept."
)


class AuditActor(Actor):
    def __init__(
        self,
        session: SessionPort,
        ui: SessionUiPort | None = None,
        *,
        audit_timeout: float = DEFAULT_AUDIT_TIMEOUT,
        clock: Any = None,
    ) -> None:
        super().__init__()
        self.session = session
        self.ui = ui
        self.audit_timeout = audit_timeout
        self._now = clock or (lambda: datetime.now(UTC))

    @handles(AuditAndRelease)
    def audit_and_release(self, msg: AuditAndRelease) -> Released:
        result: FilterResult | None = msg.result
        if result is None:
            text, _ = release(msg.original, None, persisted=False)
            return Released(text=text, persisted=False, warned=False)
        entry = build_audit(result, at=self._now(), duration_ms=msg.duration_ms)
        required = needs_audit(result)
        persisted = self._append(entry.to_data(), required=required)
        text, warn = release(msg.original, result, persisted=persisted)
        if warn:
            self._warn()
            if required:
                self._correct(entry)
        return Released(text=text, persisted=persisted, warned=warn)

    def _append(self, data: dict[str, Any], *, required: bool) -> bool:
        try:
            deadline = time.monotonic() + self.audit_timeout
            # A required entry expires at the deadline: the harness is told to refuse it after.
            # Bounded even if the port ignores its deadline (see _correct for a late ack).
            run_bounded(lambda: self.session.append_entry(CUSTOM_TYPE, data, deadline, expires=required),
                        deadline, None, owner=self.path)
            return True
        except Exception as exc:  # noqa: BLE001 - any failure means "not persisted"
            self.log.bind(required=required, error=type(exc).__name__).warning("filter audit not persisted")
            return False

    def _correct(self, entry: AuditEntry) -> None:
        """After a required entry was not confirmed (the original text released): append, best
        effort and off this turn's path, the correcting entry that says so (:func:`unconfirmed`).
        The first entry may still be in the session -- a harness that ignores its expiry and
        acknowledged late, or one whose refusal never came back -- and would read ``filtered``; the
        correction after it makes the record say what was injected. Sent always, since castor
        cannot tell: where the first was refused, the correction is the only entry, and true."""
        data = unconfirmed(entry).to_data()
        start_thread(lambda: self._append(data, required=False), name="icarus-audit-correction",
                     owner=self.path, purpose="correct an unconfirmed filter audit in the session")

    def _warn(self) -> None:
        if self.ui is None:
            return
        try:
            self.ui.notify(AUDIT_WARNING, "warning")
        except Exception as exc:  # noqa: BLE001 - a failed toast never fails the turn
            self.log.bind(error=type(exc).__name__).warning("audit warning could not be shown")

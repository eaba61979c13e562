"""The Icarus session component: one memory bridge per harness session.

``icarus_component(backend)`` is the :class:`~castor.ports.session_component.SessionComponent`
that :mod:`castor.composition` loads by default. For every session it resolves the effective
settings from the session's cwd (a project layer only when the harness said
the project is trusted, so an untrusted checkout never chooses the Python
executable or the package) and, when the configured ``icarusDir`` holds a
package, starts::

    /root/session/<sid>/icarus              supervisor (one_for_one)
    /root/session/<sid>/icarus/worker       IcarusWorkerActor (lazy process; retires on timeout)
    /root/session/<sid>/icarus/classifier   ClassifierActor   (only when filtering)
    /root/session/<sid>/icarus/audit        AuditActor        (only when filtering)
    /root/session/<sid>/icarus/hooks        HookController

and keeps an :class:`~castor.actors.icarus.session.IcarusSession` facade in ``SessionContext.extras["icarus"]``
for the endpoint methods (``icarus.tool``, ``icarus.command``,
``icarus.config``, ``ops.worker``).

What the facade does with each harness event, and what it guarantees, is
documented in :mod:`castor.actors.icarus.session`.

Layering: actors do not import adapters. Files and processes are reached
through the :class:`~castor.ports.icarus_backend.IcarusBackend` port given to
``icarus_component(backend)``; :mod:`castor.composition` passes the file and
process one in.
"""

from __future__ import annotations

from typing import Any

from castor._log import logger
from castor.actors.icarus.session import COMPONENT, EXTRAS_KEY, IcarusSession
from castor.messages.errors import NotFound
from castor.ports.icarus_backend import IcarusBackend
from castor.ports.session_component import EarlyAnswer, SessionComponent, SessionContext
from castor.supervision import ChildSpec


class _NoUi:
    """The harness has no UI: status and toasts go nowhere."""

    def send_message(self, custom_type: str, content: str, *, display: bool, trigger_turn: bool = False) -> None:
        pass

    def set_status(self, key: str, text: str | None) -> None:
        pass

    def notify(self, message: str, level: str = "info", *, code: str | None = None) -> None:
        pass


# ---------------------------------------------------------------------------
# The component


def _build_session(ctx: SessionContext, backend: IcarusBackend) -> IcarusSession:
    info = ctx.info
    settings = backend.load_settings(info.cwd, trusted=info.trusted)
    available = backend.package_present(settings.icarus_dir)
    filtering, filtering_reason = True, None
    if settings.classifier.strip().lower() == "none":
        filtering, filtering_reason = False, "classifier_none"
    elif ctx.harness.session_log is None:
        filtering, filtering_reason = False, "no_session_log"
    return IcarusSession(
        ctx=ctx, backend=backend, settings=settings, available=available,
        reason=None if available else "icarus_dir_missing",
        filtering=filtering and available, filtering_reason=filtering_reason if available else "icarus_unavailable",
        ui=ctx.harness.ui or _NoUi(),
    )


def session_of(ctx: SessionContext) -> IcarusSession:
    """The session's Icarus facade; ``NotFound`` when the component is not loaded."""
    sess = ctx.extras.get(EXTRAS_KEY)
    if not isinstance(sess, IcarusSession):
        raise NotFound("the icarus component is not loaded in this runtime",
                       data={"session_id": ctx.info.session_id, "reason": "no_icarus_component"})
    return sess


def icarus_component(backend: IcarusBackend) -> SessionComponent:
    """The Icarus session component (see the module docstring) over ``backend``, its files and
    processes (:func:`castor.composition.icarus_component` gives it the file/process one)."""
    chosen = backend

    def children(ctx: SessionContext) -> list[ChildSpec]:
        sess = _build_session(ctx, chosen)
        ctx.extras[EXTRAS_KEY] = sess
        if not sess.available:
            logger.bind(actor=sess.path(), reason=sess.reason).debug("icarus unavailable for this session")
        return sess.children()

    def on_event(ctx: SessionContext, event: str, data: dict[str, Any], *,
                 answer: EarlyAnswer | None = None) -> dict[str, Any] | None:
        sess = ctx.extras.get(EXTRAS_KEY)
        return sess.event(event, data, answer=answer) if isinstance(sess, IcarusSession) else None

    def on_close(ctx: SessionContext) -> None:
        sess = ctx.extras.get(EXTRAS_KEY)
        if isinstance(sess, IcarusSession):
            sess.close()

    return SessionComponent(name=COMPONENT, children=children, on_event=on_event, on_close=on_close,
                            answers_early=True)


__all__ = ["COMPONENT", "icarus_component", "session_of"]

"""The one call the endpoint methods and the CLI use to reach a session's SessionActor."""

from __future__ import annotations

from typing import Any

from castor.actors.materia.messages import SessionCall
from castor.messages.errors import NotFound
from castor.supervision.supervisor import WhichChildren

DEFAULT_TIMEOUT_S = 15.0


def session_actor(runtime: Any, session_id: str) -> Any:
    """The handle of ``/root/session/<sid>/materia``.

    ``Runtime.open_session`` returns once the session supervisor exists; its children start on
    its own thread. If the SessionActor is not registered yet, one ask to the supervisor (handled
    only after its start-up) is the barrier.
    """
    ctx = runtime.session(session_id)
    try:
        return ctx.lookup("materia")
    except NotFound:
        runtime.system.lookup(ctx.path).ask(WhichChildren(), timeout=DEFAULT_TIMEOUT_S)
        return ctx.lookup("materia")


def materia_call(runtime: Any, session_id: str, verb: str, params: dict[str, Any] | None = None,
                 *, timeout: float = DEFAULT_TIMEOUT_S) -> dict[str, Any]:
    """Ask the session's SessionActor to run ``verb`` (NotFound for an unknown session)."""
    clean = {k: v for k, v in (params or {}).items() if v is not None}
    return session_actor(runtime, session_id).ask(SessionCall(verb=verb, params=clean), timeout=timeout)

"""The one call the endpoint methods and the CLI use to reach a session's SessionActor."""

from __future__ import annotations

from typing import Any

from castor.actors.materia.messages import SessionCall

DEFAULT_TIMEOUT_S = 15.0


def materia_call(runtime: Any, session_id: str, verb: str, params: dict[str, Any] | None = None,
                 *, timeout: float = DEFAULT_TIMEOUT_S) -> dict[str, Any]:
    """Ask ``/root/session/<sid>/materia`` to run ``verb`` (NotFound for an unknown session)."""
    ctx = runtime.session(session_id)
    clean = {k: v for k, v in (params or {}).items() if v is not None}
    return ctx.lookup("materia").ask(SessionCall(verb=verb, params=clean), timeout=timeout)

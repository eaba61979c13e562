"""The calls the endpoint methods and the CLI use to reach a session's SessionActor.

:func:`materia_ask` sends one typed verb message (:mod:`castor.actors.materia.messages`);
:func:`materia_call` is the same call by verb name and a dict of arguments (the CLI, the Ray
host and scripts): it builds the verb's message first, so a wrong name or argument is an
``invalid_params`` answer before anything reaches the actor.
"""

from __future__ import annotations

from typing import Any

from pydantic import ValidationError

from castor.actors.materia.messages import SESSION_VERBS, SessionVerb
from castor.messages.errors import InvalidParams, NotFound
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


def verb_message(verb: str, params: dict[str, Any] | None = None) -> SessionVerb:
    """The message of ``verb`` with ``params`` (``None`` values dropped: the verb's default).

    ``InvalidParams`` for an unknown verb, or arguments the verb does not take or cannot hold.
    """
    message_class = SESSION_VERBS.get(verb)
    if message_class is None:
        raise InvalidParams(f"unknown materia verb {verb!r}")
    clean = {k: v for k, v in (params or {}).items() if v is not None}
    try:
        return message_class(**clean)
    except ValidationError as exc:
        first = exc.errors(include_url=False, include_input=False)[0]
        where = ".".join(str(p) for p in first["loc"]) or "(params)"
        raise InvalidParams(f"invalid parameters for materia {verb}: {where}: {first['msg']}",
                            data={"verb": verb}) from None


def materia_ask(runtime: Any, session_id: str, message: SessionVerb, *,
                timeout: float = DEFAULT_TIMEOUT_S) -> dict[str, Any]:
    """Ask the session's SessionActor to run one verb (``not_found`` for an unknown session)."""
    reply: dict[str, Any] = session_actor(runtime, session_id).ask(message, timeout=timeout)
    return reply


def materia_call(runtime: Any, session_id: str, verb: str, params: dict[str, Any] | None = None,
                 *, timeout: float = DEFAULT_TIMEOUT_S) -> dict[str, Any]:
    """:func:`materia_ask` with the message of ``verb`` and ``params`` (see :func:`verb_message`)."""
    return materia_ask(runtime, session_id, verb_message(verb, params), timeout=timeout)

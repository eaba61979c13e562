"""Session methods: ``session.open``, ``session.close``, ``harness.event``, ``agent.turn_ended``.

A session opened on a connection belongs to it: when the connection closes
(EOF, error, shutdown) every session it opened is closed — casts keep their
persisted state and stay resumable; workers are stopped.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any, Literal, get_args

from pydantic import Field

from castor._log import logger
from castor.endpoint.auth import check_trusted_assertion
from castor.endpoint.dispatch import Context, Dispatcher, Params
from castor.endpoint.harness_link import WireHarness
from castor.endpoint.methods.checked import str_keyed, validated
from castor.endpoint.methods.ownership import opened_sessions, owned_session
from castor.messages.errors import Conflict, MailboxFull, NotFound
from castor.messages.ids import check_safe_id
from castor.runtime import HarnessLink, Runtime, SessionInfo

HarnessEventName = Literal[
    "session_start", "before_agent_start", "agent_end", "agent_settled", "session_shutdown", "context",
    "turn_start", "turn_end", "agent_start", "input",
]


class SessionOpenParams(Params):
    session_id: str
    cwd: str
    trusted: bool = False
    flags: dict[str, Any] = {}


class SessionRef(Params):
    session_id: str


class HarnessEventParams(Params):
    session_id: str
    event: HarnessEventName
    data: dict[str, Any] = {}


#: ``HarnessEventParams``' fields and event names (the handler's check of the commonest params).
_EVENT_FIELDS = frozenset(HarnessEventParams.model_fields)
_EVENT_NAMES = frozenset(get_args(HarnessEventName))


class TurnEndedParams(Params):
    session_id: str
    turn_id: str = Field(max_length=256)  # castor's own ids are short; a longer one names no turn
    text: str | None = None
    text_cut_from: int | None = Field(None, ge=0)  # the harness cut ``text`` from this many UTF-8 bytes
    stop_reason: str | None = None
    error: Any = None
    # The usage fields are read as given (castor.endpoint.harness_link.outcome_from_wire): a usage
    # that is not a map (a number, a string) is named to the user as unreadable, never a reason to
    # refuse the turn -- refused, its answer was lost and the cast waited for it for ever.
    usage: Any = None
    aborted: bool = False
    entry_id: str | None = None
    model: Any = None  # the model that answered: "id", or {provider, id, api}
    usages: Any = None  # one usage map per assistant message of the turn (a list), as the provider wrote it
    # true: the turn's stopped message reported no usage of its own; ``usage``/``usages`` are the others'
    stopped_usage_unknown: Any = None
    provider: Any = None  # a name; anything else is no name
    api: Any = None
    thinking_level: Any = None


def register_session_methods(dispatcher: Dispatcher, runtime: Runtime) -> None:
    lock = threading.Lock()
    owners: dict[str, WireHarness] = {}  # session id -> the link of the connection that drives it now

    def session_open(params: SessionOpenParams, ctx: Context) -> dict[str, Any]:
        check_trusted_assertion(params.trusted, ctx)  # who may say "trusted": castor.endpoint.auth
        named = params.flags.get("harness_session_id")
        if named is not None and named != "":
            # The harness's own session id reaches the memory backend as its session id: "" (the
            # harness has none) or a safe id, like castor's own session ids.
            check_safe_id(named, "harness_session_id")
        owned = opened_sessions(ctx)
        with lock:
            if params.session_id in owned:
                if runtime.has_session(params.session_id) and not owned[params.session_id].superseded:
                    raise Conflict(f"session {params.session_id!r} is already open on this connection")
                owned.pop(params.session_id, None)  # its actors are gone (gave up): open it again
            limit = ctx.connection.settings.max_sessions
            if len(owned) >= limit:
                raise MailboxFull(f"this connection holds {len(owned)} open sessions, its limit; close one first",
                                  data={"limit": limit})
            link = WireHarness(ctx.connection, params.session_id)
            info = SessionInfo(
                session_id=params.session_id,
                cwd=params.cwd,
                trusted=params.trusted,
                flags=params.flags,
                session_file=params.flags.get("session_file")
                if isinstance(params.flags.get("session_file"), str)
                else None,
            )
            # A connection's first session may take any free slot; its later ones leave the last
            # few (ConnectionSettings.sessions_kept_for_first) to connections that hold none yet.
            keep_free = ctx.connection.settings.sessions_kept_for_first if owned else 0
            session = runtime.open_session(
                info, HarnessLink(agent=link, session_log=link, ui=link, classifier=link, kind="endpoint",
                                  host_context=link), keep_free=keep_free,
            )
            owned[params.session_id] = link
            previous = owners.get(params.session_id)
            if previous is not None:
                previous.superseded = True  # its session gave up (or it could not open this again)
            owners[params.session_id] = link
            first_open = not ctx.state.get("close_hook")
            ctx.state["close_hook"] = True
        if first_open:
            # Outside the lock: a connection that closed while the open ran (its peer left) runs
            # the hook at once, on this thread, and the hook takes the lock to forget the session.
            ctx.connection.add_close_callback(lambda _conn: _close_owned(runtime, owned, forget))
        return {"session_id": params.session_id, "path": session.path}

    def forget(session_id: str, link: WireHarness) -> None:
        with lock:
            if owners.get(session_id) is link:
                owners.pop(session_id, None)

    def session_close(params: SessionRef, ctx: Context) -> dict[str, Any]:
        owned = opened_sessions(ctx)
        link = owned.get(params.session_id)
        if link is None or not link.superseded:
            link = owned_session(ctx, params.session_id)
            runtime.close_session(params.session_id, opened_by=link)
        # superseded: this connection's session is long gone and the id drives another one now
        owned.pop(params.session_id, None)
        forget(params.session_id, link)
        return {"closed": True}

    def harness_event(params: Any, ctx: Context) -> dict[str, Any]:
        # HarnessEventParams' check, done here (castor.endpoint.methods.checked): the commonest
        # params as the model takes them as they are, anything else through the model and its errors.
        fast = type(params) is dict and params.keys() <= _EVENT_FIELDS
        if fast:
            session_id, event, data = params.get("session_id"), params.get("event"), params.get("data")
            if data is None and "data" not in params:
                data = {}  # the model's default
            fast = (type(session_id) is str and type(event) is str and event in _EVENT_NAMES
                    and str_keyed(data))
        if not fast:
            checked = validated(HarnessEventParams, "harness.event", params)
            session_id, event, data = checked.session_id, checked.event, checked.data
        owned_session(ctx, session_id)
        # The reply may go out before this returns: the Icarus hooks answer a harness at once
        # (an /icarus off, an abort) while this thread is still inside a worker call it made itself.
        return runtime.dispatch_event(session_id, event, data, answer=ctx.early_answer())

    def turn_ended(params: TurnEndedParams, ctx: Context) -> dict[str, Any]:
        link = owned_session(ctx, params.session_id)
        if not link.turn_ended(params.model_dump()):
            return {"ok": True, "ignored": True}  # a turn castor stopped (agent.abort_turn): nothing to apply
        return {"ok": True}

    dispatcher.register("session.open", session_open, SessionOpenParams)
    dispatcher.register("session.close", session_close, SessionRef)
    dispatcher.register("harness.event", harness_event)  # HarnessEventParams, checked by the handler
    dispatcher.register("agent.turn_ended", turn_ended, TurnEndedParams)


def _close_owned(runtime: Runtime, owned: dict[str, WireHarness],
                 forget: Callable[[str, WireHarness], None]) -> None:
    """A connection went away: close what it still drives, never a session another opened since.

    A session already closed is no failure: a runtime that stops closes every session while the
    connections are still open (so each harness hears its turns stop), and only then do the
    connections close."""
    for session_id, link in list(owned.items()):
        forget(session_id, link)
        if link.superseded:
            owned.pop(session_id, None)
            continue
        try:
            runtime.close_session(session_id, opened_by=link)
        except NotFound:
            pass  # closed already (the runtime stopping closed it first): nothing left to close
        except Exception as exc:  # noqa: BLE001 - closing one must not stop closing the rest
            logger.bind(actor="/endpoint").opt(exception=exc).warning(
                "closing {sid} after disconnect failed", sid=session_id
            )
        owned.pop(session_id, None)

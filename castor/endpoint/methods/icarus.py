"""Icarus methods: ``icarus.tool``, ``icarus.command``, ``icarus.config`` (+ ``worker_stats``).

Thin wire layer over :class:`castor.actors.icarus.session.IcarusSession`; the
behaviour (and its guarantees) lives there. Documented in docs/protocol.md
("Methods: harness → castor").

==================  ===========================================  ===============================================
method              result                                       errors
==================  ===========================================  ===============================================
``icarus.tool``     the backend's value (``format: "value"``,    ``not_found`` (no session, tool not offered,
                    the Pi extension's contract) or the tool     Icarus unavailable), ``timeout``,
                    result ``{content, details, is_error}``      ``worker_retired``, ``worker_crashed``,
                    (``format: "result"``); a backend            ``internal`` (the backend raised) — transport
                    ``{error}`` or a validation failure is a     failures are never retried
                    *value*, marked ``is_error``
``icarus.command``  ``{text, level}`` (+ ``code``, ``usage``     ``not_found`` (no session); settings writes:
                    for invalid input, which changes nothing)    ``invalid_config`` (malformed file, untouched),
                                                                 ``timeout`` (settings lock busy),
                                                                 ``storage_unavailable`` (disk full, read-only),
                                                                 ``forbidden`` (a global file another user
                                                                 owns or all may write, untouched)
``icarus.config``   state, hooks, filtering, effective config,   ``not_found`` (no session)
                    schema, ``tools`` to register
==================  ===========================================  ===============================================

Every method also answers ``forbidden`` for a session opened on another connection.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field

from castor.actors.icarus import IcarusSession, session_of
from castor.domain.icarus.tools import tool_result
from castor.endpoint.dispatch import Context, Dispatcher, Params
from castor.endpoint.methods.checked import str_keyed, validated
from castor.endpoint.methods.ownership import owned_session
from castor.runtime import Runtime


class ToolParams(Params):
    session_id: str
    name: str = Field(max_length=256)  # a tool's name; a longer one names no tool
    params: dict[str, Any] | None = None
    tool_call_id: str | None = None
    format: Literal["value", "result"] = "value"


#: ``ToolParams``' fields and the longest ``name`` it takes (the handler's check of the commonest params).
_TOOL_FIELDS = frozenset(ToolParams.model_fields)
_MAX_TOOL_NAME = 256


class CommandParams(Params):
    session_id: str
    args: str = Field("", max_length=65536)  # what the user typed after /icarus
    cwd: str | None = None  # sent by the Pi extension; the session's own cwd is authoritative


class ConfigParams(Params):
    session_id: str


def icarus_session(runtime: Runtime, session_id: str) -> IcarusSession:
    """The session's bridge; ``not_found`` for an unknown session or a runtime without Icarus."""
    return session_of(runtime.session(session_id))


def _owned_session(runtime: Runtime, ctx: Context, session_id: str) -> IcarusSession:
    """As :func:`icarus_session`, for a session opened on this connection only (``forbidden``).

    The ownership rule of every session method (:func:`owned_session`): one harness cannot call
    another session's memory tools.
    """
    sess = icarus_session(runtime, session_id)
    owned_session(ctx, session_id)
    return sess


def worker_stats(runtime: Runtime, session_id: str) -> dict[str, Any]:
    """``ops.worker`` detail: the worker actor's mailbox and its process (pid, RSS, CPU, open files).

    Never sends a message to the worker actor, so it answers while a call runs.
    """
    return icarus_session(runtime, session_id).worker_stats()


def register_icarus_methods(dispatcher: Dispatcher, runtime: Runtime) -> None:
    def tool(params: Any, _ctx: Context) -> Any:
        # ToolParams' check, done here (castor.endpoint.methods.checked): the commonest params as
        # the model takes them as they are, anything else through the model and its errors.
        fast = type(params) is dict and params.keys() <= _TOOL_FIELDS
        if fast:
            session_id, name, args = params.get("session_id"), params.get("name"), params.get("params")
            call_id, form = params.get("tool_call_id"), params.get("format", "value")
            fast = (type(session_id) is str and type(name) is str and len(name) <= _MAX_TOOL_NAME
                    and (args is None or str_keyed(args)) and (call_id is None or type(call_id) is str)
                    and type(form) is str and (form == "value" or form == "result"))
        if not fast:
            checked = validated(ToolParams, "icarus.tool", params)
            session_id, name, args = checked.session_id, checked.name, checked.params
            call_id, form = checked.tool_call_id, checked.format
        sess = _owned_session(runtime, _ctx, session_id)
        value = sess.tool(name, args, tool_call_id=call_id)
        if form == "result":
            return tool_result(value).to_wire()
        return value

    def command(params: CommandParams, _ctx: Context) -> dict[str, Any]:
        return _owned_session(runtime, _ctx, params.session_id).command(params.args)

    def config(params: ConfigParams, _ctx: Context) -> dict[str, Any]:
        return _owned_session(runtime, _ctx, params.session_id).config()

    dispatcher.register("icarus.tool", tool)  # ToolParams, checked by the handler
    dispatcher.register("icarus.command", command, CommandParams)
    dispatcher.register("icarus.config", config, ConfigParams)

"""Materia methods: the ``/materia`` verbs and loadout/config helpers over msgpack-rpc.

Every method takes ``session_id`` (an open session) and may take ``cwd`` (ignored: the
session's own cwd is authoritative, so a client cannot point a session at another tree).
Results of commands carry ``text`` and ``level`` for the harness to show, plus structured
fields. See docs/protocol.md "Methods: harness → castor" for each method's params, result and
errors.
"""

from __future__ import annotations

from typing import Any

from pydantic import Field

from castor.actors.materia.api import materia_call
from castor.endpoint.dispatch import Context, Dispatcher, Params
from castor.messages.errors import Forbidden
from castor.runtime import Runtime


class _SessionParams(Params):
    session_id: str = Field(min_length=1, max_length=128)
    cwd: str | None = None  # sent by harnesses with every command; the session's cwd wins


class CastStartParams(_SessionParams):
    request: str = Field(min_length=1, max_length=100_000)
    loadout: str | None = Field(default=None, min_length=1, max_length=200)  # "" names no loadout


class CastRefParams(_SessionParams):
    cast_id: str | None = Field(default=None, min_length=1, max_length=128)


class SessionOnlyParams(_SessionParams):
    pass


class CastListParams(_SessionParams):
    limit: int | None = Field(default=None, ge=1, le=1000)  # a page; default 50
    cursor: str | None = Field(default=None, min_length=1, max_length=200)  # a page's next_cursor


class LoadoutSetParams(_SessionParams):
    name: str = Field(min_length=1, max_length=200)


class GridParams(_SessionParams):
    loadout: str | None = Field(default=None, max_length=200)


class ValidateParams(_SessionParams):
    path: str = Field(min_length=1, max_length=4096)


#: method -> (SessionActor verb, params model, which params to pass on)
_METHODS: dict[str, tuple[str, type[Params], tuple[str, ...]]] = {
    "cast.start": ("start", CastStartParams, ("request", "loadout")),
    "cast.abort": ("abort", CastRefParams, ("cast_id",)),
    "cast.continue": ("continue", CastRefParams, ("cast_id",)),
    "cast.recast": ("recast", CastRefParams, ("cast_id",)),
    "cast.revive": ("revive", CastRefParams, ("cast_id",)),
    "cast.status": ("status", CastRefParams, ("cast_id",)),
    "cast.list": ("list", CastListParams, ("limit", "cursor")),
    "loadout.list": ("loadouts", SessionOnlyParams, ()),
    "loadout.set": ("set_loadout", LoadoutSetParams, ("name",)),
    "grid.render": ("grid", GridParams, ("loadout",)),
    "config.validate": ("validate", ValidateParams, ("path",)),
}


def _handler(runtime: Runtime, verb: str, fields: tuple[str, ...]):
    def handle(params: Any, ctx: Context) -> dict[str, Any]:
        # Same ownership rule as the session methods: only the connection that opened a
        # session may drive its casts (ctx.state["sessions"] is filled by session.open).
        if params.session_id not in ctx.state.get("sessions", {}):
            raise Forbidden(f"session {params.session_id!r} is not open on this connection",
                            data={"session_id": params.session_id})
        args = {name: getattr(params, name) for name in fields}
        return materia_call(runtime, params.session_id, verb, args)

    return handle


def register_materia_methods(dispatcher: Dispatcher, runtime: Runtime) -> None:
    for method, (verb, model, fields) in _METHODS.items():
        dispatcher.register(method, _handler(runtime, verb, fields), model)


__all__ = ["register_materia_methods"]

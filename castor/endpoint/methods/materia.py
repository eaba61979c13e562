"""Materia methods: the ``/materia`` verbs and loadout/config helpers over msgpack-rpc.

Every method takes ``session_id`` (an open session) and may take ``cwd`` (ignored: the
session's own cwd is authoritative, so a client cannot point a session at another tree).
Results of commands carry ``text`` and ``level`` for the harness to show, plus structured
fields. See docs/protocol.md "Methods: harness → castor" for each method's params, result and
errors.

:data:`METHODS` is the one table: each method name, its params model, and the SessionActor
message its params become. Every method checks first that the calling connection opened the
session (:func:`castor.endpoint.methods.ownership.owned_session`, ``forbidden``), then asks.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from pydantic import Field

from castor.actors.materia.api import materia_ask
from castor.actors.materia.messages import (
    AbortCast,
    ContinueCast,
    ListCasts,
    ListLoadouts,
    RecastCast,
    RenderGrid,
    ReviveCast,
    SessionVerb,
    SetActiveLoadout,
    ShowCast,
    StartCast,
    ValidateConfig,
)
from castor.endpoint.dispatch import Context, Dispatcher, Params
from castor.endpoint.methods.ownership import owned_session
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


P = TypeVar("P", bound=_SessionParams)


@dataclass(frozen=True, slots=True)
class MateriaMethod(Generic[P]):
    """One msgpack-rpc method: its params model, and how its params become the SessionActor's
    message. The result is the verb's answer dict as the actor gives it (``text``, ``level`` and
    the verb's structured fields)."""

    params: type[P]
    message: Callable[[P], SessionVerb]


#: method name -> its params model and the SessionActor message it sends (the one table)
METHODS: dict[str, MateriaMethod[Any]] = {
    "cast.start": MateriaMethod(CastStartParams, lambda p: StartCast(request=p.request, loadout=p.loadout)),
    "cast.abort": MateriaMethod(CastRefParams, lambda p: AbortCast(cast_id=p.cast_id)),
    "cast.continue": MateriaMethod(CastRefParams, lambda p: ContinueCast(cast_id=p.cast_id)),
    "cast.recast": MateriaMethod(CastRefParams, lambda p: RecastCast(cast_id=p.cast_id)),
    "cast.revive": MateriaMethod(CastRefParams, lambda p: ReviveCast(cast_id=p.cast_id)),
    "cast.status": MateriaMethod(CastRefParams, lambda p: ShowCast(cast_id=p.cast_id)),
    "cast.list": MateriaMethod(CastListParams, lambda p: ListCasts(limit=p.limit, cursor=p.cursor)),
    "loadout.list": MateriaMethod(SessionOnlyParams, lambda p: ListLoadouts()),
    "loadout.set": MateriaMethod(LoadoutSetParams, lambda p: SetActiveLoadout(name=p.name)),
    "grid.render": MateriaMethod(GridParams, lambda p: RenderGrid(loadout=p.loadout)),
    "config.validate": MateriaMethod(ValidateParams, lambda p: ValidateConfig(path=p.path)),
}


def _handler(runtime: Runtime, method: MateriaMethod[Any]) -> Callable[[Any, Context], dict[str, Any]]:
    def handle(params: Any, ctx: Context) -> dict[str, Any]:
        owned_session(ctx, params.session_id)  # only the connection that opened a session drives its casts
        return materia_ask(runtime, params.session_id, method.message(params))

    return handle


def register_materia_methods(dispatcher: Dispatcher, runtime: Runtime) -> None:
    for name, method in METHODS.items():
        dispatcher.register(name, _handler(runtime, method), method.params)


__all__ = ["METHODS", "MateriaMethod", "register_materia_methods"]

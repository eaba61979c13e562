"""Loop iteration: which iterator applies to a socket, the current item, and exhaustion targets
(``applyAdvance`` in pi-materia).

Exhaustion target precedence (post-final-item), over the loops indexing the socket (member,
``exit.from`` or some ``exits[].from``) in declaration order, first route *from this socket*:

| ``$.satisfied`` | routes tried |
|---|---|
| ``True`` | ``satisfied``, then ``always`` |
| ``False`` | ``not_satisfied``, then ``always`` |
| unknown | ``always`` |

No route → ``"end"``. A socket in no loop uses its legacy ``advance.done`` ?? ``"end"``.

Empty loop on entry: same resolver with ``satisfied`` unknown and ``from`` = the entered socket,
exactly as pi-materia does it: when the entered socket has no ``always`` route of its own, the
cast ends there (``"end"``), even if another member's ``always`` exit leads on. A loadout that
wants an empty work list to reach the post-loop socket says so with an ``always`` exit route
from the loop member it enters first (castor's bundled ``build`` does).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from castor.domain.jsontext import js_string
from castor.domain.materia.config import END, ResolvedPipeline
from castor.domain.materia.expressions import MISSING, Scope, as_list, resolve_value
from castor.domain.materia.memo import derived


@dataclass(frozen=True)
class Iteration:
    loop_id: str | None  # None for a socket-level ``foreach``
    items: str
    as_: str
    cursor: str
    done: str | None


def iteration_for(pipeline: ResolvedPipeline, socket_id: str) -> Iteration | None:
    """``socket.foreach`` ?? the iterator of the first loop containing the socket."""
    rs = pipeline.sockets[socket_id]
    fe = rs.socket.foreach
    if fe is not None:
        return Iteration(None, fe.items, fe.as_ or "item", fe.cursor or f"{socket_id}Index", fe.done)
    for loop_id, loop in pipeline.loops.items():
        if socket_id in loop.sockets and loop.iterator is not None:
            it = loop.iterator
            return Iteration(loop_id, it.items, it.as_ or "item", it.cursor or f"{socket_id}Index", it.done)
    return None


def loop_aliases(pipeline: ResolvedPipeline) -> tuple[str, ...]:
    """The names loops give their item in ``state.data`` besides ``item`` (``foreach.as`` /
    ``iterator.as``), once per pipeline."""
    def collect() -> tuple[str, ...]:
        names = {rs.socket.foreach.as_ for rs in pipeline.sockets.values() if rs.socket.foreach is not None}
        names |= {loop.iterator.as_ for loop in pipeline.loops.values() if loop.iterator is not None}
        return tuple(sorted(name for name in names if name and name not in ("item", "currentWorkItem", "workItem")))

    return derived(pipeline, "loop_aliases", collect)


@dataclass(frozen=True)
class ItemSelection:
    item: Any  # MISSING when the list is exhausted/empty
    index: int
    key: str | None  # None exactly when ``item`` is MISSING
    label: str | None  # likewise


def select_item(it: Iteration, data: dict[str, Any], cursors: dict[str, int],
                last_json: Any = MISSING) -> ItemSelection:
    """The current item (does not mutate), as pi-materia's ``setCurrentItem`` names it: ``key`` =
    ``id ?? key ?? index`` and ``label`` = ``title ?? name ?? <that key>``, both strings whenever
    there is an item (an item that is not an object is named by its index); both ``None`` when
    the list is exhausted or empty.

    ``items`` reads as any value expression; with no reply parsed yet at a socket's start, ``$``
    is the last JSON reply (``lastJson``), as in pi-materia."""
    index = cursors.get(it.cursor, 0)
    items = as_list(resolve_value(it.items, Scope(data=data, parsed=last_json, last_json=last_json)))
    if index >= len(items) or index < 0:
        return ItemSelection(MISSING, index, None, None)
    item = items[index]
    key: Any = index
    label: Any = None
    if isinstance(item, dict):
        key = next((item[k] for k in ("id", "key") if item.get(k) is not None), index)
        label = next((item[k] for k in ("title", "name") if item.get(k) is not None), None)
    return ItemSelection(item, index, js_string(key), js_string(key if label is None else label))


def item_progress(pipeline: ResolvedPipeline, socket_id: str, data: dict[str, Any], cursors: dict[str, int],
                  last_json: Any = MISSING) -> tuple[int, int] | None:
    """Where a loop socket's current item stands: ``(its number from 1, how many items)``, read
    as :func:`select_item` reads them; ``None`` for a socket in no loop, or no current item."""
    if socket_id not in pipeline.sockets:
        return None
    it = iteration_for(pipeline, socket_id)
    if it is None:
        return None
    index = cursors.get(it.cursor, 0)
    items = as_list(resolve_value(it.items, Scope(data=data, parsed=last_json, last_json=last_json)))
    if not 0 <= index < len(items):
        return None
    return index + 1, len(items)


def item_data_updates(it: Iteration, item: Any) -> dict[str, Any]:
    """The ``state.data`` keys that expose the current item."""
    updates = {"item": item, "currentWorkItem": item}
    if it.as_ != "item" and "." not in it.as_:  # a dotted name is a path: the engine assigns it
        updates[it.as_] = item
    if it.as_ == "workItem" or "workItems" in it.items:
        updates["workItem"] = item
    return updates


def _loops_indexing(pipeline: ResolvedPipeline, socket_id: str) -> list[str]:
    out = []
    for loop_id, loop in pipeline.loops.items():
        if (socket_id in loop.sockets or (loop.exit and loop.exit.from_ == socket_id)
                or any(r.from_ == socket_id for r in loop.exits)):
            out.append(loop_id)
    return out


def _conditions(satisfied: bool | None) -> tuple[str, ...]:
    if satisfied is True:
        return ("satisfied", "always")
    if satisfied is False:
        return ("not_satisfied", "always")
    return ("always",)


def _route(pipeline: ResolvedPipeline, loop_ids: list[str], socket_id: str, satisfied: bool | None) -> str | None:
    for loop_id in loop_ids:
        routes = [r for r in pipeline.loops[loop_id].exits if r.from_ == socket_id]
        for condition in _conditions(satisfied):
            for route in routes:
                if route.condition == condition:
                    return route.target_socket_id
    return None


def exhaustion_target(pipeline: ResolvedPipeline, socket_id: str, satisfied: bool | None) -> str:
    """Where to go after the last item (advance exhausted at ``socket_id``)."""
    loop_ids = _loops_indexing(pipeline, socket_id)
    if not loop_ids:
        adv = pipeline.sockets[socket_id].socket.advance
        return (adv.done if adv and adv.done else END)
    return _route(pipeline, loop_ids, socket_id, satisfied) or END


def empty_loop_target(pipeline: ResolvedPipeline, socket_id: str, it: Iteration) -> str:
    """Where to go when ``socket_id`` is entered with no current item."""
    loop_ids = _loops_indexing(pipeline, socket_id)
    if not loop_ids:
        return it.done or END
    return _route(pipeline, loop_ids, socket_id, None) or END

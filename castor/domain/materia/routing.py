"""Edge routing and traversal/visit limits.

| rule | behaviour |
|---|---|
| edge choice | the socket's edges in order; the first whose ``when`` matches wins: ``always``; ``satisfied`` iff ``$.satisfied is True``; ``not_satisfied`` iff ``is False``; no match → ``"end"`` |
| edge limit | counter key ``"<from>-><to>"``, cumulative for the cast, incremented **before** the check; limit = ``edge.maxTraversals`` ?? socket ``limits.maxEdgeTraversals`` (castor enforces it: a deliberate difference) ?? ``limits.maxEdgeTraversals`` ?? 25 |
| visit limit | ``visits[id] + 1`` checked against socket ``limits.maxVisits`` ?? ``limits.maxSocketVisits`` ?? 25 |

Exhaustion targets returned by ``advance`` never count as edge traversals.
"""  # noqa: E501 - table rows cannot wrap

from __future__ import annotations

from typing import Any

from castor.domain.materia.config import END, RUNTIME_LIMIT_FALLBACK, Edge, Limits, Socket
from castor.messages.errors import CastorError, ErrorCode


class LimitExceeded(CastorError):
    """A visit or edge-traversal limit was hit; the cast fails with this message."""

    code = ErrorCode.CONFLICT


def edge_matches(edge: Edge, parsed: Any) -> bool:
    if edge.when == "always":
        return True
    flag = parsed.get("satisfied") if isinstance(parsed, dict) else None
    if edge.when == "satisfied":
        return flag is True
    return flag is False


def select_edge(socket: Socket, parsed: Any) -> Edge | None:
    for edge in socket.edges:
        if edge_matches(edge, parsed):
            return edge
    return None


def edge_limit(edge: Edge, socket: Socket, limits: Limits) -> int:
    if edge.max_traversals is not None:
        return edge.max_traversals
    if socket.limits and socket.limits.max_edge_traversals is not None:
        return socket.limits.max_edge_traversals
    return limits.max_edge_traversals or RUNTIME_LIMIT_FALLBACK


def next_target(
    socket_id: str, socket: Socket, parsed: Any, traversals: dict[str, int], limits: Limits
) -> str:
    """The next socket (or ``"end"``); updates ``traversals`` in place. Raises LimitExceeded."""
    edge = select_edge(socket, parsed)
    if edge is None:
        return END
    key = f"{socket_id}->{edge.to}"
    count = traversals.get(key, 0) + 1
    traversals[key] = count
    limit = edge_limit(edge, socket, limits)
    if count > limit:
        raise LimitExceeded(f"Materia edge traversal limit exceeded for {key} ({count}/{limit}).",
                            data={"key": key, "count": count, "limit": limit})
    return edge.to


def visit_limit(socket: Socket, limits: Limits) -> int:
    if socket.limits and socket.limits.max_visits is not None:
        return socket.limits.max_visits
    return limits.max_socket_visits or RUNTIME_LIMIT_FALLBACK


def count_visit(socket_id: str, socket: Socket, visits: dict[str, int], limits: Limits) -> int:
    """Count one more visit (in place) and return it. Raises LimitExceeded before counting past the limit."""
    count = visits.get(socket_id, 0) + 1
    limit = visit_limit(socket, limits)
    if count > limit:
        raise LimitExceeded(f"Materia socket visit limit exceeded for {socket_id} ({count}/{limit}).",
                            data={"socket": socket_id, "count": count, "limit": limit})
    visits[socket_id] = count
    return count

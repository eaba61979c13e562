"""The one session-ownership rule of the endpoint methods.

A session belongs to the connection that opened it (``session.open``): only that connection may
drive it — its casts, its harness events, its memory tools, closing it. Every method that names a
``session_id`` checks it here, so the rule and its error (``forbidden``, ``data.session_id``) are
the same for all of them. ``ops.*`` methods inspect any session and do not call this.

What it does not check: that the session's actors still run (a session whose supervisor gave up
is still owned until it is closed or opened again; the methods answer ``not_found`` then). Once
another connection opens that id again, the first connection's link is *superseded*: it owns
nothing any more and every method naming the id answers ``forbidden`` to it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from castor.endpoint.dispatch import Context
from castor.messages.errors import Forbidden

if TYPE_CHECKING:
    from castor.endpoint.harness_link import WireHarness

SESSIONS_KEY = "sessions"
"""The connection-state key of the sessions opened on a connection (session id → its link)."""


def opened_sessions(ctx: Context) -> dict[str, WireHarness]:
    """The sessions opened on the calling connection (session id → its link), created empty."""
    sessions: dict[str, WireHarness] = ctx.state.setdefault(SESSIONS_KEY, {})
    return sessions


def owned_session(ctx: Context, session_id: str) -> WireHarness:
    """The link of ``session_id`` if the calling connection opened it; ``Forbidden`` otherwise."""
    link: WireHarness | None = ctx.state.get(SESSIONS_KEY, {}).get(session_id)
    if link is None:
        raise Forbidden(f"session {session_id!r} is not open on this connection", data={"session_id": session_id})
    if link.superseded:
        raise Forbidden(f"session {session_id!r} was opened again by another connection after it gave up here",
                        data={"session_id": session_id})
    return link


__all__ = ["SESSIONS_KEY", "opened_sessions", "owned_session"]

"""The msgpack-rpc endpoint: framing, connections, dispatch and the server.

Public API::

    from castor.endpoint import Dispatcher, Params, Context, Server, serve

    d = Dispatcher()
    d.register("cast.status", handler, StatusParams)   # handler(params, ctx) -> result
    serve(d, stdio=True, on_shutdown=persist)           # blocks until EOF / SIGTERM

See docs/protocol.md for the wire format.
"""

from castor.endpoint.connection import Connection, ConnectionSettings, PendingCall
from castor.endpoint.dispatch import Context, Dispatcher, Params
from castor.endpoint.errors import ConnectionClosed, error_from_wire
from castor.endpoint.framing import FrameLimits
from castor.endpoint.server import Server, serve

__all__ = [
    "Connection", "ConnectionClosed", "ConnectionSettings", "Context", "Dispatcher", "FrameLimits",
    "Params", "PendingCall", "Server", "error_from_wire", "serve",
]

"""A synchronous msgpack-rpc client for castor (tests, the CLI, Python harnesses).

Built on the same :class:`~castor.endpoint.connection.Connection` as the
server, so it has the same guarantees: thread-safe concurrent ``call``\\ s,
a deadline on every call, server→client requests answered by registered
handlers off the reading thread (a notification it serves is never dropped when they are all
busy: reading waits for one, see ``ConnectionSettings.notifications_wait_for_a_slot``), and
``close()`` failing every pending call
with :class:`~castor.endpoint.errors.ConnectionClosed`. When the server ends the
connection with a typed reason (an ``error`` notification as its last frame: too
many connections, out of descriptors, an idle close), every call that end fails,
sent before or after it, raises that error instead (chained to the ``cancelled``).

Example::

    with Client.connect_unix("/run/castor.sock") as client:
        client.on_request("session.append_entry", lambda params: {"ok": True})
        print(client.call("runtime.hello", {}))

An endpoint that requires a token (``castor serve --tcp``, or ``--socket --require-token``)
refuses every method until ``runtime.hello {token}``; pass ``token=`` or ``token_file=`` (the
path ``castor serve`` prints) to any constructor and the client says hello with it at once
(the answer is in :attr:`Client.hello_result`)::

    with Client.connect_tcp("127.0.0.1", 7777, token_file=path) as client:
        client.call("ops.actors", {})

Ctrl-C during a call raises ``KeyboardInterrupt`` from it as usual (any exception a signal
handler raises propagates unchanged). If it struck while the call was writing or waiting, the
stream can no longer be trusted and the connection is closed (``client.closed``; later calls
raise ``ConnectionClosed`` with ``data["reason"] == "interrupted"``): connect again to go on.
Struck before the request was written or after the answer was read, the client stays usable.
"""

from __future__ import annotations

import os
import select
import socket
import subprocess
from collections.abc import Callable, Sequence
from typing import Any

import msgpack

from castor._log import logger
from castor._spin import reply_spin
from castor.endpoint.connection import (
    Connection,
    ConnectionSettings,
    PendingCall,
    WarningGate,
)
from castor.endpoint.dispatch import Context, Dispatcher
from castor.endpoint.errors import error_from_wire
from castor.endpoint.listeners import is_loopback_host, peer_credentials, peer_is_us, tcp_peer_is_us
from castor.endpoint.transport import PipeTransport, SocketTransport
from castor.messages.errors import CastorError, Forbidden
from castor.shown import clipped

ClientHandler = Callable[[dict[str, Any]], Any]

MAX_KEPT_ERROR_DATA_BYTES = 65536
"""The data of a server's ``error`` notification the client keeps (``Client.errors``) is at most
this large packed; larger data is replaced by a note of its size (a code it names is kept)."""


class Client:
    """A connected client. Use the ``connect_*`` / ``spawn_stdio`` constructors."""

    def __init__(self, transport: SocketTransport | PipeTransport, *, settings: ConnectionSettings | None = None,
                 default_timeout: float = 30.0, process: subprocess.Popen[bytes] | None = None,
                 name: str = "client", token: str | None = None, token_file: str | None = None) -> None:
        if token is None and token_file is not None:
            from castor.endpoint.auth import read_token_file

            try:
                token = read_token_file(token_file)
            except BaseException:
                transport.close()
                raise
        self._token = token
        self.hello_result: dict[str, Any] | None = None
        self.process = process
        self._dispatcher = Dispatcher(builtin_hello=False)
        # On the reading thread: a refusal's notification is then recorded before the end of stream
        # that follows it is read, so a call the close fails can say why (``_parting``).
        self._dispatcher.register("error", self._on_error_notification, on_reading_thread=True)
        self.errors: list[dict[str, Any]] = []  # ``error`` notifications from the server (latest 100, cut)
        self._errors_gate = WarningGate()  # the warning lines about them
        self._last_error: tuple[dict[str, Any], int] | None = None  # the latest, and frames read then
        # Workers poll so that a caller can take the reader role and read its own reply. A
        # notification the client serves is never dropped for want of a slot: it waits for one
        # (reading pauses: back-pressure on the server) while the client's handlers are busy.
        settings = (settings or ConnectionSettings()).model_copy(
            update={"poll_workers": True, "notifications_wait_for_a_slot": True})
        self.connection = Connection(transport, self._dispatcher, settings=settings, name=name)
        self.connection.default_timeout = default_timeout
        self.connection.peer_parting = self._parting
        if token is None:
            # No hello to fill a token into: a call is the connection's own, which takes the same
            # arguments and the same default deadline (``default_timeout``, kept on the connection).
            # One Python frame a call fewer on the caller's thread -- the heavier side of a round
            # trip, where on one CPU a little more work makes the woken peer preempt the caller
            # at the socket's read (docs/performance.md, the endpoint section, 2026-12-08).
            self.call = self.connection.call  # type: ignore[method-assign]
        self.connection.start()
        if token is not None:
            try:
                self.hello_result = self.call("runtime.hello", {"client": "castor.client"})
            except BaseException:
                self.close()
                raise

    # ---------------------------------------------------------------- constructors
    @classmethod
    def connect_unix(cls, path: str, **kwargs: Any) -> Client:
        """Connect to the socket at ``path``, whose listener must run as this user or root
        (``SO_PEERCRED``), token or not: a socket another user planted (in a shared sticky
        directory, while castor is down) never hears the token, nor a session's project paths
        and requests (``Forbidden``, ``data.reason: peer_uid``, before anything is sent). A castor
        of another user would refuse this client anyway."""
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.connect(path)
            if not peer_is_us(sock):
                what = ("the endpoint's token" if kwargs.get("token") is not None
                        or kwargs.get("token_file") is not None else "anything")
                raise Forbidden(f"refusing to send {what} to {path}: another user listens there, "
                                "not castor's serve", data={"path": path, "reason": "peer_uid"})
            creds = peer_credentials(sock)
        except BaseException:
            sock.close()
            raise
        client = cls(_caller_socket(sock), name=f"client-unix:{path}", **kwargs)
        if creds is not None and creds[0] != os.getpid():
            client._spin_for_answers()
        return client

    def _spin_for_answers(self) -> None:
        """Where this process may run on several CPUs, a call spins briefly before it blocks for its
        answer (castor._spin: a sleeping CPU's wake-up costs more than a quick answer takes). Only
        for a server in another process: one in this interpreter needs the interpreter lock the
        spinning caller keeps taking back, so there the spin only delays the answer."""
        spin = reply_spin()
        transport = self.connection.transport
        if spin is not None and isinstance(transport, SocketTransport):
            poller = select.poll()
            poller.register(transport.read_fd, select.POLLIN)
            self.connection.reply_spin = (spin, poller.poll)

    @classmethod
    def connect_tcp(cls, host: str, port: int, *, connect_timeout: float = 5.0, **kwargs: Any) -> Client:
        """Connect to ``host:port``. With a token (``token=`` / ``token_file=``) ``host`` must be a
        loopback address, as ``castor serve --tcp`` is: the token travels in clear text, so it is
        never sent off this machine (``Forbidden``, raised before anything connects). And the
        listener must run as this user or root (``/proc/net/tcp``, :func:`tcp_peer_is_us`): another
        user who took the port while castor's serve was down never hears the token (``Forbidden``,
        ``data.reason: peer_uid``, before anything is sent) -- nor, without a token, a loopback
        listener of another user anything at all."""
        with_token = kwargs.get("token") is not None or kwargs.get("token_file") is not None
        if with_token and not is_loopback_host(host):
            raise Forbidden(f"refusing to send the endpoint's token to non-loopback host {host!r}: it travels in "
                            "clear text, and castor serves this machine only (use 127.0.0.1, ::1 or localhost)",
                            data={"host": host})
        # On this machine, token or not: without one, another user's listener would still hear
        # the session a harness opens (its project's path, every request).
        sock = (_connect_to_ours(host, port, connect_timeout, what="the endpoint's token" if with_token
                                 else "anything") if with_token or is_loopback_host(host)
                else socket.create_connection((host, port), timeout=connect_timeout))
        return cls(_caller_socket(sock), name=f"client-tcp:{host}:{port}", **kwargs)

    @classmethod
    def spawn_stdio(cls, argv: Sequence[str], *, env: dict[str, str] | None = None, cwd: str | None = None,
                    stderr: int | None = None, **kwargs: Any) -> Client:
        """Start ``argv`` (e.g. ``["castor", "serve", "--stdio"]``) and talk over its stdio."""
        proc = subprocess.Popen(list(argv), stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=stderr,
                                env=env, cwd=cwd, bufsize=0, close_fds=True)
        assert proc.stdin is not None and proc.stdout is not None
        # The transport owns duplicates so Popen's file objects can be dropped without closing ours.
        rfd, wfd = os.dup(proc.stdout.fileno()), os.dup(proc.stdin.fileno())
        proc.stdout.close()
        proc.stdin.close()
        proc.stdin = proc.stdout = None
        return cls(PipeTransport(rfd, wfd, peer=f"pid {proc.pid}"), process=proc,
                   name=f"client-stdio:{proc.pid}", **kwargs)

    # ---------------------------------------------------------------- calls
    @property
    def default_timeout(self) -> float:
        """The deadline, in seconds, of a call made without ``timeout=`` (the connection's)."""
        return self.connection.default_timeout

    @default_timeout.setter
    def default_timeout(self, seconds: float) -> None:
        self.connection.default_timeout = seconds

    def call(self, method: str, params: dict[str, Any] | None = None, *, timeout: float | None = None) -> Any:
        """Call and wait; raises the ``CastorError`` subclass sent by the server (and an
        interrupt's exception unchanged: see the module's note on Ctrl-C). A client without a
        token calls its connection's ``call`` directly (set in ``__init__``): the same arguments,
        the same deadline."""
        if method == "runtime.hello" and self._token is not None:
            params = {**(params or {}), "token": (params or {}).get("token", self._token)}
        return self.connection.call(method, params or {},
                                    timeout=self.default_timeout if timeout is None else timeout)

    def _parting(self) -> CastorError | None:
        """The server's reason for ending the connection, when it gave one: an ``error`` notification
        that was the last frame read before the end (a refusal -- too many connections, out of
        descriptors, an evicted or late hello -- or an idle close). Every call the close fails, and
        every call made after it, raises it instead of ``cancelled`` (the connection's ``peer_parting``):
        the caller learns the typed reason (``mailbox_full`` ...), not only that the connection went.
        An earlier notification (a refused frame) followed by other frames is not that reason."""
        last = self._last_error
        if last is None or last[1] != self.connection.counters["frames_in"]:
            return None
        return error_from_wire(last[0])

    def call_async(self, method: str, params: dict[str, Any] | None = None, *,
                   timeout: float | None = None) -> PendingCall:
        """Send now, wait later: returns a pending call whose ``result()`` honours the deadline."""
        return self.connection.call_async(method, params or {},
                                          timeout=self.default_timeout if timeout is None else timeout)

    def notify(self, method: str, params: dict[str, Any] | None = None) -> bool:
        return self.connection.notify(method, params or {})

    # ---------------------------------------------------------------- server → client
    def on_request(self, method: str, fn: ClientHandler) -> None:
        """Answer server requests ``method`` with ``fn(params) -> result`` (raise CastorError to fail)."""
        self._dispatcher.register(method, _adapt(fn), replace=True)

    def on_notification(self, method: str, fn: Callable[[dict[str, Any]], None], *,
                        on_reading_thread: bool = False) -> None:
        """Run ``fn(params)`` for each notification ``method``, on one of the client's worker threads.

        Frames arrive in the order the server sent them, so a notification sent before a call's
        answer is read before it; but handlers run beside the caller (and beside each other when
        the client has several workers free): a call can return before the handler of a
        notification read ahead of its answer has finished.

        ``on_reading_thread=True`` runs ``fn`` on the thread that read the notification instead
        -- usually the caller waiting for its own answer: the handler has finished before that
        call returns, in the server's order, and no thread is woken for it (a footer update on
        every prompt costs no hand-off). Such a handler must be quick and must not block or use
        this client: nothing is read while it runs.
        """
        self._dispatcher.register(method, _adapt(fn), replace=True, on_reading_thread=on_reading_thread)

    def _on_error_notification(self, params: dict[str, Any], _ctx: Context) -> None:
        """Keep the server's ``error`` notification (``errors``, the latest 100) and log it: one
        warning, then at most one every ``NOTIFICATION_FAILURE_LOG_INTERVAL_S`` saying how many came
        since (each a debug line) -- a server sending them in a loop cannot write the log full.
        Each is kept cut as a peer's error is cut on the way in (its message at 4 KiB, each string
        in its data at 16 KiB, a code castor does not know -- then ``internal`` with the code in
        ``data.wire_code`` -- at 64 characters), and data still over :data:`MAX_KEPT_ERROR_DATA_BYTES`
        packed becomes ``{"cut": "data of N bytes"}``: a server sending megabytes in each would
        otherwise cost the client gigabytes for the hundred kept."""
        error = error_from_wire(params)
        params = {**error.to_wire(), "message": error.message}  # the message is cut once, not twice
        if "data" in params:
            size = len(msgpack.packb(params["data"], default=repr))
            if size > MAX_KEPT_ERROR_DATA_BYTES:  # many items, or strings deeper than the cut reaches
                wire_code = params["data"].get("wire_code")
                params["data"] = {"cut": f"data of {size} bytes",
                                  **({"wire_code": wire_code} if isinstance(wire_code, str) else {})}
        warn, quiet = self._errors_gate.passes()
        shown = clipped(repr(params), 4096)
        if warn:
            logger.warning("server reported an error: {}{}", shown,
                           f" ({quiet} more error notifications since the last such line)" if quiet else "")
        else:
            logger.debug("server reported an error: {}", shown)
        self.errors.append(params)
        del self.errors[:-100]
        self._last_error = (params, self.connection.counters["frames_in"])

    # ---------------------------------------------------------------- closing
    @property
    def closed(self) -> bool:
        return self.connection.closed

    def close(self, *, wait_process: float = 5.0) -> None:
        """Close the connection (pending calls fail); for a spawned server, wait for it to exit."""
        self.connection.close("client closed")
        if self.process is not None:
            try:
                self.process.wait(wait_process)
            except subprocess.TimeoutExpired:
                logger.warning("stdio server pid {} did not exit; killing it", self.process.pid)
                self.process.kill()
                self.process.wait()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _connect_to_ours(host: str, port: int, timeout: float, *, what: str = "the endpoint's token") -> socket.socket:
    """A connection to ``host:port`` whose listener runs as this user or root, trying each address
    the name resolves to in turn (``localhost`` may be ``::1`` and ``127.0.0.1``). Another user's
    listener on one of them is skipped, not taken for castor's serve: castor's serve binds one
    address, and another user who took the port on the other family used to make every client
    that tried that address first refuse (``peer_uid``) instead of reaching castor. ``Forbidden``
    (``peer_uid``) when only other users listen; the last connect error when nothing answers."""
    shown = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    failure: OSError | None = None
    foreign = False
    for family, kind, proto, _name, address in _addresses(host, port):
        sock = socket.socket(family, kind, proto)
        try:
            sock.settimeout(timeout)
            sock.connect(address)
            if tcp_peer_is_us(sock):
                return sock
            foreign = True
        except OSError as exc:
            failure = exc
        except BaseException:
            sock.close()
            raise
        sock.close()
    if foreign:
        raise Forbidden(f"refusing to send {what} to {shown}: another user listens there, "
                        "not castor's serve", data={"address": shown, "reason": "peer_uid"})
    raise failure if failure is not None else OSError(f"{shown} resolves to no address")


def _addresses(host: str, port: int) -> list[tuple[Any, ...]]:
    """Every address ``host`` resolves to, and for ``localhost`` both loopbacks: many systems'
    ``/etc/hosts`` give ``localhost`` only ``127.0.0.1`` (``::1`` being ``ip6-localhost``), and a
    castor serving ``--tcp [::1]:PORT`` was then "not listening" to ``--tcp localhost:PORT``.
    ``localhost`` is this machine's loopback whichever family it answers on (castor's serve binds one);
    a loopback this system does not have (no IPv6) is left out."""
    found = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    if host.lower() != "localhost":
        return found
    seen = {info[4][0] for info in found}
    for loopback in ("127.0.0.1", "::1"):
        if loopback not in seen:
            try:
                found += socket.getaddrinfo(loopback, port, type=socket.SOCK_STREAM)
            except OSError:  # socket.gaierror: this system has no such address family
                pass
    return found


def _caller_socket(sock: socket.socket) -> SocketTransport:
    transport = SocketTransport(sock)
    # Callers block in recv for their reply and re-check their deadline this often.
    transport.set_recv_timeout(0.02)
    return transport


def _adapt(fn: Callable[[dict[str, Any]], Any]) -> Callable[[dict[str, Any], Context], Any]:
    def handler(params: dict[str, Any], _ctx: Context) -> Any:
        return fn(params)

    handler.__name__ = getattr(fn, "__name__", "handler")
    return handler

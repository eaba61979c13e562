"""The msgpack-rpc server: stdio, a Unix socket or loopback TCP.

Guarantees:

* Each client gets its own :class:`Connection`; a misbehaving client (bad
  bytes, floods, never reading) loses only its own connection.
* In stdio mode the protocol owns file descriptor 1: the original stdout is
  duplicated for the protocol and fd 1 is pointed at stderr, so a stray
  ``print`` can never corrupt the stream. Logging goes to stderr.
* Shutdown (stdio EOF, SIGTERM/SIGINT/SIGHUP under :func:`serve`, or
  :meth:`Server.stop`) happens once, in this order: stop accepting, run the
  ``on_stopping`` hook while every connection is still open (what the runtime
  tells its peers as it stops -- a running turn's ``agent.abort_turn`` --
  still reaches them), close every connection (queued output flushed for a
  moment; pending calls fail with ``ConnectionClosed``), run the
  ``on_shutdown`` hook, remove the Unix socket file if it is still ours. A
  hook's failure is logged, never raised.
* Who may talk (see :mod:`castor.endpoint.auth`): TCP always needs the token, a Unix
  socket when ``token`` is given (its peer must also run as castor's user or root), stdio
  never. Until ``runtime.hello {token}`` every method is ``unauthenticated``.
* Fair slots: a connection that has not authenticated within ``hello_timeout`` is closed,
  and so is one that holds no session and has sent and received nothing for
  ``idle_timeout``, and one that began a frame and sent none of the rest for
  ``frame_stall_timeout`` -- sessions or not: its stream is stuck, and it held its slot (and
  what it sent of the frame, up to the frame limit) for ever (stdio is exempt from all three:
  it is the runtime's lifetime).
"""

from __future__ import annotations

import os
import selectors
import signal
import socket
import threading
import time
from collections.abc import Callable
from typing import Any

from castor._log import logger
from castor.endpoint.auth import MAY_TRUST, AuthGate
from castor.endpoint.connection import Connection, ConnectionSettings
from castor.endpoint.dispatch import Dispatcher
from castor.endpoint.framing import encode_error_notification
from castor.endpoint.listeners import (
    bind_tcp,
    bind_unix,
    is_loopback_host,
    peer_credentials,
    peer_is_us,
    tcp_peer_uid,
    unlink_if_ours,
)
from castor.endpoint.methods.ownership import SESSIONS_KEY
from castor.endpoint.transport import PipeTransport, SocketTransport
from castor.messages.errors import (
    FD_EXHAUSTION_ERRNOS,
    InvalidConfig,
    MailboxFull,
    Timeout,
    Unauthenticated,
    out_of_file_descriptors,
)
from castor.supervision.threads import start_thread

DEFAULT_HELLO_TIMEOUT_S = 10.0
"""A connection that must authenticate and has not within this long is closed."""
DEFAULT_IDLE_TIMEOUT_S = 300.0
"""A connection holding no session that has sent and received nothing for this long is closed."""
DEFAULT_FRAME_STALL_TIMEOUT_S = 60.0
"""A connection that began a frame and has sent no byte of the rest for this long is closed."""
REFUSAL_LOG_INTERVAL_S = 10.0
"""A refused connection (the endpoint full, a Unix peer of another user) is a warning at most this
often, each with how many were refused quietly since (debug lines): anyone may connect in a loop."""
PRE_AUTH_MAX_FRAME = 64 * 1024
PRE_AUTH_MAX_OUTBOUND = 256 * 1024
"""What castor queues for a peer that has not authenticated and does not read its refusals; over
it the connection is closed. 64 connection slots hold 16 MiB at most between them."""
"""The largest frame a connection may send before it has authenticated (a hello is a few hundred
bytes): anyone who can connect must not make castor buffer the protocol's full 16 MiB per slot."""
FD_EXHAUSTION = FD_EXHAUSTION_ERRNOS
"""``accept`` errnos that mean the process (or the system) has no descriptor or buffer to spare."""
EXHAUSTED_BACKOFF_S = 0.05
"""How long the accept loop waits when it could neither accept nor refuse (no fd even in reserve)."""

HOLDER_KEY = "holder"
"""``Connection.state``'s key for who is at the other end, set at accept (see :func:`_holder`)."""
HOLDERS_SHOWN = 5
"""How many peers the line of a refusal for a full endpoint names (the rest are counted together)."""

#: The server's own lines name it, as an actor's name its path (a connection's: ``/endpoint/CONN``).
_log = logger.bind(actor="/endpoint")


def take_reserve_fd() -> int | None:
    """A descriptor held in reserve (``/dev/null``), given back when ``accept`` finds none left so a
    waiting client can still be accepted and refused; None when there is none to take."""
    try:
        return os.open(os.devnull, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return None


def _exhausted(exc: OSError) -> MailboxFull:
    """The refusal a client gets while castor has no file descriptor for its connection."""
    return out_of_file_descriptors(exc)


def listening_words(address: str | tuple[str, int] | None) -> str:
    """Where an endpoint listens, as an operator writes it: ``unix:PATH``, ``tcp:HOST:PORT``
    (``tcp:[HOST]:PORT`` for an IPv6 host), ``stdio``; never a Python tuple."""
    if address is None or address == "stdio":  # a Unix socket's address is an absolute path
        return "stdio"
    if isinstance(address, str):
        return f"unix:{address}"
    host, port = address[0], address[1]
    return f"tcp:[{host}]:{port}" if ":" in str(host) else f"tcp:{host}:{port}"


class Server:
    """One listening endpoint. ``start()`` returns at once; ``stop()`` is idempotent."""

    def __init__(self, dispatcher: Dispatcher, *, stdio: bool = False, unix_path: str | None = None,
                 tcp: tuple[str, int] | None = None, settings: ConnectionSettings | None = None,
                 on_shutdown: Callable[[], Any] | None = None, max_connections: int = 64,
                 on_stopping: Callable[[], Any] | None = None,
                 stdin_fd: int = 0, stdout_fd: int = 1, token: str | None = None,
                 hello_timeout: float | None = DEFAULT_HELLO_TIMEOUT_S,
                 idle_timeout: float | None = DEFAULT_IDLE_TIMEOUT_S,
                 on_connection_closed: Callable[[], Any] | None = None,
                 frame_stall_timeout: float | None = DEFAULT_FRAME_STALL_TIMEOUT_S) -> None:
        modes = sum(1 for m in (stdio, unix_path is not None, tcp is not None) if m)
        if modes != 1:
            raise InvalidConfig("serve exactly one of: stdio, unix_path, tcp")
        if tcp is not None and not token and is_loopback_host(tcp[0]):  # (any other host: forbidden at start)
            raise InvalidConfig("a TCP endpoint needs a token (castor.endpoint.auth.new_token_file)")
        if stdio and token:
            raise InvalidConfig("stdio trusts its parent process: it takes no token")
        for name, value in (("hello_timeout", hello_timeout), ("idle_timeout", idle_timeout),
                            ("frame_stall_timeout", frame_stall_timeout)):
            if value is not None and not 0 < value < float("inf"):
                raise InvalidConfig(f"{name} must be a positive number of seconds or None")
        self.token = token
        self.hello_timeout = hello_timeout
        self.idle_timeout = idle_timeout
        self.frame_stall_timeout = frame_stall_timeout
        self._stalls: dict[int, tuple[int, float]] = {}  # conn id -> (bytes read in all, since) mid-frame
        self._reaper: threading.Thread | None = None
        self._reaper_stop = threading.Event()
        self._seen: dict[int, tuple[int, int, float]] = {}  # conn id -> (frames in, frames out, since)
        self._refusals: dict[str, tuple[float, int]] = {}  # refusal -> (last warned, refused quietly since)
        self.dispatcher = dispatcher
        self.settings = settings or ConnectionSettings()
        self.on_shutdown = on_shutdown
        self.on_stopping = on_stopping
        #: Called (on the closing thread; it must not block) after each connection closes: the
        #: runtime gives the allocator's free pages back then, or what a peer that never read left
        #: queued (up to the outbound bound, 32 MiB) would stay with the process.
        self.on_connection_closed = on_connection_closed
        self.max_connections = max_connections
        self._stdio = stdio
        self._stdin_fd, self._stdout_fd = stdin_fd, stdout_fd
        self._unix_path = os.path.abspath(unix_path) if unix_path is not None else None
        self._tcp = tcp
        self._listener: socket.socket | None = None
        self._inode: int | None = None
        self._conns: dict[int, Connection] = {}
        self._lock = threading.Lock()
        self._stopping = False
        self._stopped = threading.Event()
        self._wake_r, self._wake_w = socket.socketpair()
        self._accept_thread: threading.Thread | None = None
        self._reserve_fd: int | None = None  # one fd held back to refuse a connection when none is left
        self._exhausted_logged = False
        self.address: str | tuple[str, int] | None = None

    # ---------------------------------------------------------------- lifecycle
    def start(self) -> Server:
        if self._stdio:
            self._start_stdio()
        else:
            if self._unix_path is not None:
                self._listener, self._inode = bind_unix(self._unix_path)
                self.address = self._unix_path
                kind = "unix"
            else:
                host, port = self._tcp  # type: ignore[misc]  # exactly one mode is set, checked in __init__
                self._listener = bind_tcp(host, port)
                self.address = self._listener.getsockname()[:2]
                kind = "tcp"
            self._reserve_fd = take_reserve_fd()
            self._accept_thread = start_thread(self._accept_loop, args=(kind,), name="castor-accept",
                                               owner="/endpoint", purpose="accept connections")
            if (self.idle_timeout is not None or self.frame_stall_timeout is not None
                    or (self.token and self.hello_timeout is not None)):
                self._reaper = start_thread(self._reap_loop, name="castor-reaper", owner="/endpoint",
                                            purpose="close idle and unauthenticated connections")
        _log.info("castor endpoint listening on {}", listening_words(self.address))
        return self

    def _start_stdio(self) -> None:
        out_fd = self._stdout_fd
        if out_fd == 1:
            # Keep the real stdout for frames; send anything else written to fd 1 to stderr.
            out_fd = os.dup(1)
            os.dup2(2, 1)
        conn = Connection(PipeTransport(self._stdin_fd, out_fd, peer="stdio"), self.dispatcher,
                          settings=self.settings, name="stdio")
        self.address = "stdio"
        conn.state[MAY_TRUST] = True  # the parent process that started castor
        self._track(conn)
        # EOF on stdin means the harness is gone: shut the whole runtime down.
        conn.add_close_callback(lambda _c: self.stop_in_background("stdio closed"))
        conn.start()

    def connections(self) -> list[Connection]:
        """The open connections (one closed a moment ago may still be untracking: not listed)."""
        with self._lock:
            return [c for c in self._conns.values() if not c.closed]

    def wait(self, timeout: float | None = None) -> bool:
        """Block until the server has fully stopped; ``False`` on timeout."""
        return self._stopped.wait(timeout)

    @property
    def stopped(self) -> bool:
        return self._stopped.is_set()

    def stop(self, reason: str = "server stopping", *, flush_timeout: float = 0.5) -> None:
        with self._lock:
            if self._stopping:
                first = False
            else:
                self._stopping = first = True
        if not first:
            self._stopped.wait()
            return
        _log.info("castor endpoint stopping: {}", reason)
        try:
            self._wake_w.send(b"x")
        except OSError:
            pass
        if self._accept_thread is not None:
            self._accept_thread.join(5.0)
        if self._reaper is not None:
            self._reaper_stop.set()
            self._reaper.join(5.0)
        if self._listener is not None:
            self._listener.close()
        if self.on_stopping is not None:
            try:
                self.on_stopping()
            except Exception:
                _log.exception("on_stopping hook failed")
        for conn in self.connections():
            conn.close(reason, flush_timeout=flush_timeout)
        if self.on_shutdown is not None:
            try:
                self.on_shutdown()
            except Exception:
                _log.exception("on_shutdown hook failed")
        if self._unix_path is not None and self._inode is not None:
            unlink_if_ours(self._unix_path, self._inode)
        if self._reserve_fd is not None:
            os.close(self._reserve_fd)
            self._reserve_fd = None
        for own in (self._wake_r, self._wake_w):
            try:
                own.close()
            except OSError:  # its number was also the peer's (stdio started with fd 0 closed), closed with it
                pass
        self._stopped.set()
        _log.info("castor endpoint stopped")

    def stop_in_background(self, reason: str) -> None:
        """Start :meth:`stop` on its own (non-daemon) thread and return at once: for a signal
        handler or a close callback, which must not wait for the connections to drain."""
        start_thread(self.stop, args=(reason,), name="castor-shutdown", owner="/endpoint",
                     purpose="stop the endpoint and drain its connections", daemon=False)

    # ---------------------------------------------------------------- accepting
    def _accept_loop(self, kind: str) -> None:
        assert self._listener is not None
        sel = selectors.DefaultSelector()
        sel.register(self._listener, selectors.EVENT_READ, "listener")
        sel.register(self._wake_r, selectors.EVENT_READ, "wake")
        idle = selectors.DefaultSelector()  # made now: once the process is out of fds it could not be
        idle.register(self._wake_r, selectors.EVENT_READ, "wake")
        try:
            while not self._stopping:
                for key, _ in sel.select():
                    if key.data == "wake":
                        return
                    if not self._accept_guarded(kind) and idle.select(EXHAUSTED_BACKOFF_S):
                        return  # out of fds and nothing shed: wait a little (woken by stop) rather than spin
        finally:
            sel.close()
            idle.close()

    def _accept_guarded(self, kind: str) -> bool:
        """Accept one connection; False when the process is out of file descriptors and the
        connection waiting could not even be refused (the caller then backs off). Nothing here may
        end the accept thread: a server that stops accepting still looks alive to every check and
        leaves each new client waiting for a reply that never comes."""
        try:
            return self._accept_one(kind)
        except Exception:  # pragma: no cover - castor's own bug; logged, and the next connection is accepted
            _log.exception("accepting a connection failed")
            return True

    def _accept_one(self, kind: str) -> bool:
        try:
            sock, _addr = self._listener.accept()  # type: ignore[union-attr]  # bound in start() before any accept
        except (BlockingIOError, InterruptedError):
            return True
        except OSError as exc:
            if exc.errno in FD_EXHAUSTION:
                return self._shed_while_exhausted(exc)
            _log.warning("accept failed: {}", exc)
            return True
        # A Unix peer of another user is refused first: it must never make room (an eviction would
        # close the user's own connection that has not said hello yet for a peer refused anyway).
        same_user = kind == "unix" and _peer_is_us(sock)
        if kind == "unix" and not same_user:
            self._refuse(sock, Unauthenticated("the peer runs as another user", data={"reason": "peer_uid"}))
            return True
        with self._lock:
            # A connection already closing (its close runs its callbacks last, this slot's release
            # among them) holds no slot: counted, it refused a newcomer it could not make room for.
            full = sum(1 for c in self._conns.values() if not c.closed) >= self.max_connections
            # Full: the oldest connection that has not authenticated yet makes room (with a token,
            # every connection starts unauthenticated, so refusing the newcomer would let anyone who
            # can connect keep every slot with connections that never say hello).
            evicted = self._oldest_unauthenticated_locked() if full else None
        if evicted is not None:
            self._close_slot(evicted, Unauthenticated(
                "the endpoint is full and this connection has not authenticated; closing it to make room",
                data={"reason": "evicted_unauthenticated"}), flush_timeout=0.0)
            full = False
        if full:
            self._refuse(sock, holders=True)
            return True
        try:
            conn = Connection(SocketTransport(sock), self.dispatcher, settings=self.settings)
        except OSError as exc:  # its wake-up pipe: the process is out of file descriptors
            self._note_exhausted(exc)
            self._refuse(sock, _exhausted(exc), log=False)
            return True
        self._exhausted_logged = False
        if self._reserve_fd is None:  # given back in a spell that left none to take it again: take it now
            self._reserve_fd = take_reserve_fd()
        conn.name = f"{kind}-{conn.id}"
        conn.state["accepted_at"] = time.monotonic()
        conn.state[HOLDER_KEY] = _holder(sock, kind)
        if self.token:
            # AuthGate has the Dispatcher's interface without being one
            conn.dispatcher = AuthGate(self.dispatcher, self.token)  # type: ignore[assignment]  # the gate wraps the dispatcher with the same call surface
            conn.limit_frames(PRE_AUTH_MAX_FRAME)  # until the hello: no one buffers megabytes unasked,
            conn.limit_outbound(PRE_AUTH_MAX_OUTBOUND)  # in or out
            conn.quiet_peer_faults(True)  # nor writes a log line per connect
        else:
            conn.state[MAY_TRUST] = same_user
        self._track(conn)
        conn.start()
        _log.debug("accepted connection {}", conn.name)
        return True

    def _note_exhausted(self, exc: OSError) -> None:
        """One warning per spell of exhaustion (until a connection is accepted again), not one per refusal."""
        if not self._exhausted_logged:
            self._exhausted_logged = True
            _log.warning("out of file descriptors: refusing new connections until some close ({})", exc)

    def _shed_while_exhausted(self, exc: OSError) -> bool:
        """``accept`` failed for want of a file descriptor: the connection stays queued and the
        listener stays readable. Give back the descriptor kept in reserve for this, accept the
        waiting connection, refuse it with a typed ``mailbox_full`` and take the reserve again, so
        its client gets an answer at once instead of waiting on a backlog nobody drains."""
        self._note_exhausted(exc)
        if self._reserve_fd is None:
            return False
        os.close(self._reserve_fd)
        self._reserve_fd = None
        try:
            sock, _addr = self._listener.accept()  # type: ignore[union-attr]  # bound in start()
        except OSError:
            sock = None
        if sock is not None:
            self._refuse(sock, _exhausted(exc), log=False)
        self._reserve_fd = take_reserve_fd()
        return sock is not None

    def _refuse(self, sock: socket.socket, err: Any = None, *, log: bool = True, holders: bool = False) -> None:
        err = err or MailboxFull(f"too many connections (limit {self.max_connections})",
                                 data={"limit": self.max_connections})
        try:
            sock.settimeout(0.5)
            sock.sendall(encode_error_notification(err.to_wire()))
        except OSError:
            pass
        finally:
            sock.close()
        if not log:
            return
        # Anyone who can connect can make a refusal (a full endpoint, a Unix peer of another user):
        # one warning, then at most one every REFUSAL_LOG_INTERVAL_S saying how many were refused
        # meanwhile (each a debug line), so connecting in a loop cannot fill castor's log.
        now = time.monotonic()
        with self._lock:
            last, quiet = self._refusals.get(err.message, (-REFUSAL_LOG_INTERVAL_S, 0))
            warn = now - last >= REFUSAL_LOG_INTERVAL_S
            self._refusals[err.message] = (now, 0) if warn else (last, quiet + 1)
        if warn:
            # A full endpoint: the line names who holds the slots (one warning in ten seconds at most,
            # so the walk over the connections is not per refusal), or an operator cannot tell the
            # runaway client from the rest.
            held = f"; the slots are held by {self._holders()}" if holders else ""
            _log.warning("refused a connection: {}{}{}", err.message, held,
                           f" ({quiet} more refused so since the last such line)" if quiet else "")
        else:
            _log.debug("refused a connection: {}", err.message)

    # ---------------------------------------------------------------- fair slots
    def _reap_loop(self) -> None:
        bounds = [t for t in (self.idle_timeout, self.hello_timeout if self.token else None,
                              self.frame_stall_timeout) if t is not None]
        tick = min(1.0, max(0.02, min(bounds) / 4))
        while not self._reaper_stop.wait(tick) and not self._stopping:
            now = time.monotonic()
            for conn in self.connections():
                try:
                    self._reap_one(conn, now)
                except Exception:  # pragma: no cover - the reaper must not die
                    _log.exception("connection reaper failed on {}", conn.name)

    def _reap_one(self, conn: Connection, now: float) -> None:
        if conn.closed or conn.name == "stdio":
            return
        if (self.token and self.hello_timeout is not None and isinstance(conn.dispatcher, AuthGate)
                and now - conn.state.get("accepted_at", now) >= self.hello_timeout):
            self._close_slot(conn, Unauthenticated(
                f"no runtime.hello with the token within {self.hello_timeout:g} s; closing",
                data={"reason": "hello_timeout", "seconds": self.hello_timeout}))
            return
        if self._frame_stalled(conn, now):
            return
        if self.idle_timeout is None:
            return
        counters = conn.counters
        activity = (counters["frames_in"], counters["frames_out"])
        seen = self._seen.get(conn.id)
        if seen is None or seen[:2] != activity:
            self._seen[conn.id] = (*activity, now)
            return
        if conn.state.get(SESSIONS_KEY) or conn.handlers_running or conn.calls_pending:
            self._seen[conn.id] = (*activity, now)  # holds a session or work: never idle
            return
        if now - seen[2] >= self.idle_timeout:
            self._close_slot(conn, Timeout(
                f"idle for {self.idle_timeout:g} s with no session open; closing",
                data={"reason": "idle_timeout", "seconds": self.idle_timeout}))

    def _frame_stalled(self, conn: Connection, now: float) -> bool:
        """Close ``conn`` (``timeout``, ``data.reason: frame_stalled``) when it began a frame and
        has sent no byte since for ``frame_stall_timeout``; True when it did. A healthy peer writes
        a frame in one go; one stuck halfway (a hung writer, a peer holding the slot on purpose)
        was never closed while it held a session, nor its partial frame freed."""
        if self.frame_stall_timeout is None:
            return False
        incomplete = conn.incomplete_frame()
        # (With a handler still running, the reader may be what is stuck -- every worker busy --
        # and the rest of the frame unread in the socket: the peer is not judged then.)
        if incomplete is None or conn.handlers_running:
            self._stalls.pop(conn.id, None)
            return False
        begun, fed = incomplete
        seen = self._stalls.get(conn.id)
        if seen is None or seen[0] != fed:
            self._stalls[conn.id] = (fed, now)
            return False
        if now - seen[1] < self.frame_stall_timeout:
            return False
        self._close_slot(conn, Timeout(
            f"a frame begun ({begun} bytes so far) had no more bytes for {self.frame_stall_timeout:g} s; closing",
            data={"reason": "frame_stalled", "seconds": self.frame_stall_timeout, "bytes": begun}))
        return True

    def _close_slot(self, conn: Connection, err: Any, *, flush_timeout: float = 0.5) -> None:
        """Tell the peer why (best effort) and close. An eviction runs on the accept thread: it does
        not wait for a peer that is not reading (``flush_timeout=0``), or a crowd of such peers would
        hold every accept -- the token holder's among them -- half a second each."""
        _log.info("closing {}: {}", conn.name, err.message)
        conn.notify("error", err.to_wire())
        conn.close(str(err.data.get("reason", "reaped")), flush_timeout=flush_timeout)

    def _holders(self) -> str:
        """Who holds the open connections, most first: ``3 by unix peer uid 1000 pid 4242, 1 by tcp
        peer 127.0.0.1 uid 1000`` (the uid and pid where the system told them at accept)."""
        with self._lock:
            held = [c for c in self._conns.values() if not c.closed]
        counts: dict[str, int] = {}
        for conn in held:
            who = _with_tcp_uid(conn)
            counts[who] = counts.get(who, 0) + 1
        ranked = sorted(counts.items(), key=lambda item: (-item[1], item[0]))
        shown = ", ".join(f"{n} by {who}" for who, n in ranked[:HOLDERS_SHOWN])
        rest = sum(n for _who, n in ranked[HOLDERS_SHOWN:])
        return shown + (f", {rest} by {len(ranked) - HOLDERS_SHOWN} other peers" if rest else "")

    def _oldest_unauthenticated_locked(self) -> Connection | None:
        """The longest-connected connection still behind its AuthGate, if any (under ``_lock``)."""
        gated = [c for c in self._conns.values() if isinstance(c.dispatcher, AuthGate) and not c.closed]
        return min(gated, key=lambda c: c.state.get("accepted_at", 0.0)) if gated else None

    def _track(self, conn: Connection) -> None:
        with self._lock:
            self._conns[conn.id] = conn
        conn.add_close_callback(self._untrack)

    def _untrack(self, conn: Connection) -> None:
        with self._lock:
            self._conns.pop(conn.id, None)
        self._seen.pop(conn.id, None)
        self._stalls.pop(conn.id, None)
        if self.on_connection_closed is not None:
            try:
                self.on_connection_closed()
            except Exception:  # noqa: BLE001 - the close itself is done; never let an observer undo it
                _log.opt(exception=True).warning("on_connection_closed failed")


def _holder(sock: socket.socket, kind: str) -> str:
    """Who is at the other end of an accepted connection, in words, for the line that says who holds
    the slots when the endpoint is full: ``unix peer uid 1000 pid 4242`` (``SO_PEERCRED``), ``tcp peer
    127.0.0.1`` (the port left out, so that one client's connections count together; its uid is
    looked up only when a full endpoint names it: :func:`_with_tcp_uid`)."""
    if kind == "unix":
        creds = peer_credentials(sock)
        return f"unix peer uid {creds[1]} pid {creds[0]}" if creds else "unix peer"
    try:
        host = sock.getpeername()[0]
    except (OSError, IndexError, TypeError):
        return f"{kind} peer"
    return f"{kind} peer {host}"


def _with_tcp_uid(conn: Connection) -> str:
    """``conn``'s holder with the uid running its TCP peer added (its row in ``/proc/net/tcp``, read
    on a duplicate of the connection's descriptor, once: the answer is kept), where the system tells."""
    holder = str(conn.state.get(HOLDER_KEY) or "an unknown peer")
    if not holder.startswith("tcp peer ") or " uid " in holder:
        return holder
    fd = getattr(conn.transport, "read_fd", None)
    uid = None
    if isinstance(fd, int) and fd >= 0:
        try:
            with socket.socket(fileno=os.dup(fd)) as sock:
                uid = tcp_peer_uid(sock)
        except OSError:
            uid = None
    if uid is not None:
        holder = f"{holder} uid {uid}"
        conn.state[HOLDER_KEY] = holder
    return holder


def _peer_is_us(sock: socket.socket) -> bool:
    """A Unix socket peer runs as castor's user or as root (``SO_PEERCRED``; ``True`` where the
    platform cannot tell: the socket file's ``0600`` mode is then the only check)."""
    return peer_is_us(sock)


def serve(dispatcher: Dispatcher, *, stdio: bool = False, unix_path: str | None = None,
          tcp: tuple[str, int] | None = None, settings: ConnectionSettings | None = None,
          on_shutdown: Callable[[], Any] | None = None, on_ready: Callable[[Server], Any] | None = None,
          on_stopping: Callable[[], Any] | None = None,
          max_connections: int = 64, fatal: threading.Event | None = None, token: str | None = None,
          hello_timeout: float | None = DEFAULT_HELLO_TIMEOUT_S,
          idle_timeout: float | None = DEFAULT_IDLE_TIMEOUT_S,
          on_connection_closed: Callable[[], Any] | None = None,
          frame_stall_timeout: float | None = DEFAULT_FRAME_STALL_TIMEOUT_S) -> None:
    """Run a :class:`Server` until stdio EOF, SIGTERM/SIGINT/SIGHUP (unless SIGHUP is ignored, as
    under ``nohup``), ``stop()`` or ``fatal`` is set
    (the runtime behind it failed for good: serving on would only answer ``not_found``); then
    return.

    Signal handlers are installed only when called from the main thread and are
    restored on return. ``on_ready(server)`` runs once the endpoint listens.
    """
    server = Server(dispatcher, stdio=stdio, unix_path=unix_path, tcp=tcp, settings=settings,
                    on_shutdown=on_shutdown, on_stopping=on_stopping, max_connections=max_connections, token=token,
                    hello_timeout=hello_timeout, idle_timeout=idle_timeout,
                    on_connection_closed=on_connection_closed, frame_stall_timeout=frame_stall_timeout)
    previous: dict[int, Any] = {}
    if threading.current_thread() is threading.main_thread():
        def _on_signal(signum: int, _frame: Any) -> None:
            server.stop_in_background(f"signal {signal.Signals(signum).name}")

        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            if sig == signal.SIGHUP and signal.getsignal(sig) == signal.SIG_IGN:
                continue  # started under nohup: a closed terminal is not ours to act on
            previous[sig] = signal.signal(sig, _on_signal)
    try:
        server.start()
        if on_ready is not None:
            on_ready(server)
        while not server.wait(0.5):  # a timed wait keeps the main thread responsive to signals
            if fatal is not None and fatal.is_set():
                server.stop("the runtime failed fatally")
                break
    finally:
        if not server.stopped:
            server.stop("serve() exiting")
        for signum, handler in previous.items():
            signal.signal(signum, handler)

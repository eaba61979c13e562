"""The live web console: the actor tree, each cast's loadout graph and feed, worker stats, /metrics.

Served by the standard library's :class:`http.server.ThreadingHTTPServer` on a loopback
address only (see docs/dependencies.md for why no web framework). Pages are plain HTML with
a little vanilla JavaScript; live updates are pushed by the server as Server-Sent Events.
Nothing here sends a message to an actor: every figure comes from snapshots (handles) and
files a cast already wrote.

Routes: ``/`` the tree, sessions, casts and workers; ``/events`` their stream (the whole document
when it opens, then what changed: :mod:`castor.console.delta`); ``/cast/<sid>/<cast_id>``
one cast (its graph, event feed, usage); ``/casts/<sid>`` every cast of the session's project, a page at
a time (``?cursor=``); and ``/events/cast/<sid>/<cast_id>`` its stream (the whole
document first, then what changed, as ``/events``; ``?probe``: answered as the stream would be, without it);
``/api/actors`` one JSON snapshot; ``/metrics`` Prometheus text; ``/favicon.ico`` an empty ``204``,
with or without the token (a browser asks every host for it, outside the cookie's path).

Access: when a token is set, every request must carry it — ``?token=…`` (answered with a
cookie, so the page's own requests need not repeat it), the cookie, or ``Authorization:
Bearer …``; anything else is ``401``. The cookie never holds the token: browsers send a cookie to
every port of its host, so any page another local user serves on 127.0.0.1 could receive it (and
the console's token may be the endpoint's). It holds a secret only the token gives
(:attr:`ConsoleServer.cookie_secret`, an HMAC of it and the port), under a name with the console's
port in it, and a browser sends it under one path only, :attr:`ConsoleServer.base`
(``/c/<secret>/``, another such HMAC), where the pages, their links and their streams live: a page on
another port has other paths, so it never receives the cookie, which would open this console if
replayed. Both are the same when castor serves again with the same token on the same port, so an
open page goes live again by itself; a token castor makes per serve changes both. Any page of the host may set
cookies the browser then sends here as well (one of the console's name, one of no valid syntax):
the console's cookie counts wherever it stands in the header (:func:`cookie_values`). A ``Host`` header
that does not name this loopback listener is ``403`` (a page elsewhere cannot reach the console through DNS rebinding).
"""

from __future__ import annotations

import base64
import errno
import hashlib
import hmac
import http.client
import json
import os
import re
import secrets
import socket
import sys
import threading
import time
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Callable
from urllib.parse import parse_qs, unquote_plus, urlsplit

from castor._log import logger
from castor.console import delta, pages
from castor.console.metrics import CONTENT_TYPE as METRICS_TYPE
from castor.console.metrics import metrics_text
from castor.endpoint.server import EXHAUSTED_BACKOFF_S, FD_EXHAUSTION, take_reserve_fd
from castor.messages.errors import CastorError, Forbidden, InvalidParams
from castor.supervision.threads import start_thread

_QUERY_PARAM = re.compile(r"([?&])([^=&\s\"#]*)=([^&\s\"#]*)")
"""A ``key=value`` parameter of a query in a request line or a path."""


def without_token(text: str) -> str:
    """``text`` (a request line or a path) with the value of every query parameter whose key the
    query parser reads as ``token`` replaced by ``…`` -- ``%74oken=`` included, which opens the
    console as ``token=`` does: the log is no place for a credential."""

    def hide(match: re.Match[str]) -> str:
        sep, key, _value = match.groups()
        return f"{sep}{key}=…" if unquote_plus(key) == "token" else match.group(0)

    return _QUERY_PARAM.sub(hide, text)

def cookie_values(headers: list[str], name: str) -> list[str]:
    """Every value the ``Cookie`` headers give the cookie ``name``, in order. A browser sends a
    host's cookies to every port of it and any page of the host may set them, so a header may hold
    several cookies of one name (the console's own, and one another local user's page planted with
    ``Path=/``) beside cookies of other sites that are no valid cookie syntax at all: each
    ``name=value`` pair is read on its own, and nothing else in the header hides one."""
    values = []
    for header in headers:
        for pair in header.split(";"):
            key, sep, value = pair.partition("=")
            if sep and key.strip() == name:
                value = value.strip()
                values.append(value[1:-1] if len(value) >= 2 and value[0] == value[-1] == '"' else value)
    return values


COOKIE = "castor_console_"
"""The cookie's name is this and the console's port (two consoles on one host keep theirs)."""
#: Seconds between two pushes of a live page.
PUSH_INTERVAL_S = 1.0
#: The main stream sends a patch from any of this many newest versions (a stream a slow reader held
#: back a version or two still gets one); from an older one, the whole document.
KEPT_VERSIONS = 4
#: A live stream ends after this long (the page's EventSource reconnects by itself).
STREAM_MAX_S = 600.0
#: Live streams open at once, at most (each is a thread); one more is answered 503.
MAX_STREAMS = 16
#: Connections served at once, at most (each is a thread; streams count among them); one more is
#: answered 503 and closed at once.
MAX_CONNECTIONS = 64
#: Seconds the accepting thread waits for an evicted connection's slot (its handler ends at once).
EVICTION_WAIT_S = 0.5
#: Bytes a request's headers may take in all (the request line aside): the standard library takes
#: 100 lines of 64 KiB each, 6 MB a connection held before any token is checked.
MAX_HEAD_BYTES = 64 * 1024
#: Bytes of ``Cookie`` header lines a request may send in all (read a piece at a time, only the
#: console's own pairs kept): a browser sends up to about 180 cookies of 4 KiB for a host.
MAX_COOKIE_BYTES = 1024 * 1024
_COOKIE_PIECE = 8192
#: A pending piece of a cookie line longer than this is not the console's pair (its name and a
#: 43-character secret): the rest of it, up to the next ``;``, is skipped unread into memory.
_LONGEST_OWN_PAIR = 512
#: Seconds a connection may stay silent while sending its request, or not take a pushed event.
SOCKET_TIMEOUT_S = 10.0
#: The answer to a request without the console's token: what opens the console, for a person who
#: followed an old link (a page of a serve with another token, whose cookie ended with it) or a wrong token.
UNAUTHORISED_TEXT = (b"unauthorized: this console needs its token. Open the URL `castor serve` printed with "
                     b"?token=$(cat TOKEN_FILE) (the serving line names the token file); a token of an earlier "
                     b"serve no longer opens it, nor does a page opened with one.\n")


def read_token_file(path: str) -> str:
    """The token in ``path``: its first line, stripped, of at least 16 characters (else
    ``invalid_params``), from a file that is as private as the endpoint's token file must be (owned
    by castor's user, readable by no one else, not a symlink: else ``forbidden``; missing:
    ``not_found``). The console shows each cast's request and the actor tree: a token other users
    could read would open it to them."""
    from castor.endpoint.auth import read_private_text
    from castor.messages.errors import NotFound

    text = read_private_text(path, what="console token file", missing=NotFound, malformed=InvalidParams).strip()
    token = text.splitlines()[0].strip() if text else ""
    if len(token) < 16:
        raise InvalidParams(f"the console token file {path} holds no token of at least 16 characters",
                            data={"path": path})
    return token


def _derived(token: str | None, purpose: str, port: int, size: int) -> str:
    """``size`` bytes, URL-safe base64, that only ``token`` gives for ``purpose`` on ``port`` (an
    HMAC of the token): the same across serves of the same token on the same port, so a page open
    in a browser goes live again by itself when castor serves again; a new token (castor makes one
    per serve unless given one) makes new ones. Random without a token."""
    if token is None:
        return secrets.token_urlsafe(size)
    digest = hmac.new(token.encode(), f"castor console {purpose} {port}".encode(), hashlib.sha256).digest()
    return base64.urlsafe_b64encode(digest[:size]).decode().rstrip("=")


class ConsoleServer:
    """``start()`` binds and serves on a thread; ``stop()`` ends every stream and the listener."""

    def __init__(self, runtime: Any, host: str, port: int, *, token: str | None = None) -> None:
        from castor.endpoint.listeners import is_loopback_host

        if not is_loopback_host(host):
            raise Forbidden(f"refusing to serve the console on non-loopback host {host!r}", data={"host": host})
        self.runtime = runtime
        self.token = token
        self.stopping = threading.Event()
        self.streams = threading.BoundedSemaphore(MAX_STREAMS)
        self._tree_lock = threading.Lock()
        self._tree_taken = 0.0  # when the newest version was taken (monotonic)
        self._tree = delta.Versions(KEPT_VERSIONS)  # the main stream's, shared by every open page
        console = self

        class Handler(_Handler):
            server_console = console

        family_host = host.strip("[]")
        server_class = _Server6 if ":" in family_host else _Server
        try:
            self.httpd = server_class((family_host, port), Handler)
        except OSError as exc:
            from castor.endpoint.listeners import address_refused

            raise address_refused("the console", family_host, port, exc) from None
        # Shown (and named in the serving line) as the address it is bound to: `localhost` binds
        # 127.0.0.1 alone, and a browser told `localhost` tries [::1] first, which any user may hold.
        self.host, self.port = str(self.httpd.server_address[0]), self.httpd.server_address[1]
        self.cookie_name = f"{COOKIE}{self.port}"
        self.cookie_secret = _derived(token, "cookie", self.port, 32)
        """What the console's cookie holds: never the token, but a secret only the token gives (see
        the module doc)."""
        self.base = f"/c/{_derived(token, 'base', self.port, 18)}/" if token is not None else "/"
        """The path its pages, links and streams live under, and the only one its cookie is sent to:
        a secret only the token gives, so no page on another port of this host can have it (see the
        module doc)."""
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}/"

    def start(self) -> ConsoleServer:
        self._thread = start_thread(self.httpd.serve_forever, kwargs={"poll_interval": 0.2}, name="castor-console",
                                    owner="/console", purpose="serves the web console")
        logger.bind(actor="/console").info("console serving on {}", self.url)
        return self

    def stop(self) -> None:
        self.stopping.set()
        self.httpd.backoff_over.set()  # an accept loop waiting out an exhaustion stops waiting
        self.httpd.shutdown()
        self.httpd.server_close()
        if self._thread is not None:
            self._thread.join(5)

    def tree_event(self, since: int | None) -> tuple[int, str]:
        """The main stream's next event for a stream that last sent version ``since`` (None: none
        yet), and the version it brings the page to, as JSON text (:class:`delta.Versions`: what
        changed since ``since`` while it is one of the :data:`KEPT_VERSIONS` newest, else the whole
        anchored document). A version is taken at most once a push interval and shared by every open
        page, and so is each event's text: several watchers cost one snapshot a push and one
        serialisation of each event (at 1,000 casts the whole document is about 2.5 MB, some 25 ms
        of the process's time to write; a patch, what moved in a second)."""
        with self._tree_lock:
            if self._tree.newest == 0 or time.monotonic() - self._tree_taken >= PUSH_INTERVAL_S * 0.8:
                moments: dict[int, float] = {}
                self._tree.add(pages.tree_data(self.runtime, moments), moments)
                self._tree_taken = time.monotonic()
            return self._tree.event(since)

    def allowed_hosts(self) -> set[str]:
        names = {self.host, "localhost"}
        hosts = set()
        for name in names:
            shown = f"[{name}]" if ":" in name else name
            hosts |= {f"{shown}:{self.port}".lower()}
        return hosts


def _tree_events(console: ConsoleServer) -> Callable[[], str]:
    """The events of one main-page stream: the whole document first, then what changed since the
    version it last sent (:meth:`ConsoleServer.tree_event`)."""
    sent: int | None = None

    def produce() -> str:
        nonlocal sent
        sent, text = console.tree_event(sent)
        return text

    return produce


def _cast_events(runtime: Any, sid: str, cast_id: str) -> Callable[[], str]:
    """The events of one cast page's stream, as the main stream's are (:class:`delta.Versions`,
    one a stream): the whole document first, then what changed since the previous push. A page
    that misses one reconnects, and a new stream starts whole."""
    versions = delta.Versions(2)  # the version the stream sent last, and the newest

    def produce() -> str:
        versions.add(pages.cast_data(runtime, sid, cast_id))
        return versions.event(versions.newest - 1 or None)[1]

    return produce


def _refuse_503(request: Any, body: bytes) -> None:
    """Answer ``503`` with ``body`` in a single non-blocking send (a peer that does not read costs
    the accepting thread nothing) and close."""
    try:
        request.setblocking(False)
        request.send(b"HTTP/1.1 503 Service Unavailable\r\nConnection: close\r\n"
                     b"Content-Type: text/plain; charset=utf-8\r\n"
                     + f"Content-Length: {len(body)}\r\n\r\n".encode() + body)
    except OSError:
        pass
    finally:
        try:
            request.shutdown(socket.SHUT_WR)
        except OSError:
            pass
        try:
            request.close()
        except OSError:
            pass


def _cut(connection: Any) -> None:
    """Shut ``connection`` down both ways: its handler's blocked read ends at once."""
    try:
        connection.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass


class _Server(ThreadingHTTPServer):
    """One thread per connection, at most MAX_CONNECTIONS at once: the listener is open to every
    local user before any token is checked, so a crowd of connections must not cost castor's
    process a thread each. When every slot is taken, the connection that has waited longest
    without sending its request is closed to make room; when none is waiting (every one is
    mid-request), the newcomer is answered 503 (a single non-blocking send) and closed on the
    accepting thread, which never waits for it.

    Out of file descriptors (``accept`` fails with ``EMFILE``: ``ulimit -n``, a crowd of
    connections), the connection stays queued and the listener readable: the loop would spin and the
    client wait for ever. As the msgpack endpoint does, the server keeps one descriptor in reserve:
    it gives it back, accepts the waiting connection, answers it ``503`` (out of file descriptors),
    closes it and takes the reserve again; with no reserve to give it waits ``EXHAUSTED_BACKOFF_S``.
    One warning per spell; it serves again as soon as descriptors are free."""

    daemon_threads = True
    allow_reuse_address = True
    request_queue_size = 128  # the default 5 made a burst (a page and its streams) wait in SYN retries

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self.slots = threading.BoundedSemaphore(MAX_CONNECTIONS)
        self._awaited: dict[Any, float] = {}  # connection -> when its request must have arrived
        self._awaited_lock = threading.Lock()
        self.backoff_over = threading.Event()  # set by stop(): no more waiting out an exhaustion
        self._exhausted_logged = False
        self._reserve_fd: int | None = None  # (a bind that fails calls server_close in __init__)
        super().__init__(*args, **kwargs)
        self._reserve_fd = take_reserve_fd()

    def get_request(self) -> tuple[Any, Any]:
        try:
            accepted = super().get_request()
        except OSError as exc:
            if exc.errno in FD_EXHAUSTION:
                self._shed_while_exhausted(exc)
            raise  # the caller (socketserver) takes an OSError here for "nothing accepted"
        if self._exhausted_logged:
            self._exhausted_logged = False
            logger.bind(actor="/console").info("console: file descriptors are free again")
        if self._reserve_fd is None:
            self._reserve_fd = take_reserve_fd()
        return accepted

    def _shed_while_exhausted(self, exc: OSError) -> None:
        """``accept`` found no descriptor: refuse the connection waiting with the reserve (``503``),
        or, with none, wait a little instead of spinning (see the class's note)."""
        if not self._exhausted_logged:
            self._exhausted_logged = True
            logger.bind(actor="/console").warning(
                "console out of file descriptors: answering 503 until some close ({})", exc)
        if self._reserve_fd is None:
            self._reserve_fd = take_reserve_fd()
            if self._reserve_fd is None:
                self.backoff_over.wait(EXHAUSTED_BACKOFF_S)
                return
        os.close(self._reserve_fd)
        self._reserve_fd = None
        try:
            request, _address = self.socket.accept()
        except OSError:
            request = None
        if request is not None:
            name = errno.errorcode.get(exc.errno or -1, "EUNKNOWN")
            _refuse_503(request, f"castor's console is out of file descriptors ({name}); retry once some "
                                 "connections have closed\n".encode())
        self._reserve_fd = take_reserve_fd()
        if request is None and self._reserve_fd is None:
            self.backoff_over.wait(EXHAUSTED_BACKOFF_S)

    def handle_error(self, request: Any, client_address: Any) -> None:
        """A connection's handler raised. The standard library prints the traceback on stderr; a
        peer's own doing (a reset, an answer it went away from: ``OSError``) is a debug line here
        instead, since any local user could otherwise write one per connect into castor's log.
        Anything else is castor's bug: one error line with its traceback."""
        exc = sys.exc_info()[1]
        log = logger.bind(actor="/console")
        if isinstance(exc, OSError):
            log.debug("console connection from {} ended: {}", client_address, exc)
        else:
            log.opt(exception=exc).error("console connection from {} failed", client_address)

    def server_close(self) -> None:
        super().server_close()
        if self._reserve_fd is not None:
            os.close(self._reserve_fd)
            self._reserve_fd = None

    def await_request(self, connection: Any) -> None:
        """``connection``'s request line and headers must all arrive within SOCKET_TIMEOUT_S
        (the socket's own timeout is per read: a peer trickling a byte at a time never met it)."""
        with self._awaited_lock:
            self._awaited[connection] = time.monotonic() + SOCKET_TIMEOUT_S

    def _evict_oldest_waiting(self) -> bool:
        """Every slot is taken: shut down the connection that has waited longest without sending
        its request (so a crowd of silent peers cannot keep a token holder out), whose handler
        then ends at once and gives its slot back. False if every connection is mid-request."""
        with self._awaited_lock:
            if not self._awaited:
                return False
            oldest = next(iter(self._awaited))
            del self._awaited[oldest]
        _cut(oldest)
        return True

    def request_arrived(self, connection: Any) -> None:
        with self._awaited_lock:
            self._awaited.pop(connection, None)

    def service_actions(self) -> None:
        """On the accepting thread between two polls (0.2 s): a connection past its request
        deadline is shut down, which ends its handler's read at once."""
        now = time.monotonic()
        with self._awaited_lock:
            late = [connection for connection, deadline in self._awaited.items() if deadline <= now]
            for connection in late:
                del self._awaited[connection]
        for connection in late:
            _cut(connection)

    def process_request(self, request: Any, client_address: Any) -> None:
        if not self.slots.acquire(blocking=False) and not (self._evict_oldest_waiting()
                                                          and self.slots.acquire(timeout=EVICTION_WAIT_S)):
            _refuse_503(request, f"too many connections (at most {MAX_CONNECTIONS})\n".encode())
            return
        try:
            super().process_request(request, client_address)
        except BaseException:
            self.slots.release()
            raise

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self.slots.release()


class _HeadBudget:
    """``readline`` of a request's stream while its headers are read, ``budget`` bytes in all: a
    line past it raises :class:`http.client.LineTooLong`, which the handler answers 431 and closes.

    ``Cookie`` lines are the exception, because any page of the host sets cookies the browser then
    sends here (a browser keeps about 180 of 4 KiB each for a host: 700 KiB in one line): such a line
    is read a piece at a time, up to :data:`MAX_COOKIE_BYTES`, and only the pairs named
    ``cookie_name`` are kept (the console reads no other cookie): the line handed on is those pairs
    alone, charged to ``budget``. So another local user's page cannot lock the user out by filling
    the host's cookies (it was 431 on every page), and the bytes held stay bounded."""

    def __init__(self, stream: Any, budget: int, cookie_name: str = "") -> None:
        self._stream = stream
        self._left = budget
        self._cookie_name = cookie_name.encode()
        self._cookie_left = MAX_COOKIE_BYTES

    def readline(self, limit: int = -1) -> bytes:
        if self._left <= 0:
            raise http.client.LineTooLong("request headers")
        line: bytes = self._stream.readline(self._left + 1 if limit < 0 else min(limit, self._left + 1))
        if line[:7].lower() == b"cookie:":
            line = self._our_cookies(line)
        self._left -= len(line)
        if self._left < 0:
            raise http.client.LineTooLong("request headers")
        return line

    def _our_cookies(self, first: bytes) -> bytes:
        """The ``Cookie`` line that starts with ``first``, read to its end, as the console's pairs only."""
        kept: list[bytes] = []
        pending, skipping = first[7:], False
        self._charge_cookie(len(first))
        while True:
            ended = pending.endswith(b"\n")
            if skipping:  # the rest of a pair too long to be the console's, up to the next ";"
                _rest, sep, pending = pending.partition(b";")
                skipping = not sep
            *pairs, pending = pending.split(b";")
            if ended:
                pairs, pending = [*pairs, pending], b""
            kept += [pair.strip() for pair in pairs if pair.partition(b"=")[0].strip() == self._cookie_name]
            if ended:
                break
            if len(pending) > _LONGEST_OWN_PAIR:
                pending, skipping = b"", True
            more: bytes = self._stream.readline(min(_COOKIE_PIECE, self._cookie_left + 1))
            if not more:
                raise http.client.LineTooLong("request headers")  # the peer stopped mid-line
            self._charge_cookie(len(more))
            pending += more
        return b"Cookie: " + b"; ".join(kept) + b"\r\n"

    def _charge_cookie(self, size: int) -> None:
        self._cookie_left -= size
        if self._cookie_left < 0:
            raise http.client.LineTooLong("request cookies")


class _Server6(_Server):
    address_family = socket.AF_INET6


class _Handler(BaseHTTPRequestHandler):
    server_console: ConsoleServer
    protocol_version = "HTTP/1.1"
    server_version = "castor-console"
    timeout = SOCKET_TIMEOUT_S  # a request that never finishes arriving does not hold a thread

    def version_string(self) -> str:
        """The Server header: castor's console, never the Python it runs on (it answers whoever asks)."""
        return self.server_version

    def handle_one_request(self) -> None:
        server: _Server = self.server  # type: ignore[assignment]
        server.await_request(self.connection)
        try:
            super().handle_one_request()
        finally:
            server.request_arrived(self.connection)

    def parse_request(self) -> bool:
        # The headers are read from a reader that allows MAX_HEAD_BYTES in all: past it, the
        # standard library's own "line too long" answer (431) and close.
        whole = self.rfile
        self.rfile = _HeadBudget(whole, MAX_HEAD_BYTES, self.server_console.cookie_name)  # type: ignore[assignment]  # readline is all parse_headers uses
        try:
            parsed = super().parse_request()  # the request line and every header have arrived
        finally:
            self.rfile = whole
        self.server.request_arrived(self.connection)  # type: ignore[attr-defined]
        return parsed

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the base class's name
        """The access line (``127.0.0.1 "GET /metrics HTTP/1.1" 200 -``), at debug level, with the
        token a request carried in its query replaced: the log is no place for a credential."""
        line = format % args if args else format
        logger.bind(actor="/console").debug("{} {}", self.address_string(), without_token(line))

    # -- access ---------------------------------------------------------------------
    def _authorised(self, query: dict[str, list[str]]) -> tuple[bool, bool]:
        """(allowed, set the cookie)."""
        token = self.server_console.token
        if token is None:
            return True, False
        values = query.get("token")
        given = values[0] if values else None
        if given is not None and hmac.compare_digest(given.encode(), token.encode()):
            return True, True
        auth = self.headers.get("Authorization", "")
        if auth.startswith("Bearer ") and hmac.compare_digest(auth[7:].strip().encode(), token.encode()):
            return True, False
        secret = self.server_console.cookie_secret.encode()
        if any(hmac.compare_digest(value.encode(), secret)
               for value in cookie_values(self.headers.get_all("Cookie") or [], self.server_console.cookie_name)):
            return True, False
        return False, False

    def do_HEAD(self) -> None:  # noqa: N802 - http.server's name
        """What GET would answer (status, headers, the same refusals), without its body: ``curl -I``
        and an uptime check's probe. A stream's HEAD holds no slot: its headers, then the end."""
        self.do_GET()

    def send_error(self, code: int, message: str | None = None, explain: str | None = None) -> None:
        """The standard library's own refusals (a method the console does not serve, a malformed
        request line, headers too long) in plain text like the console's, never its HTML page; a
        method it does not serve says which it does (``Allow``)."""
        if code == HTTPStatus.NOT_IMPLEMENTED:
            message = "method not allowed"
        reason = message or self.responses.get(code, ("error",))[0]
        self.log_error("code %d, message %s", code, reason)
        body = (f"{reason}: the console serves GET and HEAD\n" if code == HTTPStatus.NOT_IMPLEMENTED
                else f"{reason}\n").encode("utf-8", "replace")
        self.close_connection = True
        self.send_response(code, reason)
        self.send_header("Connection", "close")
        if code == HTTPStatus.NOT_IMPLEMENTED:
            self.send_header("Allow", "GET, HEAD")
        self.send_header("Content-Type", "text/plain; charset=utf-8")
        self.send_header("X-Content-Type-Options", "nosniff")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def do_GET(self) -> None:  # noqa: N802 - http.server's name
        try:
            self._get()
        except (BrokenPipeError, ConnectionResetError, TimeoutError):
            pass
        except CastorError as exc:  # a bad id, an unknown cast: the stable code, one line
            status = {"not_found": HTTPStatus.NOT_FOUND, "invalid_params": HTTPStatus.BAD_REQUEST,
                      "forbidden": HTTPStatus.FORBIDDEN}.get(exc.code, HTTPStatus.INTERNAL_SERVER_ERROR)
            self._send(status, f"{exc.code}: {exc.message}\n".encode(), "text/plain; charset=utf-8")
        except Exception as exc:  # noqa: BLE001 - one bad request must not end the console
            logger.bind(actor="/console").opt(exception=exc).error("console request {} failed",
                                                                       without_token(self.path)[:200])
            try:
                self._send(HTTPStatus.INTERNAL_SERVER_ERROR, b"internal error\n", "text/plain; charset=utf-8")
            except OSError:
                pass

    def _get(self) -> None:
        # Per request: the handler lives as long as its keep-alive connection, and a refused
        # request must never carry the cookie an earlier request on the connection earned.
        self._cookie = False
        console = self.server_console
        hosts = [h.strip().lower() for h in self.headers.get_all("Host") or []]
        url = urlsplit(self.path)
        # Exactly one Host naming this listener, and no other authority in the request line
        # (absolute form overrides Host): anything else may be read as another host's request.
        if len(hosts) != 1 or hosts[0] not in console.allowed_hosts() or url.scheme or url.netloc:
            self._refuse(HTTPStatus.FORBIDDEN, b"forbidden: unexpected Host header\n")
            return
        if url.path == "/favicon.ico":  # what a browser asks of every host, outside the cookie's path
            self._send(HTTPStatus.NO_CONTENT, b"", "text/plain; charset=utf-8")
            return
        query = parse_qs(url.query)
        allowed, set_cookie = self._authorised(query)
        if not allowed:
            self._refuse(HTTPStatus.UNAUTHORIZED, UNAUTHORISED_TEXT)
            return
        self._cookie = set_cookie
        path = url.path
        if console.base != "/" and path.startswith(console.base):
            path = path[len(console.base) - 1:]  # the route under the console's own path
        elif path.startswith("/c/"):
            self._send(HTTPStatus.NOT_FOUND, b"not found\n", "text/plain; charset=utf-8")
            return
        parts = [p for p in path.split("/") if p]
        probe = "probe" in parse_qs(url.query, keep_blank_values=True)  # a stream's ?probe (see _stream)
        runtime = console.runtime
        if not parts:
            self._send(HTTPStatus.OK, pages.tree_page(console.base).encode(), "text/html; charset=utf-8")
        elif parts == ["events"]:
            self._stream(_tree_events(console), probe=probe)
        elif parts == ["api", "actors"]:
            self._send(HTTPStatus.OK, json.dumps(pages.tree_data(runtime)).encode(), "application/json")
        elif parts == ["metrics"]:
            self._send(HTTPStatus.OK, metrics_text(runtime), METRICS_TYPE)
        elif len(parts) == 3 and parts[0] == "cast":
            sid, cast_id = pages.check_ids(parts[1], parts[2])
            self._send(HTTPStatus.OK, pages.cast_page(runtime, sid, cast_id, console.base).encode(),
                       "text/html; charset=utf-8")
        elif len(parts) == 2 and parts[0] == "casts":
            (sid,) = pages.check_ids(parts[1])
            cursors = query.get("cursor")
            self._send(HTTPStatus.OK, pages.casts_page(runtime, sid, console.base, cursors[0] if cursors else None)
                       .encode(), "text/html; charset=utf-8")
        elif len(parts) == 4 and parts[:2] == ["events", "cast"]:
            sid, cast_id = pages.check_ids(parts[2], parts[3])
            pages.cast_data(runtime, sid, cast_id)  # an unknown cast is a 404 here, as its page is
            self._stream(_cast_events(runtime, sid, cast_id), probe=probe)
        else:
            self._send(HTTPStatus.NOT_FOUND, b"not found\n", "text/plain; charset=utf-8")

    # -- responses ------------------------------------------------------------------
    def _refuse(self, status: int, body: bytes) -> None:
        """Answer a request the console will not serve and end the connection: a peer without the
        token gets one small answer per connection, so requests it sends back to back and never
        reads cannot keep a handler writing (and its slot, which no eviction frees, taken)."""
        self.close_connection = True
        self.send_response(status)
        self.send_header("Connection", "close")
        self._headers_after_status("text/plain; charset=utf-8", len(body))
        self._body(body)

    def _headers(self, status: int, content_type: str, length: int | None) -> None:
        self.send_response(status)
        self._headers_after_status(content_type, length)

    def _headers_after_status(self, content_type: str, length: int | None) -> None:
        self.send_header("Content-Type", content_type)
        self.send_header("Cache-Control", "no-store")
        self.send_header("X-Content-Type-Options", "nosniff")
        self.send_header("Referrer-Policy", "no-referrer")  # no page's address (a token, the base) goes anywhere
        self.send_header("Content-Security-Policy",
                         "default-src 'none'; script-src 'self' 'unsafe-inline'; style-src 'unsafe-inline'; "
                         "connect-src 'self'; img-src 'self' data:")
        if getattr(self, "_cookie", False) and self.server_console.token:
            console = self.server_console
            self.send_header("Set-Cookie", f"{console.cookie_name}={console.cookie_secret}; Path={console.base}; "
                                           "HttpOnly; SameSite=Strict")
        if length is not None:
            self.send_header("Content-Length", str(length))
        self.end_headers()

    def _send(self, status: int, body: bytes, content_type: str) -> None:
        self._headers(status, content_type, len(body))
        self._body(body)

    def _body(self, body: bytes) -> None:
        """The body, unless the request was HEAD (its Content-Length is GET's all the same)."""
        if self.command != "HEAD":
            self.wfile.write(body)

    def _stream(self, produce: Callable[[], str], *, probe: bool = False) -> None:
        """Server-Sent Events: one ``data:`` JSON document (``produce``'s text) every PUSH_INTERVAL_S
        until the client goes, the console stops, or STREAM_MAX_S passed (the browser reconnects).
        A ``probe`` (``?probe``: a page asking why its stream was refused) is answered ``204`` when a
        stream would be served now, and holds no slot: a probe that took one kept the page's own
        stream out until the server noticed the probe gone."""
        console = self.server_console
        self.close_connection = True
        if not console.streams.acquire(blocking=False):
            self._send(HTTPStatus.SERVICE_UNAVAILABLE, f"too many live streams (at most {MAX_STREAMS})\n".encode(),
                       "text/plain; charset=utf-8")
            return
        if probe:
            console.streams.release()
            self._send(HTTPStatus.NO_CONTENT, b"", "text/plain; charset=utf-8")
            return
        if self.command == "HEAD":  # the stream's headers, and no stream
            console.streams.release()
            self._headers(HTTPStatus.OK, "text/event-stream; charset=utf-8", None)
            return
        try:
            self._stream_until_done(produce)
        finally:
            console.streams.release()

    def _stream_until_done(self, produce: Callable[[], str]) -> None:
        console = self.server_console
        self._headers(HTTPStatus.OK, "text/event-stream; charset=utf-8", None)
        self.wfile.write(b"retry: 500\n\n")
        ends = time.monotonic() + STREAM_MAX_S
        while not console.stopping.is_set() and time.monotonic() < ends:
            try:
                payload = produce()
            except Exception as exc:  # noqa: BLE001 - say what went wrong, keep streaming
                payload = json.dumps({"error": f"{type(exc).__name__}: {getattr(exc, 'message', exc)}"})
            self.wfile.write(f"data: {payload}\n\n".encode())
            self.wfile.flush()
            console.stopping.wait(PUSH_INTERVAL_S)

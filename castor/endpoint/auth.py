"""Who may talk to an endpoint: the token, the hello gate and the trust grant.

* **The token.** ``castor serve --tcp`` always requires one; ``--socket`` requires one with
  ``--require-token``; stdio never does (its peer is the parent process that started castor).
  A token is either generated per serve (:func:`new_token_file`: 256 random bits, written to a
  fresh ``0600`` file in a ``0700`` runtime directory owned by castor's user, removed at
  shutdown) or read from an existing file (:func:`read_token_file`: a regular file owned by
  castor's user and readable by nobody else, symlinks refused).
* **The gate.** Until a connection presents the token in ``runtime.hello {token}`` every
  method is refused with ``unauthenticated`` (:class:`AuthGate`); a notification is dropped.
  A wrong or missing token is ``unauthenticated`` too, and after :data:`MAX_AUTH_FAILURES` of
  them the connection is closed after the answer. Tokens are compared with
  :func:`hmac.compare_digest`. Once authenticated the connection dispatches straight to the
  real registry (the gate costs nothing afterwards).
* **The trust grant.** ``session.open {trusted: true}`` lets a project's own settings and
  utility commands run. Only a connection that ``may_trust`` may assert it: stdio, a Unix
  socket peer running as castor's user (or root; checked with ``SO_PEERCRED``), and any
  connection that presented the token. Every other ``trusted: true`` is ``forbidden``.
"""

from __future__ import annotations

import contextlib
import errno
import hmac
import os
import secrets
import stat
import threading
from typing import TYPE_CHECKING, Any

from castor._log import logger
from castor.adapters.fs import is_storage_fault
from castor.endpoint.connection import WarningGate
from castor.endpoint.dispatch import AUTHENTICATED_WITH
from castor.messages.errors import CastorError, Forbidden, InvalidConfig, Unauthenticated
from castor.shown import clipped

if TYPE_CHECKING:
    from castor.endpoint.dispatch import Context, Dispatcher

TOKEN_FILE_ENV = "CASTOR_TOKEN_FILE"
"""A token file path for ``castor serve`` (instead of generating one) and for clients."""

MAX_AUTH_FAILURES = 3
"""Wrong or missing tokens in ``runtime.hello`` before the connection is closed."""

MIN_TOKEN_CHARS = 16
MAX_TOKEN_BYTES = 4096
MAY_TRUST = "may_trust"
"""``Connection.state`` key: this peer may assert ``trusted: true`` in ``session.open``."""
CLOSE_AFTER_REPLY = "_close_after_reply"
"""``Connection.state`` key: close the connection (this reason) once the current error reply is sent."""


_log = logger.bind(actor="/endpoint")


class AuthGate:
    """The dispatcher of a connection that has not authenticated yet (see the module doc)."""

    def __init__(self, real: Dispatcher, token: str) -> None:
        self.real = real
        self._token = token.encode("utf-8")
        self.failures = 0
        self.authenticated = False

    def methods(self) -> list[str]:
        return self.real.methods()

    def has(self, name: str) -> bool:
        return self.real.has(name)

    def dispatch(self, method: str, params: dict[str, Any], ctx: Context) -> Any:
        if self.authenticated:  # a request admitted before the switch
            return self.real.dispatch(method, params, ctx)
        if method != "runtime.hello":
            # The method is echoed cut short: a peer without the token gets no answer larger than its ask.
            raise Unauthenticated(f"{clipped(method, 64)} refused: present the endpoint's token in runtime.hello first",
                                  data={"method": clipped(method, 64)})
        offered = params.get("token") if isinstance(params, dict) else None
        if not isinstance(offered, str) or not hmac.compare_digest(offered.encode("utf-8", "replace"), self._token):
            self.failures += 1
            closing = self.failures >= MAX_AUTH_FAILURES
            if closing:
                ctx.state[CLOSE_AFTER_REPLY] = "unauthenticated: too many wrong tokens"
            _say_a_refused_token(ctx)
            raise Unauthenticated("runtime.hello refused: missing or wrong token" if offered is not None or closing
                                  else "runtime.hello refused: this endpoint requires a token (params.token)",
                                  data={"attempts_left": max(0, MAX_AUTH_FAILURES - self.failures)})
        result = self.real.dispatch(method, params, ctx)
        self.authenticated = True
        ctx.state[MAY_TRUST] = True
        ctx.state[AUTHENTICATED_WITH] = self._token
        ctx.connection.dispatcher = self.real
        ctx.connection.limit_frames(None)  # the protocol's own frame limits from now on
        ctx.connection.limit_outbound(None)
        ctx.connection.quiet_peer_faults(False)
        return result


#: The warnings about refused tokens, process-wide: one, then at most one every 10 s counting the
#: rest (each a debug line), however many connections a peer opens to guess with.
_REFUSED_TOKENS = WarningGate()


class _RefusedHellos:
    """How many ``runtime.hello`` calls this process refused for a missing or wrong token (every
    endpoint, since it started): ``/metrics``' ``castor_hello_refusals_total``, so an alert can fire
    on guessing that the log, gated to one line every 10 s, shows only as a count."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.count = 0

    def add(self) -> None:
        with self._lock:
            self.count += 1


REFUSED_HELLOS = _RefusedHellos()


def _say_a_refused_token(ctx: Context) -> None:
    """Tell the operator, at the default log level, that a peer offered ``runtime.hello`` a wrong
    (or no) token, naming the peer: its address and the uid running it (``/proc/net/tcp``, or
    ``SO_PEERCRED`` on a Unix socket). Connections closed for it are INFO lines, so guessing left
    no trace; the gate keeps a peer that guesses in a loop from filling the log."""
    REFUSED_HELLOS.add()
    warn, quiet = _REFUSED_TOKENS.passes()
    peer = peer_named(ctx)
    if warn:
        _log.warning("runtime.hello refused: missing or wrong token from {peer}{more}", peer=peer,
                     more=f" ({quiet} more refused since the last such line)" if quiet else "")
    else:
        _log.debug("runtime.hello refused: missing or wrong token from {peer}", peer=peer)


def peer_named(ctx: Context) -> str:
    """The peer of ``ctx``'s connection in words: ``tcp peer 127.0.0.1:54321 (uid 1001)``, ``unix
    peer (uid 1001, pid 4242)``, or ``a pipe peer`` (stdio); the uid is left out where the system
    does not tell it. Reads a duplicate of the connection's descriptor, never the connection."""
    import socket

    from castor.endpoint.listeners import peer_credentials, tcp_peer_uid

    fd = getattr(getattr(ctx.connection, "transport", None), "read_fd", None)
    if not isinstance(fd, int) or fd < 0:
        return "a pipe peer"
    try:
        with socket.socket(fileno=os.dup(fd)) as sock:
            if sock.family == socket.AF_UNIX:
                creds = peer_credentials(sock)
                return "unix peer" + (f" (uid {creds[1]}, pid {creds[0]})" if creds else "")
            if sock.family not in (socket.AF_INET, socket.AF_INET6):
                return "a pipe peer"
            host, port = sock.getpeername()[:2]
            uid = tcp_peer_uid(sock)
    except OSError:
        return "a peer already gone"
    shown = f"[{host}]:{port}" if ":" in str(host) else f"{host}:{port}"
    return f"tcp peer {shown}" + (f" (uid {uid})" if uid is not None else "")


def check_trusted_assertion(trusted: bool, ctx: Context) -> None:
    """``forbidden`` when this connection may not assert ``trusted: true``."""
    if trusted and not ctx.state.get(MAY_TRUST):
        raise Forbidden("this connection may not open a trusted session (present the endpoint's token, or "
                        "connect over stdio or a Unix socket as castor's own user)",
                        data={"reason": "trust_not_allowed"})


# --------------------------------------------------------------------------- token files


def runtime_dir(env: dict[str, str] | None = None) -> str:
    """castor's private runtime directory: ``$XDG_RUNTIME_DIR/castor`` if that is set, absolute and
    an existing directory, else ``~/.castor/run``. Created ``0700``; refused (``forbidden``) if it is a symlink, not a
    directory, owned by another user or reachable by group/others -- and so is one under a directory
    another user owns or may write to (``$XDG_RUNTIME_DIR`` or ``~`` and every directory above it, as
    ``listeners.check_dir_chain`` says): ``XDG_RUNTIME_DIR`` kept from another user's login (``su``)
    named their ``/run/user/UID``, where they could swap castor's directory for a link between its
    check and the token file's creation, or for one of their own."""
    from castor.endpoint.listeners import check_dir_chain

    env = dict(os.environ if env is None else env)
    xdg = env.get("XDG_RUNTIME_DIR") or ""
    if xdg and os.path.isabs(xdg) and os.path.isdir(xdg):
        check_dir_chain(xdg, what="the runtime directory's parent (XDG_RUNTIME_DIR)", reason="not_a_private_directory",
                        harm="another user could swap castor's runtime directory; refusing to keep tokens there")
        directory = os.path.join(xdg, "castor")
        _private_dir(directory)
        return directory
    home = os.path.expanduser("~")
    if os.path.isdir(home):  # (a missing one fails the mkdir below, named)
        check_dir_chain(home, what="the runtime directory's parent (your home)", reason="not_a_private_directory",
                        harm="another user could swap castor's runtime directory; refusing to keep tokens there")
    top = os.path.join(home, ".castor")
    _private_dir(top)
    directory = os.path.join(top, "run")
    _private_dir(directory)
    return directory


def _private_dir(path: str) -> None:
    try:
        os.mkdir(path, 0o700)
    except FileExistsError:
        pass
    except OSError as exc:
        if is_storage_fault(exc):  # full, read-only, failing: the disk's, like the token file's own write
            raise
        raise InvalidConfig(f"cannot create the runtime directory {path}: {exc.strerror}",
                            data={"path": path}) from None
    st = os.lstat(path)
    if stat.S_ISLNK(st.st_mode) or not stat.S_ISDIR(st.st_mode):
        raise Forbidden(f"runtime directory {path} is a symlink or not a directory; refusing it",
                        data={"path": path, "reason": "not_a_private_directory"})
    if st.st_uid != os.geteuid():
        raise Forbidden(f"runtime directory {path} belongs to another user; refusing it",
                        data={"path": path, "reason": "not_a_private_directory"})
    if st.st_mode & 0o077:
        os.chmod(path, 0o700)


def new_token_file(directory: str | None = None, *, label: str = "serve") -> tuple[str, str]:
    """Generate a token and write it to a new ``0600`` file; return ``(token, path)``."""
    directory = directory or runtime_dir()
    _remove_stale(directory, label)
    token = secrets.token_urlsafe(32)
    path = os.path.join(directory, f"{label}-{os.getpid()}-{secrets.token_hex(4)}.token")
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        os.fchmod(fd, 0o600)
        data = (token + "\n").encode("ascii")
        if os.write(fd, data) != len(data):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))  # a short write: the disk is full
        os.fsync(fd)
    except OSError as exc:
        # A full disk (or a failing one): no half-made token file is left, and the error names it
        # (a write's error carries no file name).
        with contextlib.suppress(OSError):
            os.unlink(path)
        if exc.filename is None:
            exc.filename = path
        raise
    finally:
        os.close(fd)
    return token, path


def _remove_stale(directory: str, label: str) -> None:
    """Token files of serves that died without removing theirs (``kill -9``): their pid is gone."""
    try:
        names = os.listdir(directory)
    except OSError:
        return
    for name in names:
        parts = name.split("-")
        if len(parts) != 3 or parts[0] != label or not name.endswith(".token") \
                or not (parts[1].isascii() and parts[1].isdigit()):
            continue
        pid = int(parts[1])
        if pid == os.getpid():
            continue
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            remove_token_file(os.path.join(directory, name))
        except OSError:
            pass  # alive (another user's pid would be EPERM): keep it


def read_private_text(path: str, *, what: str = "token file",
                      missing: type[CastorError] = InvalidConfig, malformed: type[CastorError] = InvalidConfig) -> str:
    """The UTF-8 text of ``path`` (at most :data:`MAX_TOKEN_BYTES` + 1 bytes read), when it is a
    secret no one else could have read or planted: a regular file owned by castor's user, not
    readable by group or others, not a symlink (opened without following one, and without
    blocking on a FIFO). ``missing`` when it does not exist, ``malformed`` when it is not UTF-8,
    ``forbidden`` for anything unsafe; each names the path, never the content."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError:
        raise missing(f"{what} {path} does not exist", data={"path": path}) from None
    except OSError as exc:
        reason = "is a symlink" if os.path.islink(path) else exc.strerror
        raise Forbidden(f"cannot use {what} {path}: {reason}", data={"path": path}) from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise Forbidden(f"{what} {path} is not a regular file", data={"path": path})
        if st.st_uid != os.geteuid():
            raise Forbidden(f"{what} {path} belongs to another user", data={"path": path})
        if st.st_mode & 0o077:
            raise Forbidden(f"{what} {path} is readable by group or others (chmod 600 it)",
                            data={"path": path, "mode": oct(st.st_mode & 0o777)})
        raw = os.read(fd, MAX_TOKEN_BYTES + 1)
    finally:
        os.close(fd)
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        raise malformed(f"{what} {path} is not UTF-8 text", data={"path": path}) from None


def read_token_file(path: str) -> str:
    """The token in ``path`` (:func:`read_private_text`'s checks): one token of
    :data:`MIN_TOKEN_CHARS` to :data:`MAX_TOKEN_BYTES` characters without spaces, else
    ``invalid_config`` with the path (never the content)."""
    text = read_private_text(path)
    token = text.strip()
    if len(text.encode("utf-8")) > MAX_TOKEN_BYTES or len(token) < MIN_TOKEN_CHARS or any(ch.isspace() for ch in token):
        raise InvalidConfig(f"token file {path} must hold one token of {MIN_TOKEN_CHARS} to {MAX_TOKEN_BYTES} "
                            "characters without spaces", data={"path": path})
    return token


def remove_token_file(path: str) -> None:
    try:
        os.unlink(path)
    except OSError:
        pass

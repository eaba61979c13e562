"""Listening sockets: a private Unix socket and a loopback-only TCP socket.

* :func:`bind_unix` creates the socket file with mode 0600 *before* anyone
  can reach it (bound inside a fresh 0700 directory, chmod-ed and listening,
  then renamed into place: a client that sees the file can connect). An
  existing path is replaced only if it is a socket nobody is listening on
  (stale); a live socket or any other file is refused.
* The socket's directory must be owned by castor's user (or root) and not writable
  by group or others unless sticky (``/tmp``): otherwise another user could swap
  the socket for their own (``forbidden``).
* :func:`bind_tcp` refuses every host that is not loopback: the token that guards
  a TCP endpoint (:mod:`castor.endpoint.auth`) travels in clear text, so the
  endpoint must never be reachable from another machine.
"""

from __future__ import annotations

import errno
import ipaddress
import os
import socket
import stat
import struct
import tempfile
import time
from typing import Any

from castor.adapters.fs import storage_unavailable
from castor.messages.errors import CastorError, Conflict, Forbidden, InvalidConfig

_SUN_PATH_MAX = 107


def bind_unix(path: str, backlog: int = 128) -> tuple[socket.socket, int]:
    """Listen on ``path``; return the socket and the inode of its file (for safe unlink)."""
    path = os.path.abspath(path)
    if len(os.fsencode(path)) > _SUN_PATH_MAX:
        raise InvalidConfig(f"unix socket path is longer than {_SUN_PATH_MAX} bytes: {path}")
    parent = os.path.dirname(path)
    check_socket_dir(parent)
    check_socket_path(path)
    _clear_stale(path)
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        try:
            tmpdir = tempfile.mkdtemp(prefix=".cs", dir=parent)  # 0700: unreachable until renamed
        except OSError as exc:  # a read-only or full directory: name the socket, not the scaffolding
            exc.filename = path
            raise
        tmp = os.path.join(tmpdir, "s")
        try:
            if len(os.fsencode(tmp)) <= _SUN_PATH_MAX:
                sock.bind(tmp)
                os.chmod(tmp, 0o600)
                sock.listen(backlog)  # before the file appears: a client that sees it can connect
                os.replace(tmp, path)
            else:
                _bind_with_umask(sock, path)
                sock.listen(backlog)
        finally:
            _rmdir_quietly(tmpdir)
    except BaseException:
        sock.close()
        raise
    return sock, os.lstat(path).st_ino


def check_socket_dir(parent: str) -> None:
    """The socket's directory must not let another user swap the socket for theirs: it and every
    directory above it (as written, links included, and as resolved) owned by castor's user or
    root, and not writable by others unless sticky (like ``/tmp``). One unsafe ancestor is enough
    to swap the socket: whoever may rename an ancestor can put a directory of theirs, with their
    own listener, in its place -- and a client would hand that listener its token."""
    try:
        os.stat(parent)
    except FileNotFoundError:
        raise InvalidConfig(f"the socket's directory {parent} does not exist", data={"path": parent}) from None
    check_dir_chain(parent, what="the socket's directory", reason="socket_dir_not_private",
                    harm="another user could replace the socket; refusing to listen there")


def check_dir_chain(directory: str, *, what: str, reason: str, harm: str) -> None:
    """``directory`` and every directory above it (as written, links included, and as resolved)
    are castor's user's or root's, and not writable by others unless sticky (like ``/tmp``):
    else ``forbidden`` naming ``what`` (``data.reason``: ``reason``; ``harm`` says what another
    user could do). Whoever may rename one of them can put a tree of their own in its place."""
    written = os.path.abspath(directory)
    for path in (*_ancestors(written), *_ancestors(os.path.realpath(written))):
        _check_one_dir(path, directory, what=what, reason=reason, harm=harm)


def check_socket_path(path: str) -> None:
    """A file already at the socket's path that another user owns is theirs to remove, never
    castor's to probe or replace (``conflict``, naming whose it is): in a shared sticky directory
    (``/tmp``) anyone may take a path first, and a root castor would otherwise replace their stale
    socket without a word."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return
    if st.st_uid != os.geteuid():
        raise Conflict(f"{path} already exists and belongs to another user (uid {st.st_uid}); castor will not use "
                       "or replace it: choose another socket path", data={"path": path, "uid": st.st_uid,
                                                                          "reason": "socket_path_taken"})


def _ancestors(path: str) -> list[str]:
    """``path`` and every directory above it, up to ``/``."""
    out = [path]
    while (up := os.path.dirname(out[-1])) != out[-1]:
        out.append(up)
    return out


def _check_one_dir(path: str, directory: str, *, what: str, reason: str, harm: str) -> None:
    st = os.lstat(path)  # a link is judged by its owner (who could point it elsewhere)
    where = directory if path == directory else f"{directory} (its ancestor {path})"
    if st.st_uid not in (os.geteuid(), 0):
        raise Forbidden(f"{what} {where} belongs to another user (uid {st.st_uid}); {harm}",
                        data={"path": path, "reason": reason})
    if (stat.S_ISDIR(st.st_mode) and st.st_mode & (stat.S_IWGRP | stat.S_IWOTH)
            and not st.st_mode & stat.S_ISVTX):
        raise Forbidden(f"{what} {where} is writable by other users (and not sticky); {harm}",
                        data={"path": path, "reason": reason})


def _bind_with_umask(sock: socket.socket, path: str) -> None:
    # Fallback when the temp path would be too long: umask is process-wide, so keep it brief.
    old = os.umask(0o177)
    try:
        sock.bind(path)
    finally:
        os.umask(old)


def _rmdir_quietly(path: str) -> None:
    try:
        for name in os.listdir(path):
            os.unlink(os.path.join(path, name))
        os.rmdir(path)
    except OSError:
        pass


def _clear_stale(path: str) -> None:
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return
    if not stat.S_ISSOCK(st.st_mode):
        raise Conflict(f"{path} exists and is not a socket; refusing to replace it")
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    probe.settimeout(1.0)
    try:
        probe.connect(path)
    except OSError as exc:
        if exc.errno in (errno.ECONNREFUSED, errno.ENOENT):
            try:
                os.unlink(path)  # stale: its server is gone
            except FileNotFoundError:
                pass
            return
        raise Conflict(f"cannot probe existing socket {path}: {exc}") from exc
    finally:
        probe.close()
    raise Conflict(f"another server is already listening on {path}")


def unlink_if_ours(path: str, inode: int) -> None:
    """Remove the socket file only if it is still the one we created: the inode castor's own
    socket had, and a socket of castor's user. The inode alone is not enough: once castor's file
    is gone (removed by hand, by a ``/tmp`` cleaner) its number is free, and another user's socket
    bound at the same path since may get it -- castor must never unlink another user's live socket."""
    try:
        st = os.lstat(path)
        if st.st_ino == inode and stat.S_ISSOCK(st.st_mode) and st.st_uid == os.geteuid():
            os.unlink(path)
    except OSError:
        pass


def peer_is_us(sock: socket.socket) -> bool:
    """A Unix socket peer runs as castor's user or as root (``SO_PEERCRED``; ``True`` where the
    platform cannot tell). Both ends use it: the server for who may connect, a client for who
    may hear its token."""
    if getattr(socket, "SO_PEERCRED", None) is None:  # pragma: no cover - not Linux
        return True
    creds = peer_credentials(sock)
    return creds is not None and creds[1] in (os.geteuid(), 0)


def peer_credentials(sock: socket.socket) -> tuple[int, int] | None:
    """``(pid, uid)`` of a Unix socket's peer (``SO_PEERCRED``), or None where it cannot be read."""
    peercred = getattr(socket, "SO_PEERCRED", None)
    if peercred is None:  # pragma: no cover - not Linux
        return None
    try:
        pid, uid, _gid = struct.unpack("3i", sock.getsockopt(socket.SOL_SOCKET, peercred, struct.calcsize("3i")))
    except OSError:
        return None
    return pid, uid


def tcp_peer_uid(sock: socket.socket) -> int | None:
    """The uid running the other end of a loopback TCP connection (its row in ``/proc/net/tcp``),
    or None where the table does not tell (not Linux, the peer gone)."""
    try:
        ours, theirs = _tcp_endpoint(sock.getsockname()), _tcp_endpoint(sock.getpeername())
    except (OSError, ValueError):
        return None
    return _tcp_owner(theirs, ours)


_PROC_NET_TCP = ("/proc/net/tcp", "/proc/net/tcp6")


def tcp_peer_is_us(sock: socket.socket, *, settle_s: float = 0.2) -> bool:
    """The listener at the other end of a loopback TCP connection runs as castor's user or as
    root -- what :func:`peer_is_us` tells for a Unix socket, which TCP has no ``SO_PEERCRED``
    for. Linux lists every TCP socket of this network namespace with its owner's uid in
    ``/proc/net/tcp``/``tcp6`` (readable by everyone); the other end is the row whose local
    address is our peer and whose remote address is us. ``True`` where the platform has no such
    table (the token then goes unchecked, as before); ``False`` when the table has no such row
    (the listener went away: nobody to send a token to). ``settle_s`` bounds the wait for the
    row of a connection the listener's kernel side has not finished setting up."""
    try:
        ours, theirs = _tcp_endpoint(sock.getsockname()), _tcp_endpoint(sock.getpeername())
    except OSError:
        return False
    deadline = time.monotonic() + settle_s
    while True:
        uid = _tcp_owner(theirs, ours)
        if uid is not None:
            return uid in (os.geteuid(), 0)
        if not any(os.path.exists(name) for name in _PROC_NET_TCP):  # pragma: no cover - not Linux
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.005)


def _tcp_endpoint(address: tuple[Any, ...]) -> tuple[ipaddress.IPv4Address | ipaddress.IPv6Address, int]:
    ip = ipaddress.ip_address(str(address[0]).split("%", 1)[0])
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    return ip, int(address[1])


def _tcp_owner(local: tuple[Any, int], remote: tuple[Any, int]) -> int | None:
    """The uid of the row ``local`` -> ``remote`` in ``/proc/net/tcp``/``tcp6``, or None."""
    for name in _PROC_NET_TCP:
        try:
            with open(name, encoding="ascii", errors="replace") as table:
                next(table, None)  # the header
                for line in table:
                    fields = line.split()
                    if len(fields) < 8:
                        continue
                    try:
                        if _proc_endpoint(fields[1]) == local and _proc_endpoint(fields[2]) == remote:
                            return int(fields[7])
                    except ValueError:
                        continue
        except OSError:
            continue
    return None


def _proc_endpoint(field: str) -> tuple[ipaddress.IPv4Address | ipaddress.IPv6Address, int]:
    """``0100007F:1E61`` (``/proc/net/tcp``: the address as 32-bit words in host byte order)."""
    hex_ip, hex_port = field.split(":")
    raw = b"".join(struct.pack("=I", int(hex_ip[i:i + 8], 16)) for i in range(0, len(hex_ip), 8))
    ip = ipaddress.ip_address(raw)
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    return ip, int(hex_port, 16)


def is_loopback_host(host: str) -> bool:
    """127.0.0.0/8, ``::1`` or ``localhost`` (a host name, so in any case: ``LOCALHOST`` too)."""
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def bind_tcp(host: str, port: int, backlog: int = 128) -> socket.socket:
    """Listen on a loopback address (``port`` 0 picks a free one)."""
    if not is_loopback_host(host):
        raise Forbidden(
            f"refusing to listen on non-loopback host {host!r}: the castor endpoint serves "
            "this machine only; use 127.0.0.1, ::1 or localhost",
            data={"host": host})
    if host.lower() == "localhost":
        host = "127.0.0.1"
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        sock.listen(backlog)
    except OSError as exc:
        sock.close()
        raise address_refused("the castor endpoint", host, port, exc) from None
    except BaseException:
        sock.close()
        raise
    return sock


def address_refused(what: str, host: str, port: int, exc: OSError) -> CastorError:
    """The error of a TCP listen that failed: an address another process holds is a ``conflict``
    naming it (it read ``storage_unavailable: Address already in use``, naming neither the
    listener nor the address); any other failure is ``adapters.fs.storage_unavailable``'s error,
    with the address in its data."""
    shown = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    if exc.errno == errno.EADDRINUSE:
        return Conflict(f"{what} cannot listen on {shown}: another process holds that address (choose another "
                        "port, or 0 for a free one)", data={"address": shown, "errno": "EADDRINUSE"})
    refused = storage_unavailable(exc, action=f"listen on {shown} for {what}")
    refused.data["address"] = shown
    return refused

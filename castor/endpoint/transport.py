"""Byte transports under a :class:`~castor.endpoint.connection.Connection`.

A transport moves bytes and nothing else. Guarantees:

* ``recv`` blocks until some bytes arrive and returns ``b""`` on end of
  stream *or* after :meth:`close` (from any thread) — a reader is never left
  blocked on a closed transport.
* ``send_nowait`` never blocks: it writes what the kernel accepts now and
  returns the byte count (0 if it would block). Transports that cannot do
  this return ``None`` and the connection always uses its writer thread.
* ``sendall`` blocks until everything is written, or raises ``OSError``
  once the transport is closed (so a writer stuck on a dead peer is freed
  by :meth:`close`).
"""

from __future__ import annotations

import errno
import os
import select
import socket
import threading

RECV_CHUNK = 256 * 1024


class SocketTransport:
    """A connected stream socket (Unix or TCP)."""

    def __init__(self, sock: socket.socket) -> None:
        sock.setblocking(True)
        if sock.family in (socket.AF_INET, socket.AF_INET6):
            # Small request/response frames: never wait for Nagle.
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self._sock = sock
        self._closed = False
        self._close_lock = threading.Lock()
        try:
            self.peer = str(sock.getpeername()) or "unix-peer"
        except OSError:
            self.peer = "unknown"

    def recv(self) -> bytes:
        try:
            return self._sock.recv(RECV_CHUNK)
        except OSError:
            return b""

    def send_nowait(self, data: memoryview | bytes) -> int | None:
        try:
            return self._sock.send(data, socket.MSG_DONTWAIT)
        except (BlockingIOError, InterruptedError):
            return 0

    def sendall(self, data: memoryview | bytes) -> None:
        self._sock.sendall(data)

    def close(self) -> None:
        with self._close_lock:
            if self._closed:
                return
            self._closed = True
        try:
            # shutdown wakes a thread blocked in recv/send; close alone does not.
            self._sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self._sock.close()


class PipeTransport:
    """A pair of pipe file descriptors (stdio of a server or of a spawned child).

    Reading polls the read fd together with a private wake-up pipe, because
    closing an fd does not wake a thread blocked in ``os.read`` on Linux.
    """

    def __init__(self, read_fd: int, write_fd: int, *, owns_fds: bool = True, peer: str = "pipe") -> None:
        self._rfd = read_fd
        self._wfd = write_fd
        self._owns = owns_fds
        self._wake_r, self._wake_w = os.pipe()
        self._closed = False
        self._close_lock = threading.Lock()
        self._poll = select.poll()
        self._poll.register(read_fd, select.POLLIN | select.POLLHUP | select.POLLERR)
        self._poll.register(self._wake_r, select.POLLIN)
        self.peer = peer

    def recv(self) -> bytes:
        """Only the connection's reader calls this; it also closes the read fd once closed."""
        while not self._closed:
            try:
                events = self._poll.poll()
            except InterruptedError:
                continue
            if self._closed or any(fd == self._wake_r for fd, _ in events):
                break
            try:
                return os.read(self._rfd, RECV_CHUNK)
            except InterruptedError:
                continue
            except OSError:
                return b""
        self._close_read_fd()
        return b""

    def _close_read_fd(self) -> None:
        # Closed by the reading side only, so no other thread can be polling a reused fd number.
        if self._owns and self._rfd >= 0:
            try:
                os.close(self._rfd)
            except OSError:
                pass
            self._rfd = -1

    def send_nowait(self, data: memoryview | bytes) -> int | None:
        return None  # O_NONBLOCK on a shared stdio description would leak to other processes

    def sendall(self, data: memoryview | bytes) -> None:
        view = memoryview(data)
        while view:
            if self._closed:
                raise OSError(errno.EPIPE, "transport closed")
            written = os.write(self._wfd, view)
            view = view[written:]

    def close(self) -> None:
        with self._close_lock:
            if self._closed:
                return
            self._closed = True
        try:
            os.write(self._wake_w, b"x")
        except OSError:
            pass
        if self._owns:
            # Closing the write end is what tells the peer "end of stream".
            try:
                os.close(self._wfd)
            except OSError:
                pass
        # The read fd is closed by the reader (see recv); the wake pipe at garbage collection.

    def __del__(self) -> None:  # pragma: no cover - best effort fd hygiene
        self._close_read_fd()
        for fd in (self._wake_r, self._wake_w):
            try:
                os.close(fd)
            except OSError:
                pass


Transport = SocketTransport | PipeTransport

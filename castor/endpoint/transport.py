"""Byte transports under a :class:`~castor.endpoint.connection.Connection`.

A transport moves bytes and nothing else; the connection does the waiting
(it polls ``read_fd`` together with its own wake-up pipe, so a reader is
never left blocked on a closed transport). Guarantees:

* ``read_available`` is called only after ``read_fd`` polled readable; it
  returns the bytes available, or ``b""`` on end of stream or error.
* ``send_nowait`` never blocks: it writes what the kernel accepts now and
  returns the byte count (0 if it would block). Transports that cannot do
  this return ``None`` and the connection always uses its writer thread.
* ``sendall`` blocks until everything is written, or raises ``OSError``
  (a socket writer stuck on a dead peer is freed by :meth:`close`; a pipe
  writer only when the peer reads or exits — see docs/protocol.md).
* ``close`` is idempotent and callable from any thread. A pipe's fds are
  never closed under a read or write in progress (their numbers would be
  reused at once by the next pipe the process opens).
"""

from __future__ import annotations

import errno
import os
import socket
import struct
import threading
from collections.abc import Callable
from typing import Any


def raised_by_the_os(exc: OSError) -> bool:
    """Whether ``exc`` came from a system call (it has an ``errno``), not from a signal handler
    that raised an ``OSError`` subclass into the call -- an alarm's ``TimeoutError``. Only the
    first kind is a transport's failure to read or write; the second is the caller's and must
    propagate (see ``Connection.close_interrupted``)."""
    return exc.errno is not None


#: The most one read takes. Each transport reads into one buffer of this size, kept for its life,
#: and returns a copy of what arrived: a per-read ``recv(RECV_CHUNK)`` would allocate and shrink a
#: buffer of this size on every frame, which either costs mmap/mremap/munmap per read (glibc's
#: first mmap threshold is 128 KiB) or, once that threshold has risen, churns big blocks through
#: the malloc arenas of long-lived servers (RSS that grows with the casts served; docs/performance.md,
#: bench/longrun.py). Below the 128 KiB threshold, so the buffer itself never raises it.
RECV_CHUNK = 64 * 1024


class SocketTransport:
    """A connected stream socket (Unix or TCP)."""

    #: ``close()`` wakes a thread blocked in ``read_available`` (via shutdown).
    interruptible = True
    #: Kernel receive timeout (SO_RCVTIMEO) in seconds, if set; see set_recv_timeout.
    recv_timeout: float | None = None

    def __init__(self, sock: socket.socket) -> None:
        sock.setblocking(True)
        sock.settimeout(None)
        if sock.family in (socket.AF_INET, socket.AF_INET6):
            # Small request/response frames: never wait for Nagle.
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self._sock = sock
        self._buffer = memoryview(bytearray(RECV_CHUNK))  # only the connection's reader reads: one at a time
        #: What ``read_available`` reads with, for a connection's hot paths to read in their own frame
        #: (``bytes(recv_buffer[:recv_into(recv_buffer)])``, an ``OSError`` given to :meth:`read_failed`).
        self.recv_buffer = self._buffer
        self.recv_into = sock.recv_into
        #: What ``send_nowait`` writes with (``send_direct(data, MSG_DONTWAIT)``, ``BlockingIOError`` and
        #: ``InterruptedError`` meaning 0), for a connection's hot paths to write in their own frame;
        #: ``None`` once ``send_nowait`` is replaced on this transport (tests make a peer fail so),
        #: and then every write goes through the replacement (see ``__setattr__``).
        self.send_direct: Callable[[memoryview | bytes, int], int] | None = sock.send
        self.read_fd = sock.fileno()
        self._closed = False
        self._close_lock = threading.Lock()
        try:
            self.peer = str(sock.getpeername()) or "unix-peer"
        except OSError:
            self.peer = "unknown"

    def __setattr__(self, name: str, value: Any) -> None:
        if name == "send_nowait":  # replaced: the hot paths' direct write would go around it
            object.__setattr__(self, "send_direct", None)
        object.__setattr__(self, name, value)

    def set_recv_timeout(self, seconds: float) -> None:
        """Make a blocking ``recv`` give up after ``seconds`` (it then returns ``None``).

        Lets a thread wait for its reply in ``recv`` itself — one syscall
        instead of poll + recv — and still notice its deadline.
        """
        usec = int(seconds * 1_000_000)
        self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVTIMEO,
                              struct.pack("ll", usec // 1_000_000, usec % 1_000_000))
        self.recv_timeout = seconds

    def read_available(self) -> bytes | None:
        """Bytes, ``b""`` at end of stream, ``None`` if a receive timeout expired."""
        try:
            return bytes(self._buffer[:self._sock.recv_into(self._buffer)])
        except (BlockingIOError, InterruptedError):
            return None if not self._closed else b""
        except OSError as exc:
            if not raised_by_the_os(exc):
                raise
            return b""

    def read_failed(self, exc: OSError) -> bytes | None:
        """What :meth:`read_available` returns when its ``recv_into`` raised ``exc`` (or raises it)."""
        if isinstance(exc, (BlockingIOError, InterruptedError)):
            return None if not self._closed else b""
        if not raised_by_the_os(exc):
            raise exc
        return b""

    def send_nowait(self, data: memoryview | bytes) -> int | None:
        try:
            return self._sock.send(data, socket.MSG_DONTWAIT)
        except (BlockingIOError, InterruptedError):
            return 0

    def sendall(self, data: memoryview | bytes) -> None:
        self._sock.sendall(data)

    def shutdown_read(self) -> None:
        """Wake a thread blocked in ``recv`` (it gets what is queued, or ``b""``) without losing
        what the peer sent: it stays readable, and ``recv`` never blocks again."""
        try:
            self._sock.shutdown(socket.SHUT_RD)
        except OSError:
            pass

    def close(self) -> None:
        with self._close_lock:
            if self._closed:
                return
            self._closed = True
        try:
            # shutdown wakes a thread blocked in recv/send/poll; close alone does not.
            self._sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self._sock.close()


class PipeTransport:
    """A pair of pipe file descriptors (stdio of a server or of a spawned child).

    ``O_NONBLOCK`` is never set: on inherited stdio it would change the
    file description other processes share.
    """

    #: Closing a pipe does not wake a blocked read: the connection must poll.
    interruptible = False
    #: No direct write: every write is the connection's writer thread's (``send_nowait`` says so).
    send_direct: None = None

    def __init__(self, read_fd: int, write_fd: int, *, owns_fds: bool = True, peer: str = "pipe") -> None:
        self.read_fd = read_fd
        self._buffer = memoryview(bytearray(RECV_CHUNK))  # as SocketTransport's
        self._wfd = write_fd
        self._owns = owns_fds
        self._closed = False
        #: Threads inside a read or a write now. The fds are closed only when this is 0: closed
        #: under a reader that had passed its ``_closed`` check, a number the process reuses at
        #: once (the next ``os.pipe()``) would be read or written by the old transport's thread --
        #: another connection's bytes taken or corrupted. Guarded by ``_close_lock``.
        self._users = 0
        self._close_lock = threading.Lock()
        self.peer = peer

    # The enter step is written out in each method (no helper call, no ``with``): it runs on
    # every frame of a stdio endpoint.
    def _leave(self) -> None:
        lock = self._close_lock
        lock.acquire()
        self._users -= 1
        last = self._closed and not self._users
        lock.release()
        if last:
            self._close_fds()

    def read_available(self) -> bytes:
        lock = self._close_lock
        lock.acquire()
        if self._closed:
            lock.release()
            return b""
        self._users += 1
        lock.release()
        try:
            return bytes(self._buffer[:os.readv(self.read_fd, (self._buffer,))])
        except OSError as exc:
            if not raised_by_the_os(exc):
                raise
            return b""
        finally:
            self._leave()

    def send_nowait(self, data: memoryview | bytes) -> int | None:
        return None

    def sendall(self, data: memoryview | bytes) -> None:
        view = memoryview(data)
        lock = self._close_lock
        while view:
            lock.acquire()
            if self._closed:
                lock.release()
                raise OSError(errno.EPIPE, "transport closed")
            self._users += 1
            lock.release()
            try:
                written = os.write(self._wfd, view)
            finally:
                self._leave()
            view = view[written:]

    def close(self) -> None:
        """Close once; the fds now, or when the last read or write in progress returns (never
        under it: see ``_users``)."""
        with self._close_lock:
            if self._closed:
                return
            self._closed = True
            now = self._users == 0
        if now:
            self._close_fds()

    def _close_fds(self) -> None:
        if self._owns:
            # Closing the write end is what tells the peer "end of stream".
            for fd in (self._wfd, self.read_fd):
                try:
                    os.close(fd)
                except OSError:
                    pass


Transport = SocketTransport | PipeTransport

"""Another local user listening where castor's user expects castor: a root-only test double.

The listener is a real socket of another uid (forked from the root test process, which drops to
that uid before it makes the socket: a socket keeps the uid it was made with, and the kernel's
table shows a connection waiting to be accepted with its listener's). Every byte any peer sends it
is reported on a pipe, so a test can prove what the other user heard -- nothing, or no token.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
from collections.abc import Callable, Iterator
from pathlib import Path

NOBODY = 65534


def _fork_as(uid: int) -> tuple[int, int, int]:
    """Fork with a pipe from the child to the parent: ``(child, read_end, write_end)``. In the child
    (``child == 0``) the read end is closed and the process runs as ``uid`` (group first: a process
    that gave up root can no longer change its group); the parent closes the write end itself."""
    read_end, write_end = os.pipe()
    child = os.fork()
    if child == 0:
        try:
            os.close(read_end)
            os.setgid(uid)
            os.setuid(uid)
        except BaseException:  # noqa: BLE001 - a child that cannot drop to uid must not run as root
            os._exit(1)
    return child, read_end, write_end


@contextlib.contextmanager
def another_user_listening(address: Path | tuple[str, int], *, uid: int = NOBODY) -> Iterator[tuple[int, int]]:
    """Another user (``uid``) listening at ``address``: a Unix socket path (made mode ``0777``)
    or a ``(host, port)`` pair (IPv6 when the host has a colon; port 0 picks a free one).

    Yields ``(port, heard)``: the port bound (0 for a Unix socket) and the read end of the pipe
    that carries every byte peers send. The listener is killed and reaped on exit."""
    child, read_end, write_end = _fork_as(uid)
    if child == 0:
        try:
            if isinstance(address, Path):
                listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
                listener.bind(str(address))
                os.chmod(address, 0o777)
                port = 0
            else:
                family = socket.AF_INET6 if ":" in address[0] else socket.AF_INET
                listener = socket.socket(family, socket.SOCK_STREAM)
                listener.bind(address)
                port = listener.getsockname()[1]
            listener.listen(4)
            os.write(write_end, port.to_bytes(2, "big"))
            _report_what_peers_send(listener, write_end)
        finally:
            os._exit(0)
    os.close(write_end)
    try:
        announced = os.read(read_end, 2)
        assert len(announced) == 2, "the other user's listener did not start"
        yield int.from_bytes(announced, "big"), read_end
    finally:
        os.kill(child, 9)
        os.waitpid(child, 0)
        os.close(read_end)


def _report_what_peers_send(listener: socket.socket, out_fd: int) -> None:
    """The other user's listener: every byte any peer sends goes to ``out_fd``, for ever."""
    while True:
        peer, _ = listener.accept()
        peer.settimeout(3)
        try:
            while chunk := peer.recv(4096):
                os.write(out_fd, chunk)
        except OSError:
            pass
        peer.close()


def heard_up_to_our_end(probe: socket.socket, heard_fd: int) -> bytes:
    """Everything the other user's listener heard, up to an ``END`` sent on ``probe`` (a connection
    of the test's own, made after every connection under test)."""
    probe.sendall(b"END")
    probe.close()
    heard = b""
    while not heard.endswith(b"END"):
        chunk = os.read(heard_fd, 65536)
        assert chunk, "the listener went away"
        heard += chunk
    return heard


def as_another_user(work: Callable[[], bytes], *, uid: int = NOBODY, timeout_s: float = 60.0) -> bytes:
    """What ``work`` returns when run by another user (``uid``): a forked child drops to that uid,
    runs it and hands its bytes back on a pipe (an exception becomes its traceback's last line,
    prefixed ``RAISED:``). Root-only, as the rest of this module."""
    import select
    import traceback

    child, read_end, write_end = _fork_as(uid)
    if child == 0:
        try:
            try:
                out = work()
            except BaseException:  # noqa: BLE001 - reported to the test, which fails on it
                out = b"RAISED: " + traceback.format_exc().strip().splitlines()[-1].encode()
            with os.fdopen(write_end, "wb") as pipe:
                pipe.write(out)
        finally:
            os._exit(0)
    os.close(write_end)
    got = b""
    try:
        while True:
            ready, _, _ = select.select([read_end], [], [], timeout_s)
            assert ready, "the other user's work did not finish"
            chunk = os.read(read_end, 65536)
            if not chunk:
                break
            got += chunk
    finally:
        os.close(read_end)
        os.waitpid(child, 0)
    return got


def files_nobody_reads(root: Path, markers: tuple[str, ...] | None = None) -> list[str]:
    """The files under ``root`` (sorted) that uid nobody can read and that hold one of ``markers``
    (``None``: every file nobody can open)."""
    def work() -> bytes:
        found = []
        for dirpath, _dirnames, filenames in os.walk(root):
            for name in filenames:
                path = os.path.join(dirpath, name)
                try:
                    with open(path, "rb") as handle:
                        data = handle.read() if markers is not None else b""
                except OSError:
                    continue
                if markers is None or any(m.encode() in data for m in markers):
                    found.append(os.path.relpath(path, root))
        return json.dumps(sorted(found)).encode()

    got = as_another_user(work)
    assert not got.startswith(b"RAISED"), got
    return json.loads(got)

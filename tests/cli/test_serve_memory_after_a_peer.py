"""A peer that asks and never reads leaves nothing behind once its connection is gone.

The server queues its answers (up to the outbound bound, 32 MiB) and then closes the connection;
the queue is freed, and the allocator's free pages go back to the kernel like a closed session's.
Before, the server's resident memory stayed ~32 MB higher for good (every such peer could add it).
"""

from __future__ import annotations

import socket
import subprocess
import sys
from pathlib import Path

import msgpack
import psutil
import pytest

from tests.cli.test_serve_and_inspect import _env
from tests.support.processes import killed_on_exit
from tests.support.waiting import wait_for

pytestmark = pytest.mark.timeout(120)


def _resident_mb(pid: int) -> float:
    return float(psutil.Process(pid).memory_info().rss) / 1e6


def test_a_closed_connections_queued_answers_are_given_back_to_the_kernel(tmp_path: Path) -> None:
    sock_path = tmp_path / "castor.sock"
    server = subprocess.Popen([sys.executable, "-m", "castor", "serve", "--socket", str(sock_path)],
                              env=_env(tmp_path), cwd=str(tmp_path),
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    with killed_on_exit(server):
        wait_for(timeout=30.0, predicate=sock_path.exists)
        peer = socket.socket(socket.AF_UNIX)
        peer.connect(str(sock_path))
        peer.sendall(msgpack.packb([0, 1, "runtime.hello", [{}]]))
        unpacker = msgpack.Unpacker()
        while not any(True for _ in unpacker):  # the hello's answer: the server is warm
            unpacker.feed(peer.recv(65536))
        before = _resident_mb(server.pid)
        # Ask for ~3 KB answers and never read them, until the server gives up on this peer.
        request = msgpack.packb([0, 2, "ops.actors", [{}]])
        peer.settimeout(30)
        with pytest.raises((BrokenPipeError, ConnectionResetError)):  # the server closed the connection
            for _ in range(100_000):
                peer.sendall(request)
        peer.close()
        # The trim runs on its own thread, at most once every two seconds: allow it a few.
        wait_for(timeout=20.0, predicate=lambda: _resident_mb(server.pid) < before + 12,
                 what="the server's resident memory back within 12 MB of before the peer", interval=0.2)

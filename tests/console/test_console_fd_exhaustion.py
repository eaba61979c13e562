"""The web console out of file descriptors (``ulimit -n``, a crowd of connections) neither dies nor
spins: each connection it has no descriptor for is answered ``503`` at once (it keeps one descriptor
in reserve to accept and refuse with, as the msgpack endpoint does), and it serves again as soon as
descriptors come back. Before, ``accept`` failing with ``EMFILE`` left the connection queued and the
listener readable: the accepting thread went round its loop at full speed (a CPU) while every new
client waited for an answer that never came."""

from __future__ import annotations

import os
import re
import resource
import socket
import subprocess
import time
from pathlib import Path

import pytest

from tests.console.conftest import CASTOR, serve_env
from tests.support.processes import killed_on_exit
from tests.support.waiting import wait_for

pytestmark = pytest.mark.timeout(90)

NOFILE = 64  # the serve's descriptor limit: its runtime, endpoint and console take some 30 of them


def _low_fd_limit() -> None:  # runs in the child before exec
    resource.setrlimit(resource.RLIMIT_NOFILE, (NOFILE, NOFILE))


def _cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _get(port: int, token: str, timeout: float = 5.0) -> bytes:
    """The first bytes of the answer to ``GET /metrics`` (``b""``: closed unanswered; raises
    ``TimeoutError`` on silence)."""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as sock:
        sock.sendall(f"GET /metrics HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nAuthorization: Bearer {token}\r\n"
                     "Connection: close\r\n\r\n".encode())
        try:
            return sock.recv(4096)
        except ConnectionResetError:
            return b""


def test_the_console_out_of_descriptors_answers_503_does_not_spin_and_recovers(tmp_path: Path) -> None:
    (tmp_path / "home").mkdir()
    proc = subprocess.Popen([*CASTOR, "serve", "--socket", str(tmp_path / "c.sock"), "--console", "127.0.0.1:0"],
                            env=serve_env(tmp_path), cwd=str(tmp_path), stdin=subprocess.DEVNULL,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, preexec_fn=_low_fd_limit)
    with killed_on_exit(proc):
        assert proc.stderr is not None
        line = proc.stderr.readline()
        match = re.search(r"console: http://127\.0\.0\.1:(\d+)/ \(token file: ([^)]+)\)", line)
        assert match, line
        port, token = int(match.group(1)), Path(match.group(2)).read_text().strip()
        assert _get(port, token).startswith(b"HTTP/1.1 200")
        crowd: list[socket.socket] = []
        try:
            # Silent connections until the console has no descriptor left for the next one.
            for _ in range(NOFILE * 2):
                crowd.append(socket.create_connection(("127.0.0.1", port), timeout=5))
            wait_for(lambda: len(os.listdir(f"/proc/{proc.pid}/fd")) >= NOFILE - 1, timeout=10,
                     what="the console to run out of descriptors")
            answer = _get(port, token)
            assert answer.startswith(b"HTTP/1.1 503"), answer
            assert b"out of file descriptors" in answer, answer
            before, started = _cpu_seconds(proc.pid), time.monotonic()
            wait_for(lambda: time.monotonic() - started >= 1.0, timeout=5, what="a second of exhaustion")
            spent = _cpu_seconds(proc.pid) - before
            assert spent < 0.5, f"the console spent {spent:.2f} s of CPU in 1 s out of descriptors (spinning)"
            assert proc.poll() is None
        finally:
            for sock in crowd:
                sock.close()
        wait_for(lambda: _get(port, token).startswith(b"HTTP/1.1 200"), timeout=20,
                 what="the console to serve again once descriptors came back")

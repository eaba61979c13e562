"""``castor serve``'s stderr on a pipe (or a terminal) whose reader stops reading: a ``| less``
left paused, a supervisor's log pipe that stalls, a terminal after Ctrl-S. The log is the one
thing castor writes there; it must cost the log lines, never the serve."""

from __future__ import annotations

import os
import signal
import subprocess
import threading
import time
from pathlib import Path

import pytest

from castor.client import Client
from castor.messages.errors import NotFound
from tests.support.waiting import wait_for

from .conftest import CASTOR, castor_env

pytestmark = pytest.mark.timeout(60)


def _read_to_the_end(fd: int, into: list[bytes]) -> None:
    while chunk := os.read(fd, 1 << 16):
        into.append(chunk)


def test_a_serve_whose_stderr_nobody_reads_keeps_serving_and_stops_on_sigterm(tmp_path: Path):
    """Every thread that logged waited in ``write(2)`` once the pipe was full: the next call got no
    answer ("runtime.hello got no reply in time" after a few hundred connections at --log-level
    DEBUG), and SIGTERM no longer stopped the serve. Now lines that do not fit are dropped and
    counted, and the note of how many comes first once the reader reads again."""
    sock = tmp_path / "c.sock"
    read_end, write_end = os.pipe()  # the reader: this test, which reads nothing until the end
    proc = subprocess.Popen([*CASTOR, "--log-level", "DEBUG", "serve", "--socket", str(sock)],
                            env=castor_env(tmp_path), cwd=str(tmp_path), stdin=subprocess.DEVNULL,
                            stdout=subprocess.DEVNULL, stderr=write_end)
    os.close(write_end)
    try:
        wait_for(sock.exists, timeout=20, what="the socket")
        client = Client.connect_unix(str(sock), default_timeout=5)
        try:
            client.call("runtime.hello", {})
            path = "/root/" + "x" * 900
            for _ in range(400):  # each a DEBUG line of about 1 KB: 400 KB, more than a pipe holds
                client.notify("ops.mailbox", {"path": path})
            with pytest.raises(NotFound):  # answered after them all, in order
                client.call("ops.mailbox", {"path": path})
            assert client.call("ops.hosts", {})["backend"] == "local"
        finally:
            client.close()
        # The reader reads again: the lines that fit from now on come after the note of those lost.
        read: list[bytes] = []
        reader = threading.Thread(target=_read_to_the_end, args=(read_end, read), daemon=True)
        reader.start()

        def a_line_more_came_after_the_note() -> bool:
            Client.connect_unix(str(sock), default_timeout=5).close()  # a line or two more
            return "log lines were dropped" in b"".join(read).decode(errors="replace")

        wait_for(a_line_more_came_after_the_note, timeout=20, what="the note of the lines dropped")
        started = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(15) == 0
        assert time.monotonic() - started < 15
        reader.join(10)
        log = b"".join(read).decode(errors="replace")
        assert "castor serve: listening on" in log, log[:2000]
        assert "log lines were dropped" in log, log[-2000:]
        assert "castor endpoint stopped" in log.splitlines()[-1], log[-2000:]
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(5)
        os.close(read_end)

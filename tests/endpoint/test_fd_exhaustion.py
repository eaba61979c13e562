"""A ``castor serve`` out of file descriptors (``ulimit -n``) keeps serving: each connection it has
no descriptor for is refused at once with a typed ``mailbox_full`` (``data.reason:
out_of_file_descriptors``), the connections it holds keep working, and it accepts again once some
close. Before, the first connection whose wake-up pipe could not be made ended the accept thread:
the process lived on and every later client waited for a reply that never came."""

from __future__ import annotations

import os
import resource
import socket
import subprocess
import sys
import time
from pathlib import Path

import msgpack
import pytest

from castor.client import Client
from castor.messages.errors import CastorError
from tests.support.processes import killed_on_exit
from tests.support.waiting import wait_for

pytestmark = pytest.mark.timeout(90)

NOFILE = 48  # the server's descriptor limit: some 30 connections' worth once it runs


def _low_fd_limit() -> None:  # runs in the child before exec
    resource.setrlimit(resource.RLIMIT_NOFILE, (NOFILE, NOFILE))


def _hello(sock: socket.socket, timeout: float) -> dict:
    """Send ``runtime.hello`` on a raw socket. The first answer: ``ok`` (the reply), ``error`` (an
    ``error`` notification), ``closed`` (closed at once, the refusal lost in a race with the hello
    it did not read: the peer sees a reset), or ``silence`` (nothing before ``timeout``: a hang)."""
    sock.settimeout(timeout)
    unpacker = msgpack.Unpacker(raw=False, strict_map_key=False)
    try:
        sock.sendall(msgpack.packb([0, 1, "runtime.hello", [{}]]))
    except BrokenPipeError:  # refused and closed before the hello went out: the refusal may still be there
        pass
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            chunk = sock.recv(65536)
        except TimeoutError:
            break
        except ConnectionResetError:
            return {"closed": "reset"}
        if not chunk:
            return {"closed": "eof"}
        unpacker.feed(chunk)
        for frame in unpacker:
            if frame[0] == 1:  # a response
                return {"ok": frame[3]} if frame[2] is None else {"error": frame[2]}
            if frame[0] == 2 and frame[1] == "error":
                return {"error": frame[2][0]}
    return {"silence": True}


def _served(path: str) -> bool:
    try:
        with Client.connect_unix(path, default_timeout=5) as client:
            return bool(client.call("runtime.hello", {}))
    except (CastorError, OSError):
        return False


def test_a_server_out_of_file_descriptors_refuses_typed_keeps_serving_and_recovers(tmp_path: Path) -> None:
    path = str(tmp_path / "c.sock")
    env = {**os.environ, "HOME": str(tmp_path)}
    err_path = tmp_path / "serve.err"
    with open(err_path, "wb") as err:
        proc = subprocess.Popen([sys.executable, "-m", "castor", "serve", "--socket", path], env=env, cwd=str(tmp_path),
                                stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=err,
                                preexec_fn=_low_fd_limit)
    with killed_on_exit(proc):
        wait_for(lambda: os.path.exists(path) or proc.poll() is not None, timeout=30, what="the socket")
        assert proc.poll() is None
        held: list[socket.socket] = []
        outcomes: list[dict] = []
        try:
            for _ in range(2 * NOFILE):  # far more connections than the server has descriptors for
                sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
                sock.connect(path)
                outcome = _hello(sock, timeout=10)
                outcomes.append(outcome)
                assert "silence" not in outcome, f"connection {len(outcomes)} got no answer: {outcomes}"
                if "ok" in outcome:
                    held.append(sock)
                else:
                    sock.close()
            refused = [o["error"] for o in outcomes if "error" in o]
            assert held and refused, outcomes
            for err in refused:
                assert err["code"] == "mailbox_full", err
                assert err["data"]["reason"] == "out_of_file_descriptors", err
                assert err["data"]["errno"] == "EMFILE", err
            for sock in held[:5]:  # the connections it holds still answer
                assert "ok" in _hello(sock, timeout=10)
        finally:
            for sock in held:
                sock.close()
        # descriptors free again (the server closes the held connections as it sees them go):
        # a new client is served, so the accept thread is alive
        wait_for(lambda: _served(path), timeout=20, what="a new client served")
        assert proc.poll() is None
    stderr = err_path.read_text(errors="replace")
    assert "Traceback" not in stderr, stderr[-3000:]
    assert stderr.count("out of file descriptors") <= 3, stderr[-3000:]  # one line per spell, not per refusal

"""A caller's bounded spin before it blocks for its answer (castor._spin, castor.client).

Only where the process may run on several CPUs and the server is another process (a server in
this interpreter needs the interpreter lock the spinner keeps taking back). What the spin catches,
or what comes after it, is the call's answer exactly as a blocking read's: an answer after the
spin, a server that dies during it.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager

import pytest

import castor._spin as spin_module
from castor._spin import ReplySpin
from castor.client import Client
from castor.endpoint.errors import ConnectionClosed
from castor.messages.errors import CastorError

pytestmark = pytest.mark.timeout(60)

# A msgpack-rpc server in another process: answers each request with its params, after
# ``delay`` seconds; ``die`` ends the process without an answer.
_SERVER = r"""
import os, socket, sys, time
import msgpack
listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
listener.bind(sys.argv[1])
listener.listen(1)
print("listening", flush=True)
peer, _ = listener.accept()
unpacker = msgpack.Unpacker(raw=False)
while True:
    data = peer.recv(65536)
    if not data:
        break
    unpacker.feed(data)
    for frame in unpacker:
        if frame[0] != 0:
            continue
        params = frame[3][0]
        if params.get("die"):
            os._exit(0)
        time.sleep(params.get("delay", 0))
        peer.sendall(msgpack.packb([1, frame[1], None, params]))
"""


@pytest.fixture
def several_cpus(monkeypatch):
    monkeypatch.setattr(spin_module, "_multi_cpu", lambda: True)
    monkeypatch.delenv("CASTOR_REPLY_SPIN", raising=False)
    monkeypatch.delenv("CASTOR_REPLY_SPIN_US", raising=False)


@pytest.fixture
def other_process() -> Iterator[str]:
    with _server_in_another_process() as path:
        yield path


@contextmanager
def _server_in_another_process() -> Iterator[str]:
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "other.sock")
        proc = subprocess.Popen([sys.executable, "-c", _SERVER, path], stdout=subprocess.PIPE)
        try:
            assert proc.stdout is not None and proc.stdout.readline() == b"listening\n"
            yield path
        finally:
            proc.kill()
            proc.wait()


@pytest.fixture
def this_process() -> Iterator[str]:
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "this.sock")
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        listener.bind(path)
        listener.listen(1)
        try:
            yield path
        finally:
            listener.close()


def test_a_caller_spins_for_a_server_in_another_process(several_cpus, other_process):
    with Client.connect_unix(other_process) as client:
        spin = client.connection.reply_spin
        assert spin is not None
        assert [client.call("echo", {"n": n}) for n in range(30)] == [{"n": n} for n in range(30)]
        assert spin[0].spins > 0


def test_no_spin_on_one_cpu_nor_when_turned_off(monkeypatch, other_process):
    monkeypatch.setattr(spin_module, "_multi_cpu", lambda: False)
    with Client.connect_unix(other_process) as client:
        assert client.connection.reply_spin is None
        assert client.call("echo", {"n": 1}) == {"n": 1}


def test_off_when_turned_off(several_cpus, monkeypatch, other_process):
    monkeypatch.setenv("CASTOR_REPLY_SPIN", "0")
    with Client.connect_unix(other_process) as client:
        assert client.connection.reply_spin is None


def test_no_spin_for_a_server_in_this_process(several_cpus, this_process):
    with Client.connect_unix(this_process) as client:
        assert client.connection.reply_spin is None


def test_an_answer_that_comes_after_the_spin_is_still_read(several_cpus, other_process):
    with Client.connect_unix(other_process) as client:
        assert client.connection.reply_spin is not None
        spin = ReplySpin(max_us=50)
        client.connection.reply_spin = (spin, client.connection.reply_spin[1])
        # A call spins when its caller reads its own answer (the reader role free); a loaded host
        # can let the connection's worker take the role back between two calls: try a few times.
        for n in range(10):
            assert client.call("echo", {"n": n}) == {"n": n}
            spins = spin.spins
            assert client.call("echo", {"delay": 0.1, "n": n}) == {"delay": 0.1, "n": n}
            if spin.spins > spins:
                break
        assert spin.spins == spins + 1 and spin.hits < spin.spins  # it spun, and ended before the answer
        assert client.call("echo", {"n": 2}) == {"n": 2}


def test_a_server_that_dies_during_the_spin_fails_the_call_at_once(several_cpus):
    for _attempt in range(5):
        with _server_in_another_process() as path, Client.connect_unix(path) as client:
            assert client.connection.reply_spin is not None
            spin = ReplySpin(max_us=10_000_000)  # a spin that outlasts the death
            client.connection.reply_spin = (spin, client.connection.reply_spin[1])
            assert client.call("echo", {"n": 1}) == {"n": 1}
            spins = spin.spins
            started = time.monotonic()
            with pytest.raises(CastorError) as failed:
                client.call("echo", {"die": True}, timeout=20)
            assert isinstance(failed.value, ConnectionClosed)
            assert time.monotonic() - started < 10  # the end of stream, not the spin's bound
            if spin.spins > spins:  # it spun (see above): the end of stream came during the spin
                assert spin.hits == spin.spins
                return
    raise AssertionError("no call of five read its own answer")

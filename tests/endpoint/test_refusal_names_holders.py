"""A full endpoint's refusal line names who holds its slots. It said "refused a connection: too many
connections (limit N)" and nothing more: an operator could not tell the client that opened them
all (a loop that never closes) from the others without walking ``castor inspect`` and ``ss``. The
warning now names each peer holding a slot -- a Unix peer's uid and pid, a TCP peer's address and
uid where the system tells -- with how many slots each holds, most first."""

from __future__ import annotations

import io
import json
import os
import socket
import subprocess
import sys

import pytest

from castor.client import Client
from castor.endpoint.dispatch import Dispatcher
from castor.endpoint.server import Server
from castor.logs import configure_logging
from tests.support.waiting import wait_for

pytestmark = pytest.mark.timeout(60)


def _refusals(sink: io.StringIO) -> list[str]:
    return [r["message"] for r in (json.loads(line)["record"] for line in sink.getvalue().splitlines())
            if r["message"].startswith("refused a connection: too many connections")]


def test_the_refusal_of_a_full_endpoint_names_the_holders_and_their_counts(sock_dir: str) -> None:
    dispatcher = Dispatcher()
    dispatcher.register("echo", lambda params, _ctx: params)
    path = os.path.join(sock_dir, "full.sock")
    sink = io.StringIO()
    configure_logging("DEBUG", json=True, sink=sink)
    # A second process holds one slot, so the line must tell two peers apart.
    holder_code = ("import socket, sys; s = socket.socket(socket.AF_UNIX); s.connect(sys.argv[1]); "
                   "print('up', flush=True); sys.stdin.read()")
    other = None
    try:
        server = Server(dispatcher, unix_path=path, max_connections=3).start()
        try:
            mine = [Client.connect_unix(path, default_timeout=10) for _ in range(2)]
            try:
                for client in mine:
                    assert client.call("echo", {"n": 1}) == {"n": 1}
                other = subprocess.Popen([sys.executable, "-c", holder_code, path], stdin=subprocess.PIPE,
                                         stdout=subprocess.PIPE, text=True)
                assert other.stdout is not None and other.stdout.readline().strip() == "up"
                wait_for(lambda: len(server.connections()) == 3, timeout=10, what="three connections held")
                with socket.socket(socket.AF_UNIX) as extra:
                    extra.connect(path)
                    extra.settimeout(10)
                    assert extra.recv(4096), "the refusal's notification"
                [line] = wait_for(lambda: _refusals(sink), timeout=10, what="the refusal's warning")
            finally:
                for client in mine:
                    client.close()
        finally:
            server.stop()
    finally:
        configure_logging("ERROR", json=False)
        if other is not None:
            other.kill()
            other.wait(10)
    uid, me = os.geteuid(), os.getpid()
    assert f"2 by unix peer uid {uid} pid {me}" in line, line
    assert f"1 by unix peer uid {uid} pid {other.pid}" in line, line
    assert line.index(f"pid {me}") < line.index(f"pid {other.pid}"), line  # most first


def test_a_tcp_holder_is_named_by_its_address_and_uid(sock_dir: str) -> None:
    """A TCP peer has no ``SO_PEERCRED``: it is named by its address (the port left out, so one
    client's connections count together) and the uid its row in ``/proc/net/tcp`` gives."""
    dispatcher = Dispatcher()
    dispatcher.register("echo", lambda params, _ctx: params)
    token = "t" * 32
    sink = io.StringIO()
    configure_logging("DEBUG", json=True, sink=sink)
    try:
        server = Server(dispatcher, tcp=("127.0.0.1", 0), token=token, max_connections=2).start()
        try:
            host, port = server.address[:2]
            holders = [Client.connect_tcp(host, port, default_timeout=10, token=token) for _ in range(2)]
            try:
                for client in holders:
                    client.call("runtime.hello", {})  # authenticated: not evicted to make room
                with socket.create_connection((host, port), timeout=10) as extra:
                    assert extra.recv(4096), "the refusal's notification"
                [line] = wait_for(lambda: _refusals(sink), timeout=10, what="the refusal's warning")
            finally:
                for client in holders:
                    client.close()
        finally:
            server.stop()
    finally:
        configure_logging("ERROR", json=False)
    shown = "2 by tcp peer 127.0.0.1" + (f" uid {os.geteuid()}" if os.path.exists("/proc/net/tcp") else "")
    assert shown in line, line

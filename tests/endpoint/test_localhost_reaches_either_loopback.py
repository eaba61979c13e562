"""``localhost`` reaches a castor serving on either loopback. Many systems' ``/etc/hosts`` give
``localhost`` only ``127.0.0.1`` (``::1`` is ``ip6-localhost``), so a client -- ``castor inspect --tcp
localhost:PORT`` among them -- tried that one address and said no castor was listening while a serve
listened on ``[::1]:PORT``. The client now tries both loopbacks for ``localhost``."""

from __future__ import annotations

import socket
from typing import Any

import pytest

from castor.client import Client
from castor.endpoint.dispatch import Dispatcher
from castor.endpoint.server import Server

pytestmark = pytest.mark.timeout(30)

TOKEN = "t" * 32


def _has_ipv6_loopback() -> bool:
    try:
        with socket.socket(socket.AF_INET6) as sock:
            sock.bind(("::1", 0))
        return True
    except OSError:
        return False


@pytest.fixture
def localhost_is_ipv4_only(monkeypatch: pytest.MonkeyPatch) -> None:
    """``localhost`` resolves as such an ``/etc/hosts`` makes it, whatever this host's says."""
    real = socket.getaddrinfo

    def getaddrinfo(host: Any, *args: Any, **kwargs: Any) -> list:
        found = real(host, *args, **kwargs)
        return [info for info in found if info[0] == socket.AF_INET] if host == "localhost" else found

    monkeypatch.setattr(socket, "getaddrinfo", getaddrinfo)


@pytest.mark.skipif(not _has_ipv6_loopback(), reason="this system has no IPv6 loopback")
@pytest.mark.parametrize("token", [TOKEN, None], ids=["with_token", "without_token"])
def test_localhost_reaches_a_serve_on_the_ipv6_loopback(localhost_is_ipv4_only: None, token: str | None) -> None:
    dispatcher = Dispatcher()
    dispatcher.register("echo", lambda params, _ctx: params)
    server = Server(dispatcher, tcp=("::1", 0), token=TOKEN).start()
    try:
        _host, port = server.address[:2]
        with Client.connect_tcp("localhost", port, default_timeout=10, token=token) as client:
            assert client.connection.transport._sock.family == socket.AF_INET6
            client.call("runtime.hello", {"token": TOKEN})
            assert client.call("echo", {"n": 1}) == {"n": 1}
    finally:
        server.stop()


@pytest.mark.skipif(not _has_ipv6_loopback(), reason="this system has no IPv6 loopback")
def test_inspect_finds_a_serve_on_the_ipv6_loopback_by_localhost(localhost_is_ipv4_only: None) -> None:
    """``castor inspect``'s own connect, as its ``--tcp localhost:PORT`` makes it."""
    from types import SimpleNamespace

    from castor.cli.inspect import _connect

    dispatcher = Dispatcher()
    dispatcher.register("echo", lambda params, _ctx: params)
    server = Server(dispatcher, tcp=("::1", 0), token=TOKEN).start()
    try:
        _host, port = server.address[:2]
        client = _connect(SimpleNamespace(socket=None, tcp=("localhost", port)), None)
        with client:
            assert client.connection.transport._sock.family == socket.AF_INET6
    finally:
        server.stop()

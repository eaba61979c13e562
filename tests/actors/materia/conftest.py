from __future__ import annotations

import pytest

from castor.client import Client
from castor.endpoint.app import build_dispatcher
from castor.endpoint.server import Server

from .helpers import make_runtime


@pytest.fixture
def runtime_factory():
    made = []

    def make(**settings):
        rt = make_runtime(**settings)
        made.append(rt)
        return rt

    yield make
    for rt in made:
        rt.shutdown(10.0)


@pytest.fixture
def project(tmp_path):
    path = tmp_path / "project"
    path.mkdir()
    return path


@pytest.fixture
def served(tmp_path):
    """A real Server on a Unix socket over a fresh runtime; call it to connect a Client."""
    runtime = make_runtime()
    server = Server(build_dispatcher(runtime), unix_path=str(tmp_path / "castor.sock")).start()
    clients: list[Client] = []

    def connect() -> Client:
        client = Client.connect_unix(str(tmp_path / "castor.sock"), default_timeout=15)
        clients.append(client)
        return client

    connect.server = server  # type: ignore[attr-defined]  # for the tests that reach the server's connections
    connect.runtime = runtime  # type: ignore[attr-defined]
    yield connect
    for client in clients:
        client.close()
    server.stop()
    runtime.shutdown(10)

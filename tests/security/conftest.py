"""Shared set-up for the security tests: real servers, real runtimes, real files.

Only what cannot exist here is faked: the classifier model (a deterministic
stand-in below) and the harness UI (a recorder). The Icarus backend is the
REFERENCE BACKEND (examples/icarus_reference, a stand-in for the private
plugin) in real worker subprocesses; the endpoint is a real ``python -m castor
serve`` subprocess.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import msgpack
import pytest

from castor.actors.icarus.component import session_of
from castor.adapters.session_jsonl import JsonlSessionLog
from castor.client import Client
from castor.ports.classifier import ClassifierRequest, ClassifierResponse, ModelEndpoint
from castor.runtime import HarnessLink, Runtime, SessionInfo
from tests.support.icarus import REFERENCE_ICARUS, IcarusWorldBase, read_jsonl, wait_until  # noqa: F401 - re-exported for the security tests
from tests.support.processes import terminate_then_kill


def files_under(root: Path) -> set[Path]:
    """Every file and symlink under ``root`` (resolved parents, link itself not followed)."""
    return {p for p in root.rglob("*") if p.is_file() or p.is_symlink()}


# ---------------------------------------------------------------------------
# The endpoint as a real process


def serve_env(tmp: Path) -> dict[str, str]:
    """A clean environment for ``castor serve``: its own HOME and agent dir (no Icarus package)."""
    home = tmp / "home"
    (home / "agent").mkdir(parents=True, exist_ok=True)
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(home),
           "PI_CODING_AGENT_DIR": str(home / "agent"), "PYTHONUNBUFFERED": "1"}
    if os.environ.get("PYTHONPATH"):  # a checkout run with its tree first on the path: serve that tree
        env["PYTHONPATH"] = os.environ["PYTHONPATH"]
    return env


def castor_argv(*args: str) -> list[str]:
    return [sys.executable, "-m", "castor", *args]


class SocketServer:
    """``python -m castor serve --socket PATH`` in a subprocess."""

    def __init__(self, tmp: Path, *extra: str) -> None:
        self.path = str(tmp / "castor.sock")
        self.stderr_path = tmp / "serve.stderr"
        self._err = open(self.stderr_path, "wb")  # noqa: SIM115 - closed in stop()
        self.proc = subprocess.Popen(castor_argv("serve", "--socket", self.path, *extra), env=serve_env(tmp),
                                     cwd=str(tmp), stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                     stderr=self._err)
        wait_until(lambda: self._accepting() or self.proc.poll() is not None, 20, "the socket")
        assert self.proc.poll() is None, self.stderr_path.read_text()

    def _accepting(self) -> bool:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.connect(self.path)
            return True
        except OSError:
            return False
        finally:
            sock.close()

    def alive(self) -> bool:
        return self.proc.poll() is None

    def client(self) -> Client:
        return Client.connect_unix(self.path, default_timeout=10)

    def raw(self) -> RawPeer:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.connect(self.path)
        return RawPeer(sock)

    def stop(self) -> None:
        terminate_then_kill(self.proc)
        self._err.close()


class RawPeer:
    """A raw socket peer: writes any bytes, reads back msgpack values until EOF."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.unpacker = msgpack.Unpacker(raw=False, strict_map_key=False)
        self.eof = False

    def send(self, data: bytes) -> None:
        self.sock.sendall(data)

    def read(self, timeout: float = 5.0, until: Callable[[list[Any]], bool] | None = None) -> list[Any]:
        """Values received until ``until(values)`` holds, EOF, or ``timeout``."""
        values: list[Any] = []
        deadline = time.monotonic() + timeout
        while not self.eof and time.monotonic() < deadline:
            if until is not None and until(values):
                break
            self.sock.settimeout(max(0.01, deadline - time.monotonic()))
            try:
                chunk = self.sock.recv(1 << 16)
            except TimeoutError:
                break
            except OSError:
                chunk = b""
            if not chunk:
                self.eof = True
                break
            self.unpacker.feed(chunk)
            values.extend(self.unpacker)
        return values

    def close(self) -> None:
        self.sock.close()


@pytest.fixture
def socket_server(tmp_path: Path) -> Iterator[SocketServer]:
    server = SocketServer(tmp_path)
    yield server
    server.stop()


# ---------------------------------------------------------------------------
# Icarus over the reference backend


class OverlapClassifier:
    """TEST STAND-IN for an LLM classifier: relevant iff a 4+ letter word is shared with the request."""

    model = ModelEndpoint(provider="test", id="overlap", base_url="http://127.0.0.1/stand-in")

    def __init__(self) -> None:
        self.requests: list[ClassifierRequest] = []

    def list_models(self, deadline: float | None = None):
        return [self.model]

    def complete(self, request: ClassifierRequest, deadline: float) -> ClassifierResponse:
        self.requests.append(request)
        payload = json.loads(request.messages[-1].content)
        words = _words(payload["request"])
        return ClassifierResponse(text=json.dumps({"decisions": [
            {"id": c["id"], "relevant": bool(words & _words(c["text"])), "confidence": 0.95}
            for c in payload["candidates"]]}))


def _words(text: str) -> set[str]:
    import re

    return {w for w in re.findall(r"[a-z]+", text.lower()) if len(w) >= 4}


class IcarusWorld(IcarusWorldBase):
    """A project, a global agent dir pointing at the reference backend, a runtime."""

    CLASSIFIER = "default"

    def __init__(self, tmp: Path) -> None:
        super().__init__(tmp)
        self.classifier = OverlapClassifier()
        self.write_global()

    def open(self, rt: Runtime, sid: str = "s1", *, trusted: bool = False):
        link = HarnessLink(agent=None, session_log=JsonlSessionLog(self.session_log_path), ui=self.ui,
                           classifier=self.classifier)
        ctx = rt.open_session(SessionInfo(session_id=sid, cwd=str(self.project), trusted=trusted), link)
        return ctx, session_of(ctx)


@pytest.fixture
def icarus_world(tmp_path: Path) -> Iterator[IcarusWorld]:
    world = IcarusWorld(tmp_path)
    yield world
    world.close()


@pytest.fixture
def reachable() -> Iterator[Path]:
    """A directory another user may traverse and read (``/tmp``'s pytest base is ``0700``): for the
    tests that read a project as uid nobody."""
    base = Path(tempfile.mkdtemp(prefix="castor-reachable-"))
    base.chmod(0o755)
    try:
        yield base
    finally:
        shutil.rmtree(base, ignore_errors=True)

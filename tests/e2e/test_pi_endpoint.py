"""The extension connects to an already running castor (``--castor-endpoint``) instead of starting
one, and presents a token from ``--castor-token-file`` in ``runtime.hello``.

The token side uses a TOKEN PROBE: a minimal msgpack-rpc server on a Unix socket that checks the
``token`` of ``runtime.hello`` (answering ``unauthenticated`` when it is wrong) and records what it
received — castor's own endpoint gains the token check separately.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgpack
import pytest

from tests.support.waiting import poll_until

from .conftest import python_env, read_jsonl
from .pi_rpc import PiRpc

pytestmark = [pytest.mark.pi, pytest.mark.timeout(90)]

TOKEN = "tok-3f9a1c-castor"
CONFIG = {
    "artifactDir": ".pi/pi-materia",
    "activeLoadout": "One",
    "materia": {"Solo": {"prompt": "ENDPOINT-MATERIA: do it.", "tools": "none"}},
    "loadouts": {"One": {"entry": "Socket-1", "sockets": {"Socket-1": {"type": "agent", "materia": "Solo",
                                                                     "parse": "text"}}}},
}


def short_socket_path(tmp_path: Path, name: str) -> Path:
    """A Unix socket path under the 108-byte limit (pytest's tmp paths can be long)."""
    path = tmp_path / name
    if len(str(path)) < 100:
        return path
    return Path("/tmp") / f"castor-e2e-{os.getpid()}-{name}"


class TokenProbe:
    """Answers runtime.hello: ``{methods: ["runtime.hello"]}`` for the right token, else the error
    ``unauthenticated``; every hello's params are kept in :attr:`hellos`."""

    def __init__(self, path: Path, token: str) -> None:
        self.path, self.token = path, token
        self.hellos: list[dict[str, Any]] = []
        self.connections = 0
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.bind(str(path))
        self.sock.listen(4)
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.connections += 1
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        """Answer one connection until it closes; a peer that resets it (Pi dropping a
        refused connection) ends this thread quietly, as a closed one does."""
        try:
            self._answer(conn)
        except (ConnectionResetError, BrokenPipeError):
            pass

    def _answer(self, conn: socket.socket) -> None:
        unpacker = msgpack.Unpacker(raw=False)
        with conn:
            while chunk := conn.recv(65536):
                unpacker.feed(chunk)
                for frame in unpacker:
                    if frame[0] != 0:
                        continue
                    _, msgid, method, params = frame
                    p = params[0] if isinstance(params, list) and params else {}
                    if method == "runtime.hello":
                        self.hellos.append(p)
                        if p.get("token") == self.token:
                            reply = [
                                1,
                                msgid,
                                None,
                                {"name": "token-probe", "version": "0", "methods": ["runtime.hello"]},
                            ]
                        else:
                            reply = [
                                1,
                                msgid,
                                {"code": "unauthenticated", "message": "a valid token is required"},
                                None,
                            ]
                    else:
                        reply = [1, msgid, {"code": "unknown_method", "message": method}, None]
                    conn.sendall(msgpack.packb(reply))

    def close(self) -> None:
        self.sock.close()
        self.path.unlink(missing_ok=True)


@pytest.fixture
def token_probe(tmp_path: Path) -> Iterator[TokenProbe]:
    probe = TokenProbe(short_socket_path(tmp_path, "probe.sock"), TOKEN)
    yield probe
    probe.close()


def start(pi_install, fake_llm, tmp_path: Path, project: Path, args: list[str]) -> PiRpc:
    from .pi_rpc import write_agent_dir
    agent = tmp_path / "agent"
    write_agent_dir(agent, fake_llm.base_url, {"defaultProjectTrust": "always"})
    project.mkdir(parents=True, exist_ok=True)
    return PiRpc(pi_install, cwd=project, agent_dir=agent, session_dir=tmp_path / "sessions" / str(len(args)),
                 castor_command=None, env={**python_env(), "HOME": str(tmp_path / "home")}, timeout_ms=15000,
                 extra_args=args)


def status(pi: PiRpc) -> str:
    return str(pi.wait_ui("setStatus", lambda e: e.get("statusKey") == "castor" and e.get("statusText"),
                          timeout=40)["statusText"])


def token_file(tmp_path: Path, text: str, mode: int = 0o600) -> Path:
    path = tmp_path / "token"
    path.write_text(text)
    path.chmod(mode)
    return path


def test_a_cast_runs_on_a_castor_that_was_already_running_and_pi_leaves_it_running(pi_install, fake_llm, tmp_path):
    sock = short_socket_path(tmp_path, "castor.sock")
    server = subprocess.Popen([sys.executable, "-m", "castor", "serve", "--socket", str(sock)],
                              env={**os.environ, **python_env()}, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                              start_new_session=True)
    try:
        assert poll_until(lambda: sock.exists(), timeout=30), "castor serve --socket never listened"
        project = tmp_path / "project"
        (project / ".pi").mkdir(parents=True)
        (project / ".pi" / "pi-materia.json").write_text(json.dumps(CONFIG))
        fake_llm.reply_text("DONE-OVER-SOCKET", when="ENDPOINT-MATERIA")
        pi = start(pi_install, fake_llm, tmp_path, project, ["--castor-endpoint", f"unix:{sock}"])
        try:
            assert status(pi).startswith("castor: up"), pi.stderr()[-3000:]
            cmd = pi.command("/castor status")
            assert f"at unix:{sock}" in pi.wait_ui("notify", start=cmd, timeout=20)["message"]
            pi.command("/materia cast do it")
            assert poll_until(lambda: list((project / ".pi" / "pi-materia").glob("*/events.jsonl")), timeout=20)
            (events_file,) = (project / ".pi" / "pi-materia").glob("*/events.jsonl")
            assert poll_until(lambda: any(e["type"] == "cast_end" for e in read_jsonl(events_file)), timeout=30)
            assert read_jsonl(events_file)[-1]["data"]["ok"] is True
        finally:
            pi.close()
        assert server.poll() is None, "Pi quitting must not stop a castor it did not start"
    finally:
        server.terminate()
        server.wait(timeout=10)
        sock.unlink(missing_ok=True)


def test_the_token_from_the_token_file_is_presented_in_hello(pi_install, fake_llm, tmp_path, token_probe):
    tok = token_file(tmp_path, f"{TOKEN}\n")
    pi = start(pi_install, fake_llm, tmp_path, tmp_path / "project",
               ["--castor-endpoint", f"unix:{token_probe.path}", "--castor-token-file", str(tok)])
    try:
        assert status(pi).startswith("castor: up"), pi.stderr()[-3000:]
        assert token_probe.hellos[0]["token"] == TOKEN and token_probe.hellos[0]["client"] == "pi"
        assert TOKEN not in pi.stderr(), "the token is never logged"
    finally:
        pi.close()


def test_a_wrong_token_is_refused_and_shown_as_unauthenticated(pi_install, fake_llm, tmp_path, token_probe):
    tok = token_file(tmp_path, "not-the-token")
    pi = start(pi_install, fake_llm, tmp_path, tmp_path / "project",
               ["--castor-endpoint", f"unix:{token_probe.path}", "--castor-token-file", str(tok)])
    try:
        note = pi.wait_ui("notify", lambda e: e.get("notifyType") == "error", timeout=40)
        assert "[unauthenticated]" in note["message"], note
        start_at = pi.prompt("still works without castor")
        assert "FAKE-REPLY" in json.dumps(pi.wait_for(lambda e: e.get("type") == "agent_end", start=start_at))
    finally:
        pi.close()


@pytest.mark.parametrize("case", ["world-readable", "missing", "no endpoint"])
def test_a_bad_token_file_or_endpoint_is_a_clear_error_and_nothing_is_sent(pi_install, fake_llm, tmp_path, token_probe,
                                                                        case):
    if case == "world-readable":
        args = ["--castor-endpoint", f"unix:{token_probe.path}",
                "--castor-token-file", str(token_file(tmp_path, TOKEN, 0o644))]
        expect = "readable by others"
    elif case == "missing":
        args = ["--castor-endpoint", f"unix:{token_probe.path}", "--castor-token-file", str(tmp_path / "nope")]
        expect = "cannot read --castor-token-file"
    else:
        args = ["--castor-endpoint", f"unix:{tmp_path / 'nobody.sock'}"]
        expect = "cannot reach castor at unix:"
    pi = start(pi_install, fake_llm, tmp_path, tmp_path / "project", args)
    try:
        note = pi.wait_ui("notify", lambda e: e.get("notifyType") == "error", timeout=40)
        assert expect in note["message"], note
        assert token_probe.connections == 0 and token_probe.hellos == []
    finally:
        pi.close()

"""castor's endpoint and operator surfaces met from the outside: hostile flags, peers and paths.

Each test drives a real ``python -m castor`` subprocess (so what a user or another local
process meets is what is checked) and waits on the process or on a deadline, never on a sleep.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from .conftest import castor_argv, serve_env

pytestmark = pytest.mark.timeout(120)


def _runtime_dir(tmp: Path) -> Path:
    xdg = tmp / "xdg"
    xdg.mkdir(mode=0o700, exist_ok=True)
    return xdg


@pytest.mark.parametrize("extra", [
    ("--console-token-file", "CONSOLE_TOKEN"),  # without --console
    ("--console", "127.0.0.1:0", "--console-token-file", "CONSOLE_TOKEN"),  # a token file others may read
], ids=["console-token-without-console", "console-token-readable-by-others"])
def test_a_serve_refused_at_its_flags_leaves_no_token_file_behind(tmp_path, extra):
    """``castor serve --tcp`` whose console flags are refused used to have made the endpoint's
    token file first and exit 2 leaving it in the runtime directory: a secret nobody removes,
    one per refused start. A refused start now leaves the runtime directory as it found it."""
    xdg = _runtime_dir(tmp_path)
    console_token = tmp_path / "console.token"
    console_token.write_text("c" * 32 + "\n")
    console_token.chmod(0o644)
    argv = castor_argv("serve", "--tcp", "127.0.0.1:0",
                       *(str(console_token) if a == "CONSOLE_TOKEN" else a for a in extra))
    done = subprocess.run(argv, env={**serve_env(tmp_path), "XDG_RUNTIME_DIR": str(xdg)}, cwd=str(tmp_path),
                          stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2, done.stderr
    assert len(done.stderr.strip().splitlines()) == 1 and done.stderr.startswith("castor: "), done.stderr
    assert "Traceback" not in done.stderr
    assert sorted(p.name for p in xdg.rglob("*") if not p.is_dir()) == []


class _Listener:
    """A plain TCP listener on every local address that records what its first peer sends."""

    def __init__(self) -> None:
        import socket
        import threading

        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.sock.bind(("0.0.0.0", 0))
        self.sock.listen(4)
        self.port = self.sock.getsockname()[1]
        self.received = b""
        self.accepted = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        try:
            peer, _ = self.sock.accept()
        except OSError:
            return
        self.accepted.set()
        with peer:
            peer.settimeout(5)
            try:
                while chunk := peer.recv(1 << 16):
                    self.received += chunk
            except OSError:
                pass

    def close(self) -> None:
        self.sock.close()


def _non_loopback_address() -> str:
    """An address of this machine that is not loopback (a peer elsewhere could reach it)."""
    import socket

    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        try:
            probe.connect(("192.0.2.1", 9))  # TEST-NET-1: no packet is sent by a UDP connect
            address = probe.getsockname()[0]
        except OSError:
            address = ""
    if not address or address.startswith("127."):
        pytest.skip("this machine has no non-loopback IPv4 address")
    return address


def test_a_token_is_never_sent_to_a_non_loopback_address(tmp_path):
    """``castor serve`` listens on loopback only because the token travels in clear text; but
    ``castor inspect --tcp HOST:PORT --token-file F`` (and ``Client.connect_tcp(..., token_file=F)``)
    connected to any host and sent the token in its first frame: a mistyped or planted address
    handed the endpoint's secret to whoever listened there, across the network. Now a token is
    never sent off this machine: ``forbidden`` before anything connects (inspect: one line, exit 2)."""
    from castor.client import Client
    from castor.messages.errors import Forbidden

    token_file = tmp_path / "endpoint.token"
    token_file.write_text("s" * 43 + "\n")
    token_file.chmod(0o600)
    host = _non_loopback_address()
    listener = _Listener()
    try:
        done = subprocess.run(castor_argv("inspect", "--tcp", f"{host}:{listener.port}", "--token-file",
                                          str(token_file)),
                              env=serve_env(tmp_path), cwd=str(tmp_path), stdin=subprocess.DEVNULL,
                              capture_output=True, text=True, timeout=60)
        assert done.returncode == 2, done.stderr
        assert done.stderr.startswith("castor: forbidden:") and len(done.stderr.strip().splitlines()) == 1, \
            done.stderr
        with pytest.raises(Forbidden):
            Client.connect_tcp(host, listener.port, token_file=str(token_file), default_timeout=5)
        with pytest.raises(Forbidden):
            Client.connect_tcp(host, listener.port, token="s" * 43, default_timeout=5)
        assert not listener.accepted.is_set() and b"s" * 43 not in listener.received
    finally:
        listener.close()

"""Drive a real *interactive* Pi (its terminal UI) with the castor extension from a test.

The RPC driver (pi_rpc.py) cannot press a key: Pi's RPC ``abort`` is a command, and an extension
only sees the terminal's keys in the interactive mode. :class:`PiTty` starts Pi on a pseudo-terminal
(40 rows, 120 columns) in its own session, drains what it draws on a thread (kept for a failure's
message, never parsed for state: tests observe castor's side, the probe's call log and the fake
LLM), and types into it as a user does. Teardown kills the whole process group.
"""

from __future__ import annotations

import fcntl
import json
import os
import signal
import struct
import subprocess
import termios
import threading
import time
from pathlib import Path

from .pi_rpc import PiInstall

ESC = b"\x1b"
ENTER = b"\r"


class PiTty:
    """One interactive Pi on a pseudo-terminal."""

    def __init__(self, install: PiInstall, *, cwd: Path, agent_dir: Path, session_dir: Path,
                 castor_command: list[str], env: dict[str, str], timeout_ms: int = 15000) -> None:
        session_dir.mkdir(parents=True, exist_ok=True)
        self._master, slave = os.openpty()
        fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 40, 120, 0, 0))
        full_env = {**os.environ, **env, "TERM": "xterm-256color", "PI_CODING_AGENT_DIR": str(agent_dir),
                    "PI_OFFLINE": "1", "PATH": f"{install.node.parent}{os.pathsep}{os.environ.get('PATH', '')}"}
        argv = [str(install.node), str(install.cli), "--no-extensions", "-e", str(install.extension),
                "--session-dir", str(session_dir), "--no-skills", "--no-prompt-templates", "--no-context-files",
                "--offline", "--castor-command", json.dumps(castor_command), "--castor-timeout-ms", str(timeout_ms)]
        try:
            self.proc = subprocess.Popen(argv, cwd=cwd, env=full_env, stdin=slave, stdout=slave, stderr=slave,
                                         start_new_session=True)
        finally:
            os.close(slave)
        self._screen = bytearray()
        self._lock = threading.Lock()
        self._reader = threading.Thread(target=self._drain, name="pi-tty-reader", daemon=True)
        self._reader.start()

    def _drain(self) -> None:
        while True:
            try:
                chunk = os.read(self._master, 65536)
            except OSError:  # EIO: the terminal's other side closed (Pi ended)
                return
            if not chunk:
                return
            with self._lock:
                self._screen += chunk
                del self._screen[:-200_000]  # the tail is enough to explain a failure

    def type(self, text: str) -> None:
        """Type ``text`` and press Enter (a beat between, as a user's Enter comes after the text)."""
        os.write(self._master, text.encode())
        time.sleep(0.2)
        os.write(self._master, ENTER)

    def drained(self, timeout: float) -> bool:
        """Whether everything Pi wrote is read (its side of the terminal closed) within ``timeout``."""
        self._reader.join(timeout)
        return not self._reader.is_alive()

    def press(self, key: bytes) -> None:
        os.write(self._master, key)

    def screen_tail(self, n: int = 2000) -> str:
        with self._lock:
            return bytes(self._screen[-n:]).decode(errors="replace")

    def close(self) -> None:
        if self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        try:
            self.proc.wait(10)
        finally:
            try:
                os.close(self._master)
            except OSError:
                pass

"""Real ``castor serve`` processes met from the outside: a Unix socket or a loopback TCP port,
its own home and runtime directory under the test's ``tmp_path``; stopped (and its stderr kept
for the assertions) when the test ends."""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from castor.client import Client
from tests.support.processes import terminate_then_kill
from tests.support.waiting import wait_for

CASTOR = [sys.executable, "-m", "castor"]
_TOKEN_LINE = re.compile(r"castor serve: listening on \S+; token file: ([^;\s]+);")


def castor_env(tmp: Path) -> dict[str, str]:
    """The serve's and the CLI's environment: a home and a private runtime directory of the test's own."""
    env = {k: v for k, v in os.environ.items() if k not in ("MATERIA_CONFIG", "CASTOR_LOG_JSON", "CASTOR_TOKEN_FILE",
                                                             "CASTOR_LOG_LEVEL")}
    (tmp / "home" / "agent").mkdir(parents=True, exist_ok=True)
    (tmp / "xdg").mkdir(mode=0o700, exist_ok=True)
    env.update(HOME=str(tmp / "home"), PI_CODING_AGENT_DIR=str(tmp / "home" / "agent"),
               XDG_RUNTIME_DIR=str(tmp / "xdg"), PYTHONUNBUFFERED="1")
    return env


def castor(tmp: Path, *args: str, timeout: float = 30) -> subprocess.CompletedProcess[str]:
    """One ``castor`` command run to its end in the test's environment."""
    return subprocess.run([*CASTOR, *args], env=castor_env(tmp), capture_output=True, text=True, timeout=timeout,
                          cwd=str(tmp))


class Serve:
    """``castor serve`` with ``args`` (``--socket PATH`` or ``--tcp 127.0.0.1:PORT`` among them)."""

    def __init__(self, tmp: Path, *args: str) -> None:
        self.tmp = tmp
        self.stderr_path = tmp / f"serve-{len(list(tmp.glob('serve-*.stderr')))}.stderr"
        self._err = open(self.stderr_path, "wb")  # noqa: SIM115 - closed in stop()
        self.proc = subprocess.Popen([*CASTOR, "serve", *args], env=castor_env(tmp), cwd=str(tmp),
                                     stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=self._err)
        wait_for(lambda: "castor serve: listening on" in self.log() or self.proc.poll() is not None, timeout=20,
                 what="the serving line")
        assert self.proc.poll() is None, self.log()
        found = _TOKEN_LINE.search(self.log())
        self.token_file = found.group(1) if found and found.group(1) != "-" else None

    def log(self) -> str:
        return self.stderr_path.read_text(errors="replace")

    def stop(self) -> None:
        terminate_then_kill(self.proc)
        self._err.close()


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.fixture
def serve(tmp_path: Path) -> Iterator[type[Serve]]:
    """Start serves with ``serve(tmp_path, *args)``; every one is stopped when the test ends."""
    started: list[Serve] = []

    class Started(Serve):
        def __init__(self, tmp: Path, *args: str) -> None:
            super().__init__(tmp, *args)
            started.append(self)

    yield Started
    for one in started:
        one.stop()


def a_served_cast_awaiting_its_turn(tmp: Path, serve: type[Serve]) -> tuple[Serve, Client, Path, str]:
    """A serve on a Unix socket under ``tmp`` (started with the ``serve`` fixture), a client of it
    (the caller closes it) and the id of a cast of ``tmp/project`` it runs, awaiting its agent's turn."""
    from tests.support.served import start_a_cast_awaiting_its_turn

    sock = tmp / "c.sock"
    project = tmp / "project"
    project.mkdir()
    served = serve(tmp, "--socket", str(sock))
    client = Client.connect_unix(str(sock), default_timeout=20)
    try:
        return served, client, project, start_a_cast_awaiting_its_turn(client, project)
    except BaseException:
        client.close()
        raise

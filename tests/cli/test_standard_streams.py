"""The ``castor`` command started with a standard stream closed, or writing to a reader that went away.

A program started by a service manager, a cron job or ``cmd >&-`` may find fd 0, 1 or 2 closed.
The next file or socket castor opened then took that number: the endpoint's wake-up socket became
"stdin" of ``serve --stdio`` (which then hung for good, deaf to SIGTERM), and with fd 2 closed every
command failed before it began (its log sink was ``None``) without a word.
"""

from __future__ import annotations

import os
import shlex
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from castor.client import Client
from tests.support.processes import killed_on_exit
from tests.support.waiting import wait_for

pytestmark = pytest.mark.timeout(90)

CASTOR = [sys.executable, "-m", "castor"]


def _env(tmp_path: Path) -> dict[str, str]:
    env = dict(os.environ)
    env["HOME"] = str(tmp_path / "home")
    (tmp_path / "home").mkdir(exist_ok=True)
    env.pop("XDG_RUNTIME_DIR", None)
    env["PI_CODING_AGENT_DIR"] = str(tmp_path / "home" / ".pi" / "agent")
    env.pop("MATERIA_CONFIG", None)
    env.pop("CASTOR_TOKEN_FILE", None)
    return env


def _sh(argv: list[str], redirections: str) -> list[str]:
    """``argv`` run by a shell with ``redirections`` (``>&-``: stdout closed); the shell execs it, so
    a timeout's kill reaches castor itself."""
    return ["bash", "-c", "exec " + " ".join(shlex.quote(a) for a in argv) + " " + redirections]


def test_a_command_whose_stdout_is_closed_says_so_in_one_line(tmp_path):
    for argv in (["casts"], ["casts", "--json"], ["grid"], ["loadout"]):
        done = subprocess.run(_sh([*CASTOR, *argv], ">&-"), env=_env(tmp_path), cwd=str(tmp_path),
                              capture_output=True, text=True, timeout=60)
        assert done.returncode == 1, (argv, done.stderr)
        assert done.stderr == "castor: storage_unavailable: stdout is closed (EBADF)\n", (argv, done.stderr)


def test_help_and_version_with_stdout_closed_still_exit_0(tmp_path):
    for argv in (["--help"], ["--version"], ["serve", "--help"]):
        done = subprocess.run(_sh([*CASTOR, *argv], ">&-"), env=_env(tmp_path), cwd=str(tmp_path),
                              capture_output=True, text=True, timeout=60)
        assert done.returncode == 0 and "Traceback" not in done.stderr, (argv, done.stderr)


def test_serve_on_a_socket_with_stderr_closed_serves_and_stops_cleanly(tmp_path):
    """It exited 1 at once, before listening, and said nothing (it had nowhere to say it)."""
    sock = tmp_path / "castor.sock"
    server = subprocess.Popen(_sh([*CASTOR, "serve", "--socket", str(sock)], "<&- >&- 2>&-"),
                              env=_env(tmp_path), cwd=str(tmp_path))
    with killed_on_exit(server):
        wait_for(lambda: sock.exists() or server.poll() is not None, timeout=30, what="the socket")
        assert server.poll() is None, f"castor serve exited {server.returncode}"
        with Client.connect_unix(str(sock)) as client:
            assert client.call("runtime.hello", {}, timeout=20)["name"] == "castor"
            client.call("session.open", {"session_id": "s1", "cwd": str(tmp_path)}, timeout=20)
        server.send_signal(signal.SIGTERM)
        assert server.wait(30) == 0
    assert not sock.exists()


def test_serve_stdio_with_stdin_closed_ends_as_at_end_of_input(tmp_path):
    """Its wake-up socket took fd 0 and was read as the harness: castor hung, and ignored SIGTERM."""
    done = subprocess.run(_sh([*CASTOR, "serve", "--stdio"], "<&-"), env=_env(tmp_path), cwd=str(tmp_path),
                          stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert "Traceback" not in done.stderr


def test_serve_stdio_with_stdout_closed_is_refused(tmp_path):
    """Its frames would have gone nowhere (or into whatever file took fd 1)."""
    done = subprocess.run(_sh([*CASTOR, "serve", "--stdio"], ">&-"), env=_env(tmp_path), cwd=str(tmp_path),
                          stdin=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=60)
    assert done.returncode == 2
    assert done.stderr.startswith("castor: invalid_params: --stdio") and done.stderr.count("\n") == 1, done.stderr


def _to_a_gone_reader(argv: list[str], tmp_path: Path) -> subprocess.CompletedProcess[str]:
    """``argv`` with stdout a pipe whose reader has already gone (``| head`` done reading)."""
    read_end, write_end = os.pipe()
    os.close(read_end)
    try:
        return subprocess.run(argv, env=_env(tmp_path), cwd=str(tmp_path), stdout=write_end,
                              stderr=subprocess.PIPE, text=True, timeout=60)
    finally:
        os.close(write_end)


def test_a_reader_that_goes_away_ends_every_command_quietly(tmp_path):
    """The materia commands said ``castor: storage_unavailable: Broken pipe (EPIPE)`` and exited 1,
    as if a disk had failed; ``castor inspect``'s table exited 1 without a word."""
    sock = tmp_path / "castor.sock"
    server = subprocess.Popen([*CASTOR, "serve", "--socket", str(sock)], env=_env(tmp_path), cwd=str(tmp_path),
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_for(sock.exists, timeout=30, what="the socket")
        for argv in (["grid"], ["casts"], ["casts", "--json"], ["loadout"],
                     ["inspect", "--socket", str(sock)], ["inspect", "--socket", str(sock), "--json"]):
            done = _to_a_gone_reader([*CASTOR, *argv], tmp_path)
            assert (done.returncode, done.stderr) == (0, ""), argv
    finally:
        server.send_signal(signal.SIGTERM)
        server.wait(30)


def test_a_write_error_that_is_not_a_gone_reader_is_still_an_error(tmp_path):
    done = subprocess.run([*CASTOR, "grid"], env=_env(tmp_path), cwd=str(tmp_path), stdout=open(os.devnull, "w")
                          if not os.path.exists("/dev/full") else open("/dev/full", "w"),
                          stderr=subprocess.PIPE, text=True, timeout=60)
    if os.path.exists("/dev/full"):
        assert done.returncode == 1 and done.stderr.startswith("castor: storage_unavailable: "), done.stderr

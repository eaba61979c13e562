"""The CLI against real processes: serve (stdio EOF, socket), inspect, and the error contract."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from castor.client import Client
from tests.support.processes import killed_on_exit
from tests.support.waiting import wait_for

pytestmark = pytest.mark.timeout(60)

CASTOR = [sys.executable, "-m", "castor"]


def _env(tmp_path: Path) -> dict[str, str]:
    env = dict(os.environ)
    env["HOME"] = str(tmp_path / "home")  # no user profile config, no Pi settings
    (tmp_path / "home").mkdir(exist_ok=True)  # a user's home exists (a TCP serve keeps its token under it)
    env.pop("XDG_RUNTIME_DIR", None)
    env["PI_CODING_AGENT_DIR"] = str(tmp_path / "home" / ".pi" / "agent")
    env.pop("MATERIA_CONFIG", None)
    return env


def test_stdio_eof_shuts_down_gracefully_and_leaves_the_cast_resumable(tmp_path):
    project = tmp_path / "project"
    project.mkdir()
    client = Client.spawn_stdio([*CASTOR, "serve", "--stdio"], env=_env(tmp_path), cwd=str(project),
                                stderr=subprocess.DEVNULL)
    turns: list[dict] = []
    client.on_notification("agent.run_turn", turns.append)  # a harness that never answers
    client.on_request("session.append_entry", lambda p: {"ok": True, "entry_id": "e"})
    client.call("session.open", {"session_id": "s1", "cwd": str(project), "trusted": True}, timeout=20)
    client.call("loadout.set", {"session_id": "s1", "cwd": str(project), "name": "hello"}, timeout=20)
    started = client.call("cast.start", {"session_id": "s1", "cwd": str(project), "request": "say hi"}, timeout=20)
    cast_id = started.get("cast_id") or started.get("cast", {}).get("cast_id")
    assert cast_id
    wait_for(timeout=20.0, predicate=lambda: turns)  # the cast is mid-turn now
    process = client.process
    client.close(wait_process=20)  # closes stdin: EOF
    assert process.wait(20) == 0
    listed = subprocess.run([*CASTOR, "casts", "--cwd", str(project), "--json"], env=_env(tmp_path),
                            capture_output=True, text=True, timeout=30)
    assert listed.returncode == 0, listed.stderr
    rows = json.loads(listed.stdout)
    row = next(r for r in rows if r.get("cast_id") == cast_id)
    assert row.get("resumable") is True


def test_serve_on_a_socket_and_inspect_it_live(tmp_path):
    sock = tmp_path / "castor.sock"
    server = subprocess.Popen([*CASTOR, "serve", "--socket", str(sock)], env=_env(tmp_path),
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        wait_for(timeout=20.0, predicate=sock.exists)
        with Client.connect_unix(str(sock)) as client:
            client.call("session.open", {"session_id": "watch", "cwd": str(tmp_path)}, timeout=20)
            shown = subprocess.run([*CASTOR, "inspect", "--socket", str(sock), "actors"], env=_env(tmp_path),
                                   capture_output=True, text=True, timeout=30)
            assert shown.returncode == 0, shown.stderr
            assert "watch" in shown.stdout and "depth=" in shown.stdout and "oldest=" in shown.stdout
            raw = subprocess.run([*CASTOR, "inspect", "--socket", str(sock), "mailbox", "/root/session/watch",
                                  "--json"], env=_env(tmp_path), capture_output=True, text=True, timeout=30)
            assert raw.returncode == 0, raw.stderr
            assert json.loads(raw.stdout)["path"] == "/root/session/watch"
            missing = subprocess.run([*CASTOR, "inspect", "--socket", str(sock), "mailbox", "/root/nope"],
                                     env=_env(tmp_path), capture_output=True, text=True, timeout=30)
            assert missing.returncode != 0 and missing.stderr.strip().startswith("castor: not_found")
    finally:
        server.send_signal(signal.SIGTERM)
        assert server.wait(20) == 0
    assert not sock.exists()


def test_sigterm_with_sessions_open_closes_them_once_and_logs_no_failure(tmp_path):
    """``castor serve`` stopping closes every session while its connection is still open (the
    harness hears its turns stop); the connection's own close then finds the session gone. That is
    the normal way down, not a failure: it used to log "closing SID after disconnect failed" with a
    ``not_found`` traceback for every session of every connection at each SIGTERM."""
    sock = tmp_path / "castor.sock"
    project = tmp_path / "project"
    project.mkdir()
    server = subprocess.Popen([*CASTOR, "serve", "--socket", str(sock)], env=_env(tmp_path),
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    with killed_on_exit(server):
        wait_for(timeout=20.0, predicate=sock.exists)
        clients = [Client.connect_unix(str(sock)) for _ in range(2)]
        for n, client in enumerate(clients):
            for s in range(2):
                client.call("session.open", {"session_id": f"s{n}-{s}", "cwd": str(project)}, timeout=20)
        server.send_signal(signal.SIGTERM)
        assert server.wait(30) == 0
        for client in clients:
            client.close()
    stderr = server.stderr.read() if server.stderr else ""
    assert "failed" not in stderr and "Traceback" not in stderr and "WARNING" not in stderr, stderr


@pytest.mark.parametrize(
    "argv",
    [["serve", "--tcp", "10.1.2.3:9000"], ["inspect", "--socket", "/nonexistent/castor.sock"],
     ["status", "../../etc"]],
)
def test_errors_exit_non_zero_with_one_line_on_stderr(tmp_path, argv):
    done = subprocess.run([*CASTOR, *argv], env=_env(tmp_path), capture_output=True, text=True, timeout=30,
                          cwd=str(tmp_path))
    assert done.returncode != 0
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert len(lines) >= 1 and lines[-1].startswith("castor:"), done.stderr
    assert "Traceback" not in done.stderr


def test_validate_prints_each_problem_on_its_own_line_with_its_code(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text('{"loadouts": {"x": {"sockets": {"../evil": {"materia": "nope"}}}}, "activeLoadout": "x"}')
    done = subprocess.run([*CASTOR, "validate", str(bad)], env=_env(tmp_path), capture_output=True, text=True,
                          timeout=30)
    assert done.returncode != 0
    lines = [line for line in (done.stdout + done.stderr).splitlines() if line.strip()]
    assert len(lines) >= 2 and all(line.startswith("[") for line in lines), lines
    assert any("invalid-socket-id" in line for line in lines)
    missing = subprocess.run([*CASTOR, "validate", str(tmp_path / "none.json")], env=_env(tmp_path),
                             capture_output=True, text=True, timeout=30)
    assert missing.returncode != 0 and "file-not-found" in missing.stderr


def test_every_command_has_help():
    for command in ["serve", "inspect", "demo", "cast", "casts", "status", "recast", "revive", "grid",
                    "loadout", "validate"]:
        done = subprocess.run([*CASTOR, command, "--help"], capture_output=True, text=True, timeout=30)
        assert done.returncode == 0 and "usage: castor" in done.stdout, command


def test_a_non_loopback_tcp_host_is_forbidden_as_documented(tmp_path):
    done = subprocess.run([*CASTOR, "serve", "--tcp", "10.1.2.3:9000"], env=_env(tmp_path), capture_output=True,
                          text=True, timeout=30, cwd=str(tmp_path))
    assert done.returncode != 0 and done.stderr.strip().splitlines()[-1].startswith("castor: forbidden: ")


@pytest.mark.parametrize("argv", [["cast"], ["serve", "--tcp", "nope"], ["bogus"]])
def test_usage_errors_are_one_line_with_a_code_and_exit_2(tmp_path, argv):
    done = subprocess.run([*CASTOR, *argv], env=_env(tmp_path), capture_output=True, text=True, timeout=30,
                          cwd=str(tmp_path))
    assert done.returncode == 2
    assert len(done.stderr.strip().splitlines()) == 1 and done.stderr.startswith("castor: invalid_params: ")


@pytest.mark.parametrize("value", ["99999", "-1", "soon"])
def test_a_bad_memory_return_interval_is_a_usage_error_naming_the_flag(tmp_path, value):
    done = subprocess.run([*CASTOR, "serve", "--socket", str(tmp_path / "s.sock"), "--memory-return", value],
                          env=_env(tmp_path), capture_output=True, text=True, timeout=30, cwd=str(tmp_path))
    assert done.returncode == 2
    line = done.stderr.strip()
    assert len(line.splitlines()) == 1 and line.startswith("castor: invalid_params: argument --memory-return: ")
    assert not (tmp_path / "s.sock").exists()  # refused before anything listens


def test_actor_data_is_shown_as_text_never_as_markup():
    from rich.console import Console

    from castor.console.terminal import _actor_line

    actor = {"path": "/root/utility/slot-3", "kind": "UtilityExecutorActor", "state": "retired", "incarnation": 1,
             "restarts": 0, "retired_reason": "[/magenta] oops [bold]",
             "mailbox": {"depth": 0, "oldest_age_s": None, "processed": 1, "failed": 0, "in_flight": None}}
    console = Console(record=True, width=200)
    console.print(_actor_line(actor))  # raised MarkupError before
    assert "retired: [/magenta] oops [bold]" in console.export_text()


@pytest.mark.timeout(60)
def test_serve_exits_non_zero_when_its_runtime_fails_fatally(tmp_path):
    sock = tmp_path / "castor.sock"
    server = subprocess.Popen([*CASTOR, "serve", "--socket", str(sock), "--allow-faults"], env=_env(tmp_path),
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    with killed_on_exit(server):
        wait_for(timeout=20.0, predicate=sock.exists)
        with Client.connect_unix(str(sock)) as client:
            client.call("ops.fault", {"kind": "kill", "path": "/root"}, timeout=10)
        assert server.wait(30) == 1
        assert server.stderr.read().strip().splitlines()[-1].startswith("castor: internal: the runtime failed fatally")


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.parametrize("mode", ["socket", "tcp"])
def test_serve_prints_one_line_on_stderr_once_it_listens(tmp_path, mode):
    sock = tmp_path / "a dir" / "castor.sock"
    sock.parent.mkdir()
    port = _free_port()
    argv = ["--socket", str(sock)] if mode == "socket" else ["--tcp", f"127.0.0.1:{port}"]
    server = subprocess.Popen([*CASTOR, "serve", *argv], env=_env(tmp_path), stdout=subprocess.DEVNULL,
                              stderr=subprocess.PIPE, text=True)
    try:
        line = server.stderr.readline().rstrip("\n")  # blocks until the line is written (or EOF)
        if mode == "socket":
            assert line == f"castor serve: listening on unix:{sock}; token file: -; console: -"
            client = Client.connect_unix(str(sock))  # printed once it listens: a client connects right away
        else:  # TCP always has a token: the line names the file it is in (0600, removed at exit)
            prefix = f"castor serve: listening on tcp:127.0.0.1:{port}; token file: "
            assert line.startswith(prefix) and line.endswith("; console: -"), line
            token_file = line[len(prefix):-len("; console: -")]
            client = Client.connect_tcp("127.0.0.1", port, token_file=token_file)
        with client:
            assert client.call("ops.actors", {}, timeout=10)["actors"]
    finally:
        server.send_signal(signal.SIGTERM)
        assert server.wait(20) == 0
    assert "Traceback" not in server.stderr.read()


def test_serve_with_a_json_log_prints_its_serving_line_as_one_json_object(tmp_path):
    """With ``--log-json`` every stderr line is one JSON object, the serving line too: its text is the
    record's ``message`` (what a reader of the plain line matches), with where it listens in ``extra``."""
    sock = tmp_path / "castor.sock"
    server = subprocess.Popen([*CASTOR, "--log-json", "serve", "--socket", str(sock)], env=_env(tmp_path),
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        line = server.stderr.readline()
        record = json.loads(line)["record"]
        assert record["message"] == f"castor serve: listening on unix:{sock}; token file: -; console: -"
        assert record["extra"]["actor"] == "/endpoint" and record["extra"]["listening"] == f"unix:{sock}"
        assert record["level"]["name"] == "INFO"
        with Client.connect_unix(str(sock)) as client:
            assert client.call("ops.actors", {}, timeout=10)["actors"]
    finally:
        server.send_signal(signal.SIGTERM)
        assert server.wait(20) == 0
    for rest in server.stderr.read().splitlines():
        json.loads(rest)


def test_serve_stdio_says_stdio(tmp_path):
    """The line the docs show for ``--stdio``: ``listening on stdio`` (not a Unix path)."""
    server = subprocess.Popen([*CASTOR, "serve", "--stdio"], env=_env(tmp_path), stdin=subprocess.PIPE,
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        assert server.stderr.readline().rstrip("\n") == "castor serve: listening on stdio; token file: -; console: -"
    finally:
        server.stdin.close()  # EOF on stdin: the harness went away, castor exits
        assert server.wait(20) == 0


def test_inspect_without_the_token_says_which_flag_gives_it(tmp_path):
    """A server with a token: inspect without it is refused in one line naming --token-file (the
    endpoint's own words name runtime.hello, which an operator at a shell never types)."""
    sock = tmp_path / "castor.sock"
    server = subprocess.Popen([*CASTOR, "serve", "--socket", str(sock), "--require-token"], env=_env(tmp_path),
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        line = server.stderr.readline()
        token_file = line.split("token file: ", 1)[1].split(";", 1)[0]
        refused = subprocess.run([*CASTOR, "inspect", "--socket", str(sock)], env=_env(tmp_path),
                                 capture_output=True, text=True, timeout=30)
        assert refused.returncode == 1 and refused.stdout == ""
        assert refused.stderr.startswith("castor: unauthenticated: ") and refused.stderr.count("\n") == 1
        assert "--token-file PATH" in refused.stderr and "CASTOR_TOKEN_FILE" in refused.stderr
        shown = subprocess.run([*CASTOR, "inspect", "--socket", str(sock), "--token-file", token_file, "hosts"],
                               env=_env(tmp_path), capture_output=True, text=True, timeout=30)
        assert shown.returncode == 0 and "local" in shown.stdout, shown.stderr
    finally:
        server.send_signal(signal.SIGTERM)
        assert server.wait(20) == 0


@pytest.mark.timeout(60)
def test_serve_on_tcp_port_0_takes_a_free_port_and_its_line_names_it(tmp_path):
    """``--tcp 127.0.0.1:0`` was refused ("expected HOST:PORT"), so a script had to guess a free
    port and race others for it. Port 0 lets the kernel pick; the ready line names the port bound,
    and a client (``castor inspect`` too, which needs the real port) reaches it there."""
    server = subprocess.Popen([*CASTOR, "serve", "--tcp", "127.0.0.1:0"], env=_env(tmp_path),
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        line = server.stderr.readline().rstrip("\n")
        prefix = "castor serve: listening on tcp:127.0.0.1:"
        assert line.startswith(prefix), line
        port_text, _, rest = line[len(prefix):].partition("; token file: ")
        port, token_file = int(port_text), rest[:-len("; console: -")]
        assert 0 < port < 65536
        shown = subprocess.run([*CASTOR, "inspect", "--tcp", f"127.0.0.1:{port}", "--token-file", token_file,
                                "hosts"], env=_env(tmp_path), capture_output=True, text=True, timeout=30)
        assert shown.returncode == 0 and "local" in shown.stdout, shown.stderr
        refused = subprocess.run([*CASTOR, "inspect", "--tcp", "127.0.0.1:0"], env=_env(tmp_path),
                                 capture_output=True, text=True, timeout=30)
        assert refused.returncode == 2 and "--tcp" in refused.stderr, refused.stderr  # nothing listens on 0
    finally:
        server.send_signal(signal.SIGTERM)
        assert server.wait(20) == 0


def test_sighup_stops_serve_cleanly_unless_it_is_ignored(tmp_path):
    """A closed terminal (SIGHUP) killed ``castor serve`` outright: its sessions were never closed,
    and its socket and generated token file were left behind. It now stops as on SIGTERM; started
    with SIGHUP ignored (``nohup``) it keeps serving."""
    env = _env(tmp_path)
    run_dir = tmp_path / "home" / ".castor" / "run"
    server = subprocess.Popen([*CASTOR, "serve", "--tcp", "127.0.0.1:0"], env=env, stdout=subprocess.DEVNULL,
                              stderr=subprocess.PIPE, text=True)
    with killed_on_exit(server):
        line = server.stderr.readline()
        assert "listening on tcp:" in line, line
        assert list(run_dir.iterdir())  # the token file
        server.send_signal(signal.SIGHUP)
        assert server.wait(30) == 0
    assert list(run_dir.iterdir()) == []

    sock = tmp_path / "castor.sock"
    ignoring = subprocess.Popen([*CASTOR, "serve", "--socket", str(sock)], env=env, stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL,
                                preexec_fn=lambda: signal.signal(signal.SIGHUP, signal.SIG_IGN))
    with killed_on_exit(ignoring):
        wait_for(timeout=20.0, predicate=sock.exists)
        ignoring.send_signal(signal.SIGHUP)
        with Client.connect_unix(str(sock)) as client:
            assert client.call("runtime.hello", {}, timeout=20)["name"] == "castor"
        assert ignoring.poll() is None
        ignoring.send_signal(signal.SIGTERM)
        assert ignoring.wait(30) == 0
    assert not sock.exists()

"""Authenticated endpoints: ``castor serve --tcp`` (and ``--socket --require-token``) needs the token.

Every test drives a real ``python -m castor serve`` subprocess over real sockets with raw
msgpack (so nothing in castor's own client can hide a refusal) or ``castor.client``.
"""

from __future__ import annotations

import os
import re
import socket
import stat
import subprocess
import time
from pathlib import Path

import msgpack
import pytest

from castor.client import Client
from castor.messages.errors import Forbidden, MailboxFull, Unauthenticated
from tests.support.other_user import another_user_listening
from tests.support.processes import terminate_then_kill

from .conftest import RawPeer, castor_argv, serve_env, wait_until

pytestmark = pytest.mark.timeout(120)

MiB = 1 << 20
TOKEN_LINE = re.compile(r"castor serve: listening on \S+; token file: ([^;\s]+);")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class TcpServe:
    """``castor serve --tcp 127.0.0.1:PORT [extra]`` with its own HOME and XDG_RUNTIME_DIR."""

    def __init__(self, tmp: Path, *extra: str, env: dict[str, str] | None = None) -> None:
        self.port = free_port()
        self.env = {**serve_env(tmp), "XDG_RUNTIME_DIR": str(tmp / "xdg"), **(env or {})}
        (tmp / "xdg").mkdir(mode=0o700, exist_ok=True)
        self.stderr_path = tmp / f"serve-{self.port}.stderr"
        self._err = open(self.stderr_path, "wb")  # noqa: SIM115 - closed in stop()
        self.proc = subprocess.Popen(castor_argv("serve", "--tcp", f"127.0.0.1:{self.port}", *extra),
                                     env=self.env, cwd=str(tmp), stdin=subprocess.DEVNULL,
                                     stdout=subprocess.DEVNULL, stderr=self._err)
        wait_until(lambda: self._accepting() or self.proc.poll() is not None, 20, "the TCP port")
        assert self.proc.poll() is None, self.stderr_path.read_text()
        # The one line serve prints once it listens names the token file (it may trail the accept).
        wait_until(lambda: "castor serve: listening on" in self.stderr_path.read_text() or self.proc.poll() is not None,
                   20, "the serving line")
        found = TOKEN_LINE.search(self.stderr_path.read_text())
        self.token_file = found.group(1) if found else None

    def _accepting(self) -> bool:
        try:
            socket.create_connection(("127.0.0.1", self.port), timeout=0.5).close()
            return True
        except OSError:
            return False

    @property
    def token(self) -> str:
        assert self.token_file is not None
        return Path(self.token_file).read_text().strip()

    def raw(self) -> RawPeer:
        return RawPeer(socket.create_connection(("127.0.0.1", self.port), timeout=5))

    def client(self, **kwargs) -> Client:
        return Client.connect_tcp("127.0.0.1", self.port, default_timeout=10, **kwargs)

    def stop(self) -> int:
        terminate_then_kill(self.proc, 20)
        self._err.close()
        return self.proc.returncode


@pytest.fixture
def tcp_serve(tmp_path):
    servers: list[TcpServe] = []

    def start(*extra: str, **kwargs) -> TcpServe:
        server = TcpServe(tmp_path, *extra, **kwargs)
        servers.append(server)
        return server

    yield start
    for server in servers:
        server.stop()


def request(msgid: int, method: str, params: dict) -> bytes:
    return msgpack.packb([0, msgid, method, [params]], use_bin_type=True)


def responses(values: list) -> dict[int, list]:
    return {v[1]: v for v in values if isinstance(v, list) and len(v) == 4 and v[0] == 1}


# Plausible params for each method, so a refusal cannot be an invalid_params in disguise.
def _params_for(method: str, project: str) -> dict:
    if method == "session.open":
        return {"session_id": "intruder", "cwd": project, "trusted": True}
    if method == "ops.fault":
        return {"kind": "kill", "path": "/root/session"}
    if method == "ops.mailbox":
        return {"path": "/root"}
    if method.startswith(("cast.", "loadout.", "grid.", "config.", "icarus.", "session.", "harness.", "agent.")):
        return {"session_id": "intruder"}
    return {}


def test_an_unauthenticated_tcp_client_is_refused_on_every_method(tcp_serve, tmp_path):
    server = tcp_serve()
    # The token file: printed on stderr, 0600, in a 0700 directory of castor's user.
    assert server.token_file is not None, server.stderr_path.read_text()
    token_path = Path(server.token_file)
    assert token_path.is_relative_to(tmp_path / "xdg" / "castor")
    assert stat.S_IMODE(token_path.stat().st_mode) == 0o600
    assert stat.S_IMODE(token_path.parent.stat().st_mode) == 0o700
    assert len(server.token) >= 32

    with server.client(token=server.token) as good:
        catalog = good.hello_result["methods"]
    assert len(catalog) >= 20 and "session.open" in catalog and "config.validate" in catalog

    project = tmp_path / "project"
    project.mkdir()
    marker = tmp_path / "ran"
    (project / ".pi").mkdir()
    # A utility command a trusted session would run: it must never run for an intruder.
    (project / ".pi" / "pi-materia.json").write_text(f'{{"utility": ["sh", "-c", "touch {marker}"]}}')

    peer = server.raw()
    methods = [m for m in catalog if m != "runtime.hello"]
    for msgid, method in enumerate(methods, 1):
        peer.send(request(msgid, method, _params_for(method, str(project))))
    got = responses(peer.read(10, until=lambda vs: len(responses(vs)) >= len(methods)))
    assert sorted(got) == list(range(1, len(methods) + 1))
    codes = {methods[msgid - 1]: reply[2]["code"] for msgid, reply in got.items()}
    assert codes == {m: "unauthenticated" for m in methods}
    # A notification is dropped, not run; the connection is still open and the hello still works.
    peer.send(msgpack.packb([2, "harness.event", [{"session_id": "intruder", "event": "agent_end"}]]))
    peer.send(request(999, "runtime.hello", {"token": server.token}))
    hello = responses(peer.read(5, until=lambda vs: 999 in responses(vs)))[999]
    assert hello[2] is None and hello[3]["methods"] == catalog
    peer.close()

    with server.client(token=server.token) as good:
        sessions = good.call("ops.actors", {"prefix": "/root/session"})
    assert "intruder" not in str(sessions) and not marker.exists()
    print(f"methods tried unauthenticated and refused: {len(methods)}")


def test_a_wrong_token_is_refused_and_the_connection_closed_after_three_tries(tcp_serve):
    server = tcp_serve()
    wrong = "x" * len(server.token)
    peer = server.raw()
    for msgid, params in enumerate([{}, {"token": wrong}, {"token": server.token[:-1] + "?"}], 1):
        peer.send(request(msgid, "runtime.hello", params))
        reply = responses(peer.read(5, until=lambda vs, m=msgid: m in responses(vs)))[msgid]
        assert reply[2]["code"] == "unauthenticated"
        assert reply[2]["data"]["attempts_left"] == 3 - msgid
        assert server.token not in str(reply)
    peer.read(5)  # the server closes the connection after the third answer
    assert peer.eof
    peer.close()
    # castor.client raises the typed error; the right token still works on a new connection.
    with pytest.raises(Unauthenticated):
        server.client(token=wrong)
    with server.client(token=server.token) as good:
        assert good.call("ops.actors", {})["actors"]
    assert server.token not in server.stderr_path.read_text().replace(server.token_file, "")


def test_a_later_hello_with_a_wrong_token_is_refused_and_the_connection_stays_authenticated(tcp_serve):
    """A second ``runtime.hello`` on a connection the token opened was answered as the first, whatever
    token it offered: a peer could read that "ok" as "this token is good"."""
    server = tcp_serve()
    peer = server.raw()
    exchanges = [({"token": server.token}, None), ({"token": "x" * len(server.token)}, "unauthenticated"),
                 ({"token": server.token[:-1] + "?"}, "unauthenticated"), ({}, None),
                 ({"token": server.token}, None)]
    for msgid, (params, refused) in enumerate(exchanges, 1):
        peer.send(request(msgid, "runtime.hello", params))
        reply = responses(peer.read(5, until=lambda vs, m=msgid: m in responses(vs)))[msgid]
        if refused:
            assert reply[2]["code"] == refused and "stays authenticated" in reply[2]["message"], reply
            assert server.token not in str(reply)
        else:
            assert reply[2] is None and reply[3]["name"], reply
    # Still open and authenticated: two wrong tokens after the hello neither closed nor locked it.
    peer.send(request(99, "ops.actors", {}))
    reply = responses(peer.read(5, until=lambda vs: 99 in responses(vs)))[99]
    assert reply[2] is None and reply[3]["actors"], reply
    assert not peer.eof
    peer.close()


def test_the_token_file_is_removed_at_exit_and_a_given_token_file_is_used(tcp_serve, tmp_path):
    # A serve killed with -9 left its token file: the next serve removes it (its pid is gone).
    runtime_dir = tmp_path / "xdg" / "castor"
    runtime_dir.mkdir(parents=True, mode=0o700)
    (tmp_path / "xdg").chmod(0o700)
    dead = subprocess.Popen(["true"])
    dead.wait()
    stale = runtime_dir / f"serve-{dead.pid}-deadbeef.token"
    stale.write_text("stale-token-0123456789abcdef")
    alive = runtime_dir / f"serve-{os.getpid()}-cafebabe.token"  # a live pid: kept
    alive.write_text("live-token-0123456789abcdef")
    server = tcp_serve()
    token_file = Path(server.token_file)
    assert token_file.exists() and not stale.exists() and alive.exists()
    assert server.stop() == 0
    assert not token_file.exists()

    mine = tmp_path / "my.token"
    mine.write_text("a-token-of-mine-0123456789abcdef\n")
    mine.chmod(0o600)
    given = tcp_serve("--token-file", str(mine))
    assert given.token_file == str(mine)  # nothing generated: the line names the given file
    with given.client(token_file=str(mine)) as good:
        assert "ops.actors" in good.hello_result["methods"]
    with pytest.raises(Unauthenticated):
        given.client(token="a-token-of-mine-0123456789abcdeX")
    assert mine.exists()  # a given file is the user's: never removed
    # The environment names a token file too (for the server and for castor inspect).
    via_env = tcp_serve(env={"CASTOR_TOKEN_FILE": str(mine)})
    done = subprocess.run(castor_argv("inspect", "--tcp", f"127.0.0.1:{via_env.port}", "--json"),
                          env={**serve_env(tmp_path), "CASTOR_TOKEN_FILE": str(mine)}, capture_output=True,
                          text=True, timeout=30)
    assert done.returncode == 0 and '"actors"' in done.stdout, done.stderr
    done = subprocess.run(castor_argv("inspect", "--tcp", f"127.0.0.1:{via_env.port}", "--token-file", str(mine)),
                          env=serve_env(tmp_path), capture_output=True, text=True, timeout=30)
    assert done.returncode == 0, done.stderr
    done = subprocess.run(castor_argv("inspect", "--tcp", f"127.0.0.1:{via_env.port}"),
                          env=serve_env(tmp_path), capture_output=True, text=True, timeout=30)
    assert done.returncode == 1 and done.stderr.startswith("castor: unauthenticated: ")
    assert len(done.stderr.strip().splitlines()) == 1


@pytest.mark.parametrize("setup, expect", [
    ("symlinked-runtime-dir", "forbidden"),
    ("group-readable-token-file", "forbidden"),
    ("symlinked-token-file", "forbidden"),
    ("short-token-file", "invalid_config"),
    ("missing-token-file", "invalid_config"),
])
def test_unsafe_token_files_and_runtime_dirs_are_refused_with_one_line_and_exit_2(tmp_path, setup, expect):
    env = {**serve_env(tmp_path), "XDG_RUNTIME_DIR": str(tmp_path / "xdg")}
    (tmp_path / "xdg").mkdir()
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    argv = ["serve", "--tcp", f"127.0.0.1:{free_port()}"]
    token = tmp_path / "t.token"
    if setup == "symlinked-runtime-dir":
        (tmp_path / "xdg" / "castor").symlink_to(elsewhere)
    elif setup == "group-readable-token-file":
        token.write_text("z" * 40)
        token.chmod(0o640)
        argv += ["--token-file", str(token)]
    elif setup == "symlinked-token-file":
        (elsewhere / "real").write_text("z" * 40)
        (elsewhere / "real").chmod(0o600)
        token.symlink_to(elsewhere / "real")
        argv += ["--token-file", str(token)]
    elif setup == "short-token-file":
        token.write_text("short")
        token.chmod(0o600)
        argv += ["--token-file", str(token)]
    else:
        argv += ["--token-file", str(tmp_path / "nope.token")]
    done = subprocess.run(castor_argv(*argv), env=env, capture_output=True, text=True, timeout=30)
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"castor: {expect}: "), done.stderr
    assert os.listdir(elsewhere) in ([], ["real"])  # nothing written through the symlink


def test_a_unix_socket_may_require_the_token_too(tmp_path):
    path = str(tmp_path / "c.sock")
    env = {**serve_env(tmp_path), "XDG_RUNTIME_DIR": str(tmp_path / "xdg")}
    (tmp_path / "xdg").mkdir(mode=0o700)
    err = open(tmp_path / "err", "wb")  # noqa: SIM115 - the file outlives this block: the server writes to it
    proc = subprocess.Popen(castor_argv("serve", "--socket", path, "--require-token"), env=env,
                            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=err)
    try:
        wait_until(lambda: os.path.exists(path) or proc.poll() is not None, 20, "the socket")
        assert stat.S_IMODE(os.lstat(path).st_mode) == 0o600
        wait_until(lambda: TOKEN_LINE.search((tmp_path / "err").read_text()) is not None or proc.poll() is not None,
                   20, "the serving line")
        token_file = TOKEN_LINE.search((tmp_path / "err").read_text()).group(1)
        with Client.connect_unix(path, default_timeout=10) as anonymous:
            with pytest.raises(Unauthenticated):
                anonymous.call("ops.actors", {})
        with Client.connect_unix(path, default_timeout=10, token_file=token_file) as good:
            assert good.call("ops.actors", {})["actors"]
    finally:
        proc.terminate()
        proc.wait(20)
        err.close()


def test_stdio_refuses_token_flags(tmp_path):
    done = subprocess.run(castor_argv("serve", "--stdio", "--require-token"), env=serve_env(tmp_path),
                          capture_output=True, text=True, timeout=30, stdin=subprocess.DEVNULL)
    assert done.returncode == 2 and done.stderr.startswith("castor: invalid_params: ")


# --------------------------------------------------------------------------- who may say "trusted"


def test_trusted_is_granted_to_authenticated_peers_only(tcp_serve, tmp_path, socket_server):
    project = tmp_path / "proj"
    project.mkdir()
    server = tcp_serve()
    # Unauthenticated: refused before anything is opened (the catalog loop above covers it too).
    peer = server.raw()
    peer.send(request(1, "session.open", {"session_id": "t1", "cwd": str(project), "trusted": True}))
    assert responses(peer.read(5, until=lambda vs: 1 in responses(vs)))[1][2]["code"] == "unauthenticated"
    peer.close()
    # With the token: may assert trusted.
    with server.client(token=server.token) as good:
        good.on_request("ui.notify", lambda p: {"ok": True})
        opened = good.call("session.open", {"session_id": "t1", "cwd": str(project), "trusted": True})
        assert opened["session_id"] == "t1"
    # A Unix socket peer of castor's own user (SO_PEERCRED) may too, without a token.
    with socket_server.client() as local:
        local.on_request("ui.notify", lambda p: {"ok": True})
        assert local.call("session.open", {"session_id": "t2", "cwd": str(project), "trusted": True})


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to connect as another user")
def test_a_unix_socket_peer_of_another_user_is_refused_even_if_the_socket_mode_lets_it_in(tmp_path):
    import shutil
    import tempfile

    from .conftest import SocketServer

    reachable = Path(tempfile.mkdtemp(prefix="castor-peer-"))  # under /tmp: every parent is searchable
    reachable.chmod(0o755)
    socket_server = SocketServer(reachable)
    os.chmod(socket_server.path, 0o666)  # simulate a mistake: the mode alone would let anyone in
    try:
        _connect_as_nobody(socket_server)
    finally:
        socket_server.stop()
        shutil.rmtree(reachable, ignore_errors=True)


def test_a_unix_peer_of_another_user_never_makes_room_by_closing_the_user_s_connection(tmp_path):
    """With ``--require-token`` every connection starts unauthenticated, and a full endpoint made
    room by closing the oldest such one -- before it looked at who the newcomer was. A peer of
    another user (the socket's mode loosened) closed the user's own connection that had not said
    hello yet, and was refused only then. It is refused first now, and makes no room."""
    import shutil
    import tempfile

    from .conftest import SocketServer

    reachable = Path(tempfile.mkdtemp(prefix="castor-peer-"))
    reachable.chmod(0o755)
    socket_server = SocketServer(reachable, "--require-token", "--max-connections", "1", "--hello-timeout", "60")
    try:
        wait_until(lambda: TOKEN_LINE.search(socket_server.stderr_path.read_text()) is not None, 20,
                   "the serving line")
        token = Path(TOKEN_LINE.search(socket_server.stderr_path.read_text()).group(1)).read_text().strip()
        os.chmod(socket_server.path, 0o666)  # a mistake: the mode alone would let anyone in
        mine = RawPeer(socket.socket(socket.AF_UNIX, socket.SOCK_STREAM))
        mine.sock.connect(socket_server.path)
        mine.send(request(1, "ops.hosts", {}))  # accepted and answered (unauthenticated): it holds the slot
        assert mine.read(5, until=bool)
        _connect_as_nobody(socket_server)
        mine.send(request(2, "runtime.hello", {"token": token}))
        answered = responses(mine.read(5, until=lambda values: 2 in responses(values)))
        assert not mine.eof and answered[2][2] is None, answered
        mine.close()
    finally:
        socket_server.stop()
        shutil.rmtree(reachable, ignore_errors=True)


def _connect_as_nobody(socket_server) -> None:
    script = (
        "import os, socket, msgpack\n"
        "os.setgid(65534); os.setuid(65534)\n"
        f"s = socket.socket(socket.AF_UNIX); s.connect({socket_server.path!r}); s.settimeout(5)\n"
        "try:\n"
        "    s.sendall(msgpack.packb([0, 1, 'ops.actors', [{}]]))\n"
        "except BrokenPipeError:\n"
        "    pass  # already closed: what it was told is read below\n"
        "u = msgpack.Unpacker(raw=False)\n"
        "data = b''\n"
        "while True:\n"
        "    try:\n"
        "        chunk = s.recv(65536)\n"
        "    except ConnectionResetError:\n"
        "        break\n"
        "    if not chunk: break\n"
        "    u.feed(chunk)\n"
        "print([v for v in u])\n"
    )
    done = subprocess.run([os.sys.executable, "-c", script], capture_output=True, text=True, timeout=30,
                          env={**os.environ})
    assert done.returncode == 0, done.stderr
    assert "unauthenticated" in done.stdout and "'actors'" not in done.stdout
    assert socket_server.alive()


def test_check_trusted_assertion_refuses_a_connection_without_the_grant():
    from types import SimpleNamespace

    from castor.endpoint.auth import check_trusted_assertion

    check_trusted_assertion(False, SimpleNamespace(state={}))
    check_trusted_assertion(True, SimpleNamespace(state={"may_trust": True}))
    with pytest.raises(Forbidden) as refused:
        check_trusted_assertion(True, SimpleNamespace(state={}))
    assert refused.value.data["reason"] == "trust_not_allowed"


# --------------------------------------------------------------------------- fair slots


@pytest.mark.timeout(180)
def test_64_idle_connections_are_closed_by_the_idle_timeout_and_a_65th_is_served(tcp_serve):
    # 5 s: long enough that all 64 are still open when the 65th knocks, even on a loaded machine.
    server = tcp_serve("--idle-timeout", "5", "--hello-timeout", "60")
    idle = []
    for _ in range(64):
        client = server.client(token=server.token)  # authenticated, then silent
        idle.append(client)
    assert not any(c.closed for c in idle), "the connect phase outlasted the idle timeout; the lockout is not shown"
    # The slots are full: the next one is refused now ...
    locked_out = server.raw()
    refusal = locked_out.read(5)
    assert locked_out.eof and refusal and refusal[0][2][0]["code"] == "mailbox_full"
    locked_out.close()
    # ... and every idle one is closed by the idle timeout, with an error notification saying why.
    wait_until(lambda: all(c.closed for c in idle), 30, "the idle connections to be closed")
    reasons = {e.get("data", {}).get("reason") for c in idle for e in c.errors}
    assert reasons == {"idle_timeout"}
    for c in idle:
        c.close()
    with server.client(token=server.token) as the_65th:
        assert the_65th.call("ops.actors", {})["actors"]


def test_connections_that_never_say_hello_are_closed_by_the_hello_deadline(tcp_serve):
    server = tcp_serve("--hello-timeout", "0.5", "--idle-timeout", "off")
    peers = [server.raw() for _ in range(64)]
    for peer in peers:
        peer.send(request(1, "ops.actors", {}))  # busy, but never authenticated
    for peer in peers:
        values = peer.read(10)
        assert peer.eof, "a connection without hello outlived the deadline"
        notes = [v for v in values if v[0] == 2 and v[1] == "error"]
        assert notes and notes[-1][2][0]["data"]["reason"] == "hello_timeout"
        peer.close()
    with server.client(token=server.token) as served:
        assert served.call("ops.actors", {})["actors"]


def test_a_connection_holding_a_session_is_never_idle(tcp_serve, tmp_path):
    project = tmp_path / "proj"
    project.mkdir()
    server = tcp_serve("--idle-timeout", "2")  # room for connect + session.open on a loaded machine
    with server.client(token=server.token) as holder, server.client(token=server.token) as bystander:
        holder.on_request("ui.notify", lambda p: {"ok": True})
        holder.call("session.open", {"session_id": "held", "cwd": str(project)})
        wait_until(lambda: bystander.closed, 20, "the bystander's idle timeout")
        deadline = time.monotonic() + 4  # two idle timeouts more
        while time.monotonic() < deadline:
            assert not holder.closed
            time.sleep(0.1)
        assert holder.call("ops.actors", {})["actors"]


@pytest.mark.parametrize("mode, ok", [(0o777, False), (0o770, False), (0o1777, True), (0o755, True), (0o700, True)])
def test_a_socket_directory_others_may_write_to_is_refused(tmp_path, mode, ok):
    from castor.endpoint.listeners import bind_unix

    directory = tmp_path / "d"
    directory.mkdir()
    directory.chmod(mode)
    if ok:
        sock, _inode = bind_unix(str(directory / "c.sock"))
        sock.close()
        assert stat.S_IMODE(os.lstat(directory / "c.sock").st_mode) == 0o600
    else:
        with pytest.raises(Forbidden) as refused:
            bind_unix(str(directory / "c.sock"))
        assert refused.value.data["reason"] == "socket_dir_not_private"
        assert os.listdir(directory) == []
    done = subprocess.run(castor_argv("serve", "--socket", str(directory / "x.sock")), env=serve_env(tmp_path),
                          capture_output=True, text=True, timeout=30, stdin=subprocess.DEVNULL) if not ok else None
    if done is not None:
        assert done.returncode == 2 and done.stderr.startswith("castor: forbidden: ")
        assert len(done.stderr.strip().splitlines()) == 1


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to make a directory of another user")
@pytest.mark.parametrize("owner, mode, ok", [
    (54321, 0o700, False),  # another user's /run/user/UID, kept in the environment by `su`
    (None, 0o777, False),  # a directory every user may rename things in
    (None, 0o1777, True),  # sticky, like /tmp: nobody may rename castor's directory away
    (None, 0o700, True),
], ids=["another-users", "world-writable", "sticky", "private"])
def test_a_runtime_directory_under_one_another_user_may_write_to_is_refused(tmp_path, owner, mode, ok):
    """castor checked its own ``$XDG_RUNTIME_DIR/castor`` but not the directory above it: under
    another user's runtime directory (or one every user may write), that user could swap castor's
    for a link or a directory of theirs between its check and the token file's creation. Now it
    gets the socket directory's rule: refused with one line, exit 2, nothing made there."""
    xdg = tmp_path / "xdg"
    xdg.mkdir()
    xdg.chmod(mode)
    if owner is not None:
        os.chown(xdg, owner, owner)
    env = {**serve_env(tmp_path), "XDG_RUNTIME_DIR": str(xdg)}
    if ok:
        server = TcpServe(tmp_path, env=env)
        try:
            assert server.token_file and server.token_file.startswith(str(xdg / "castor") + "/")
        finally:
            server.stop()
        return
    done = subprocess.run(castor_argv("serve", "--tcp", f"127.0.0.1:{free_port()}"), env=env,
                          capture_output=True, text=True, timeout=30)
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("castor: forbidden: "), done.stderr
    assert str(xdg) in lines[0] and "XDG_RUNTIME_DIR" in lines[0], lines
    assert os.listdir(xdg) == []


def test_the_runtime_directory_falls_back_to_home_when_xdg_runtime_dir_is_missing(tmp_path, monkeypatch):
    from castor.endpoint.auth import new_token_file, runtime_dir

    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    directory = runtime_dir({"XDG_RUNTIME_DIR": str(tmp_path / "gone")})
    assert directory == str(home / ".castor" / "run")
    assert stat.S_IMODE(os.stat(directory).st_mode) == 0o700
    assert stat.S_IMODE(os.stat(home / ".castor").st_mode) == 0o700
    token, path = new_token_file(directory)
    assert Path(path).read_text().strip() == token and stat.S_IMODE(os.stat(path).st_mode) == 0o600


@pytest.mark.parametrize("mode, ok", [(0o777, False), (0o775, False), (0o1777, True), (0o755, True)])
def test_a_socket_under_an_ancestor_others_may_write_to_is_refused(tmp_path, mode, ok):
    """The socket's own directory is private, but one above it is not: whoever may write there can
    rename the private directory away and put one of theirs, with their listener, in its place (and
    a client would send that listener its token)."""
    from castor.endpoint.listeners import bind_unix

    shared = tmp_path / "shared"
    private = shared / "sub"
    private.mkdir(parents=True)
    private.chmod(0o700)
    shared.chmod(mode)
    if ok:
        sock, _inode = bind_unix(str(private / "c.sock"))
        sock.close()
        return
    with pytest.raises(Forbidden) as refused:
        bind_unix(str(private / "c.sock"))
    assert refused.value.data == {"path": str(shared), "reason": "socket_dir_not_private"}
    assert os.listdir(private) == []
    # reached through a link of this user's that points into the shared directory: the same answer
    link = tmp_path / "link"
    link.symlink_to(private)
    with pytest.raises(Forbidden):
        bind_unix(str(link / "c.sock"))


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to give a directory to another user")
def test_a_socket_under_another_users_directory_is_refused(tmp_path):
    theirs = tmp_path / "theirs"
    private = theirs / "sub"
    private.mkdir(parents=True)
    private.chmod(0o700)
    os.chown(theirs, 54321, 54321)
    done = subprocess.run(castor_argv("serve", "--socket", str(private / "c.sock"), "--require-token"),
                          env=serve_env(tmp_path), capture_output=True, text=True, timeout=30, stdin=subprocess.DEVNULL)
    assert done.returncode == 2 and done.stderr.startswith("castor: forbidden: ")
    assert "belongs to another user" in done.stderr
    assert os.listdir(private) == []


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to plant a file as another user")
@pytest.mark.parametrize("planted", ["stale-socket", "live-socket", "file"])
def test_a_socket_path_another_user_planted_is_refused_before_anything_starts(tmp_path, planted):
    """In a shared sticky directory (``/tmp``, which ``--socket`` accepts) another user may take the
    socket's path first. castor then probed their file: a socket it may not connect to read
    ``conflict: cannot probe existing socket …: [Errno 13] Permission denied`` once the runtime had
    started (exit 1), and a root castor replaced another user's stale socket without a word. The
    path is now refused before anything starts (``conflict``, exit 2) naming whose it is, and the
    planted file is left as it was."""
    import socket as socket_module

    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o1777)
    path = shared / "castor.sock"
    listener = None
    if planted == "file":
        path.write_text("theirs")
    else:
        listener = socket_module.socket(socket_module.AF_UNIX, socket_module.SOCK_STREAM)
        listener.bind(str(path))
        if planted == "live-socket":
            listener.listen(1)
        else:
            listener.close()
    os.lchown(path, 54321, 54321)
    inode = path.lstat().st_ino
    try:
        done = subprocess.run(castor_argv("serve", "--socket", str(path)), env=serve_env(tmp_path),
                              capture_output=True, text=True, timeout=30, stdin=subprocess.DEVNULL)
    finally:
        if listener is not None:
            listener.close()
    assert done.returncode == 2, (done.returncode, done.stderr)
    assert done.stderr.startswith("castor: conflict: ") and len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert "another user" in done.stderr and "54321" in done.stderr, done.stderr
    assert path.lstat().st_ino == inode and path.lstat().st_uid == 54321


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to make a socket of another user")
def test_castor_never_unlinks_another_users_socket_that_took_its_inode_number(tmp_path):
    """At exit castor removed the file at its socket's path when the inode number matched its
    own. Once castor's file is gone (a ``/tmp`` cleaner, a hand), that number is free, and another
    user's live socket bound at the path since may get it: castor unlinked it. Now the file must
    also be a socket of castor's user."""
    import shutil
    import tempfile

    from castor.endpoint.listeners import unlink_if_ours

    shared = Path(tempfile.mkdtemp(prefix="castor-shared-", dir="/tmp"))  # the other user must reach it
    shared.chmod(0o1777)
    path = shared / "castor.sock"
    try:
        with another_user_listening(path, uid=54321):
            reused = path.lstat().st_ino  # as if castor's own socket had had this number
            unlink_if_ours(str(path), reused)
            assert path.lstat().st_ino == reused and path.lstat().st_uid == 54321
    finally:
        shutil.rmtree(shared, ignore_errors=True)


def test_connections_that_never_say_hello_cannot_lock_a_token_holder_out(tcp_serve):
    """Anyone on the machine can connect: 64 connections that never authenticate (and reconnect
    when closed) filled every slot, so the token holder was refused. Full, the endpoint makes room
    by closing the oldest connection that has not authenticated; authenticated ones keep theirs."""
    server = tcp_serve("--hello-timeout", "60", "--idle-timeout", "off")
    squatters = [server.raw() for _ in range(64)]
    for msgid, peer in enumerate(squatters):  # answered `unauthenticated`: each holds a slot now
        peer.send(request(msgid, "ops.actors", {}))
        assert peer.read(5, until=lambda values: bool(values))
    with server.client(token=server.token) as holder:
        assert holder.call("ops.actors", {})["actors"]
    oldest = squatters[0].read(5)
    assert squatters[0].eof and any(v[0] == 2 and v[2][0].get("code") == "unauthenticated" for v in oldest), oldest
    for peer in squatters[-3:]:  # the newest keep their slots (only the oldest made room)
        peer.read(0.1)
        assert not peer.eof
    for peer in squatters:
        peer.close()


def test_a_connection_before_hello_cannot_make_castor_buffer_a_big_frame(tcp_serve):
    """The protocol's frames go up to 16 MiB; before a connection has authenticated it may send
    64 KiB at most (a hello is a few hundred bytes): 60 connections each sending most of a 16 MiB
    frame made the server grow by a gigabyte. After the hello, the full limits apply."""
    server = tcp_serve("--hello-timeout", "60")
    peer = server.raw()
    peer.send(b"\xc6" + (1 << 20).to_bytes(4, "big") + b"x" * (200 * 1024))  # the start of a 1 MiB bin frame
    values = peer.read(5)
    assert peer.eof and values and values[-1][2][0]["code"] == "invalid_frame", values
    with server.client(token=server.token) as holder:
        big = "x" * (1 << 20)
        with pytest.raises(Exception) as refused:  # the call is answered (an unknown actor), not cut off
            holder.call("ops.mailbox", {"path": "/root/" + big})
        assert getattr(refused.value, "code", None) in ("not_found", "forbidden", "invalid_params")
        assert holder.call("ops.actors", {})["actors"]


def test_small_frames_pipelined_before_the_hello_are_each_answered_not_taken_for_one_big_frame(tcp_serve):
    """The 64 KiB cap before the hello bounds one frame. 300 requests of about 1 KiB in one write
    were read in 64 KiB chunks and a chunk ending inside a frame counted the whole frames before it
    as part of that frame: the connection was closed as "frame exceeds the size limit" after some
    60 answers. Each gets its ``unauthenticated`` now, and the hello still works after them."""
    server = tcp_serve("--hello-timeout", "60")
    peer = server.raw()
    frames = [request(msgid, "cast.list", {"session_id": "s", "pad": "x" * 1000}) for msgid in range(1, 301)]
    assert max(map(len, frames)) < 1100 and sum(map(len, frames)) > 4 * 64 * 1024
    peer.send(b"".join(frames))
    got = responses(peer.read(20, until=lambda vs: len(responses(vs)) >= 300))
    assert sorted(got) == list(range(1, 301)) and not peer.eof
    assert {reply[2]["code"] for reply in got.values()} == {"unauthenticated"}
    peer.send(request(999, "runtime.hello", {"token": server.token}))
    assert responses(peer.read(5, until=lambda vs: 999 in responses(vs)))[999][2] is None
    peer.close()


def test_a_frame_just_under_the_limit_and_the_next_in_one_write_are_both_answered(tcp_serve):
    """After the hello a frame may be 16 MiB: one just under it, with the start of the next frame in
    the same read, was refused as over the limit (and the connection closed)."""
    server = tcp_serve()
    peer = server.raw()
    peer.send(request(1, "runtime.hello", {"token": server.token}))
    assert responses(peer.read(5, until=lambda vs: 1 in responses(vs)))[1][2] is None
    half = 8 * MiB - 64  # a string may be 8 MiB
    shell = request(2, "no.such.method", {"a": "", "b": ""})
    big = request(2, "no.such.method", {"a": "x" * half, "b": "x" * (16 * MiB - len(shell) - half - 64)})
    assert 16 * MiB - 100 < len(big) <= 16 * MiB
    peer.send(big + request(3, "no.such.method", {"pad": "y" * 60_000}))
    values = peer.read(20, until=lambda vs: {2, 3} <= responses(vs).keys())
    got = responses(values)
    codes = {msgid: reply[2]["code"] for msgid, reply in got.items()}
    assert codes == {2: "unknown_method", 3: "unknown_method"}, values
    assert not peer.eof
    peer.send(request(4, "no.such.method", {"a": "z" * half, "b": "z" * half, "c": "z" * 1000}))  # over: refused
    values = peer.read(20)
    assert peer.eof and any(v[0] == 2 and v[2][0]["code"] == "invalid_frame" for v in values), values[-2:]
    peer.close()


def test_notifications_before_the_hello_cannot_flood_or_forge_the_log(tcp_serve):
    """Each notification refused before the hello was a warning line with the peer's method name in
    it, as sent: anyone on the machine could grow the log by twice what they sent, and a newline in
    the name planted a line that read as castor's own. Refused notifications are dropped quietly now,
    and no peer text starts a line of the log."""
    server = tcp_serve("--hello-timeout", "60")
    before = server.stderr_path.read_text()
    peer = server.raw()
    forged = "x\n00:00:00.000 INFO     - castor endpoint stopping: signal SIGTERM (FORGED)"
    for _ in range(300):
        peer.send(msgpack.packb([2, forged + "y" * 2000, [{}]]))
    peer.send(request(1, "runtime.hello", {"token": server.token}))
    assert responses(peer.read(10, until=lambda vs: 1 in responses(vs)))[1][2] is None
    peer.send(msgpack.packb([2, forged, [{}]]))  # authenticated: an unknown method is worth a line
    peer.send(request(2, "ops.actors", {}))
    assert responses(peer.read(10, until=lambda vs: 2 in responses(vs)))[2][2] is None
    wait_until(lambda: "FORGED" in server.stderr_path.read_text(), 10, "the authenticated peer's warning")
    added = server.stderr_path.read_text()[len(before):]
    assert len(added) < 2000, added[:2000]
    assert not [line for line in added.splitlines() if "FORGED" in line and not line.split(" ")[1] == "WARNING"]
    assert all("SIGTERM (FORGED)" not in line or "\\n" in line for line in added.splitlines())
    peer.close()


def test_connections_without_the_token_cannot_fill_the_log_by_closing_badly(tcp_serve):
    """Each connection a peer without the token closed badly was a warning line: bytes that are not
    msgpack ("undecodable input, closing"), or a request followed by a reset before its refusal
    could be written ("write failed: Connection reset by peer"). Anyone on the machine could grow
    the log by a line per connect, hundreds a second. Before the hello those closes are debug
    lines now (counted as ever); an authenticated peer's still warn."""
    import struct

    server = tcp_serve("--hello-timeout", "60")
    before = server.stderr_path.read_text()
    for n in range(40):
        peer = socket.create_connection(("127.0.0.1", server.port), timeout=10)
        if n % 2:
            peer.sendall(b"\xc1" * 16)  # never msgpack: undecodable, the connection is closed
            peer.settimeout(10)
            while peer.recv(4096):
                pass
        else:
            peer.sendall(request(1, "cast.start", {}))
            peer.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))  # close = reset
        peer.close()
    # The token holder, last: its own undecodable bytes still warn (castor's log is where a broken
    # client of the user's shows up).
    owner = server.raw()
    owner.send(request(1, "runtime.hello", {"token": server.token}))
    assert responses(owner.read(10, until=lambda vs: 1 in responses(vs)))[1][2] is None
    owner.send(b"\xc1")
    wait_until(lambda: "undecodable" in server.stderr_path.read_text()[len(before):], 10, "the owner's warning")
    added = server.stderr_path.read_text()[len(before):]
    assert len(added.splitlines()) <= 2, added[:3000]
    owner.close()


def test_connections_refused_because_the_endpoint_is_full_cannot_fill_the_log(tcp_serve):
    """With every slot held by authenticated clients (a serve started with ``--max-connections 1``
    and its harness connected: nobody left to evict), each further connect was refused with a
    warning line: anyone on the machine could grow castor's log by a line per connect, hundreds a
    second, without the token. Each newcomer is still refused (``mailbox_full``, closed) but the
    log says so once, then how many more were refused, at most once every few seconds."""
    server = tcp_serve("--max-connections", "1", "--hello-timeout", "60")
    before = server.stderr_path.read_text()
    held: list[Client] = []

    def holder_in() -> bool:  # the start-up's probe connects may hold the one slot a moment longer
        try:
            held.append(server.client(token_file=server.token_file))
            return True
        except MailboxFull:
            return False

    wait_until(holder_in, 20, "the one slot for the token holder")  # (a refusal it met counts below)
    owner = held[0]
    for _ in range(120):
        with socket.create_connection(("127.0.0.1", server.port), timeout=10) as peer:
            peer.settimeout(10)
            told = b""
            while chunk := peer.recv(4096):
                told += chunk
            assert b"mailbox_full" in told, told  # the refusal itself is unchanged
    added = server.stderr_path.read_text()[len(before):]
    assert 1 <= len([line for line in added.splitlines() if "refused" in line]) <= 2, added[:3000]
    assert owner.call("ops.hosts", {}) == {"backend": "local", "hosts": []}  # the holder is served as ever
    owner.close()


def test_a_peer_without_the_token_gets_refusals_no_larger_than_its_asks(tcp_serve):
    """A refusal used to repeat the method it refused twice (message and data): a 60 KB name, the
    most a peer without the token may send in one frame, came back as 120 KB, and a peer that sent
    such requests without reading its answers made castor queue up to 32 MiB for it, per slot. The
    name is echoed cut short now, and castor queues at most 256 KiB for a peer that has not
    authenticated: over it, the connection is closed."""
    server = tcp_serve()
    peer = server.raw()
    peer.send(request(1, "m" * 60_000, {}))
    [answer] = peer.read(until=lambda values: len(values) >= 1)
    assert answer[2]["code"] == "unauthenticated"
    assert len(msgpack.packb(answer)) < 1024 and "(60000 characters)" in answer[2]["message"]
    peer.close()



def test_a_peer_without_the_token_that_does_not_read_is_closed_at_256_kib_queued(tmp_path):
    """Refusals a peer without the token does not read are queued for it up to 256 KiB, not the
    32 MiB (or 10,000 answers) an authenticated peer may have: over it castor closes the
    connection. On a Unix socket (its buffers do not grow) ~2.4 MB of refusals are asked for."""
    import select

    from .conftest import SocketServer

    server = SocketServer(tmp_path, "--require-token")
    try:
        flood = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        flood.connect(server.path)
        asks = b"".join(request(i, "x" * 64, {}) for i in range(9_500))
        flood.settimeout(10)
        try:
            flood.sendall(asks)  # nothing read meanwhile
        except OSError:
            pass  # castor closed it mid-way: what is asserted below
        watch = select.poll()
        watch.register(flood, select.POLLRDHUP | select.POLLHUP)
        assert watch.poll(15_000), "castor still holds the connection of a peer that reads none of its refusals"
        flood.close()
        wait_until(lambda: TOKEN_LINE.search(server.stderr_path.read_text()), 10, "the serving line")
        token = Path(TOKEN_LINE.search(server.stderr_path.read_text()).group(1)).read_text().strip()
        with Client.connect_unix(server.path, token=token, default_timeout=10) as mine:  # still served
            assert mine.call("ops.actors", {})
    finally:
        server.stop()


def test_an_unknown_method_of_eight_mebibytes_is_answered_in_a_frame_the_client_can_read(tcp_serve):
    """The longest string castor accepts (8 MiB) as a method name used to come back twice in the
    unknown_method answer: a frame over the limits castor's own client reads, so the client's
    connection was lost. Any error echoes what was sent cut short."""
    server = tcp_serve()
    with server.client(token=server.token) as client:
        from castor.messages.errors import UnknownMethod

        with pytest.raises(UnknownMethod) as refused:
            client.call("m" * (8 * MiB - 64), {}, timeout=30)
        assert len(refused.value.message) < 1024
        with pytest.raises(Exception) as missing:  # an 8 MiB id in a not_found answer: cut the same way
            client.call("ops.worker", {"session_id": "s" * (4 * MiB)}, timeout=30)
        assert len(str(missing.value)) < 64 * 1024
        assert client.call("ops.actors", {})  # the same connection, still served


@pytest.mark.timeout(30)
def test_a_token_file_that_does_not_fit_is_removed_and_named_in_the_error(tmp_path, monkeypatch):
    """`castor serve --tcp` with its runtime directory on a full disk said only
    ``castor: storage_unavailable: No space left on device (ENOSPC)`` -- no file named -- and left
    an empty token file behind. The half-made file is removed and the error names it."""
    import errno

    from castor.cli.common import os_error_code, os_error_text
    from castor.endpoint import auth

    real_write = os.write

    def full(fd: int, data: bytes) -> int:
        if os.readlink(f"/proc/self/fd/{fd}").startswith(str(tmp_path)):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return real_write(fd, data)

    monkeypatch.setattr(os, "write", full)
    with pytest.raises(OSError) as failed:
        auth.new_token_file(str(tmp_path))
    monkeypatch.undo()
    assert list(tmp_path.iterdir()) == []
    assert str(os_error_code(failed.value)) == "storage_unavailable"
    text = os_error_text(failed.value)
    assert text.startswith(str(tmp_path) + "/serve-"), text
    assert text.endswith(".token: No space left on device (ENOSPC)"), text


@pytest.mark.timeout(30)
def test_a_runtime_directory_that_cannot_be_made_on_a_full_disk_is_storage_unavailable(tmp_path, monkeypatch):
    """`castor serve --tcp` whose runtime directory could not be made for a full (or read-only)
    disk said ``castor: invalid_config: cannot create the runtime directory …`` and exit 2, as if a
    flag were wrong, while the token file's own write on the same disk said
    ``storage_unavailable``. Both are the disk's now: the OS error, the directory named, its errno."""
    import errno

    from castor.cli.common import os_error_code, os_error_text
    from castor.endpoint import auth

    real_mkdir = os.mkdir
    xdg = tmp_path / "xdg"
    xdg.mkdir()

    def full(path, *args, **kwargs):
        if str(path).startswith(str(xdg)):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path))
        return real_mkdir(path, *args, **kwargs)

    monkeypatch.setattr(os, "mkdir", full)
    with pytest.raises(OSError) as failed:
        auth.runtime_dir({"XDG_RUNTIME_DIR": str(xdg)})
    monkeypatch.undo()
    assert os_error_code(failed.value) == "storage_unavailable"
    assert os_error_text(failed.value, cwd=str(tmp_path)) == "xdg/castor: No space left on device (ENOSPC)"

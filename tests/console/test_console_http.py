"""The console and /metrics over real HTTP against a real ``castor serve --console``."""

from __future__ import annotations

import contextlib
import http.client
import io
import json
import socket
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

import pytest

from castor.client import Client
from castor.messages.errors import CastorError
from tests.console.conftest import TOKEN_FILES, TOKENS, serve_env, start_console, stop
from tests.support.waiting import wait_for

if TYPE_CHECKING:
    from castor.console.server import ConsoleServer

pytestmark = pytest.mark.timeout(90)


def _auth(url: str, headers: dict[str, str] | None = None) -> dict[str, str]:
    """``headers`` plus the console's own token (see conftest.TOKENS), unless the test sends its
    own credentials (a header, a cookie, ``?token=``)."""
    headers = dict(headers or {})
    if "Authorization" in headers or "Cookie" in headers or "token=" in url:
        return headers
    for base, token in TOKENS.items():
        if url.startswith(base):
            headers["Authorization"] = f"Bearer {token}"
    return headers


def _get(url: str, headers: dict[str, str] | None = None) -> tuple[int, str, dict[str, str]]:
    request = urllib.request.Request(url, headers=_auth(url, headers))
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, response.read().decode(), dict(response.headers)
    except urllib.error.HTTPError as err:
        return err.code, err.read().decode(), dict(err.headers)


def _metric(text: str, name: str, **labels: str) -> float:
    want = name + ("{" + ",".join(f'{k}="{v}"' for k, v in labels.items()) + "}" if labels else "")
    for line in text.splitlines():
        if line.startswith(want + " "):
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"{want} not in /metrics")


def test_metrics_count_casts_visits_restarts_and_asks(busy_console):
    live = busy_console
    status, text, headers = _get(live.url + "metrics")
    assert status == 200 and headers["Content-Type"].startswith("text/plain; version=0.0.4")
    assert _metric(text, "castor_sessions") == 3
    assert _metric(text, "castor_actors", kind="CastActor", state="running") == 6
    assert sum(float(ln.rsplit(" ", 1)[1]) for ln in text.splitlines() if ln.startswith("castor_casts{")) == 6
    assert _metric(text, "castor_socket_visits_total") >= 6
    assert _metric(text, "castor_ask_seconds_count", kind="SessionActor") >= 6
    assert _metric(text, "castor_mailbox_depth", kind="CastActor") == 0
    sid, cast_id = "session-1", live.casts["session-1"][0]
    live.client.call("ops.fault", {"kind": "kill", "path": f"/root/session/{sid}/cast/{cast_id}"}, timeout=10)

    def restarted() -> float:
        text = _get(live.url + "metrics")[1]
        if 'castor_restarts_total{kind="CastActor"}' not in text:
            return 0.0  # not yet: the series appears with the first restart
        return _metric(text, "castor_restarts_total", kind="CastActor") >= 1 and \
            _metric(text, "castor_crashes_total", kind="CastActor")
    assert wait_for(restarted, timeout=10, what="the restart in /metrics") == 1


def test_the_cast_page_and_its_stream_carry_the_graph_feed_and_usage(busy_console):
    live = busy_console
    sid, cast_id = "session-2", live.casts["session-2"][1]
    status, page, _ = _get(f"{live.url}cast/{sid}/{cast_id}")
    assert status == 200 and 'class="socket current"' in page and "<svg" in page
    parsed = urlsplit(live.url)
    conn = http.client.HTTPConnection(parsed.hostname, parsed.port, timeout=10)
    conn.request("GET", f"/events/cast/{sid}/{cast_id}", headers=_auth(live.url))
    response = conn.getresponse()
    assert response.status == 200 and response.getheader("Content-Type").startswith("text/event-stream")
    line = b""
    while not line.startswith(b"data: "):
        line = response.fp.readline()
    doc = json.loads(line[6:])["full"]  # a stream starts with the whole document
    conn.close()
    assert doc["cast_id"] == cast_id and doc["current_socket"] and doc["active"] is True
    assert f'data-socket="{doc["current_socket"]}"' in doc["svg"]
    assert any(e["type"] for e in doc["events"]) and "tokens" in doc["usage"]
    assert doc["actor"]["activity"]["data"]["pending"] == "agent_turn"


def test_bad_paths_hosts_and_methods_are_refused(busy_console):
    live = busy_console
    # A bad id in a URL is a bad request (400, `invalid_params`), an unknown cast 404 -- its page
    # and its event stream alike (the stream used to answer 200 and push an error every second).
    assert _get(live.url + "cast/session-1/..")[0] in (400, 404)
    assert _get(live.url + "cast/session-1/no-such-cast")[0] == 404
    assert _get(live.url + "events/cast/session-1/no-such-cast")[0] == 404
    assert _get(live.url + "cast/bad%20id/x")[0] == 400
    assert _get(live.url + "cast/a%2Fb/x")[0] == 400
    assert _get(live.url + "events/cast/a%2Fb/x")[0] == 400
    assert _get(live.url + "nope")[0] == 404
    # A page elsewhere reaching the console by DNS rebinding sends its own Host: refused.
    status, _, headers = _get(live.url, {"Host": "attacker.example:80"})
    assert status == 403
    assert headers["Server"] == "castor-console", headers  # not the Python it runs on, to whoever asks
    parsed = urlsplit(live.url)
    conn = http.client.HTTPConnection(parsed.hostname, parsed.port, timeout=10)
    conn.request("POST", "/", body=b"x")
    assert conn.getresponse().status == 501
    conn.close()
    # Garbage on the socket does not take the console down.
    with socket.create_connection((parsed.hostname, parsed.port), timeout=5) as raw:
        raw.sendall(b"\x00\xff garbage\r\n\r\n")
        raw.recv(100)
    assert _get(live.url + "api/actors")[0] == 200


def test_a_token_file_guards_every_route(tmp_path):
    token = "t0ken-" + "x" * 26
    (tmp_path / "token").write_text(token + "\n")
    (tmp_path / "token").chmod(0o600)
    server, url, sock = start_console(tmp_path, "--console-token-file", str(tmp_path / "token"))
    try:
        for route in ("", "events", "api/actors", "metrics"):
            assert _get(url + route)[0] == 401, route
        assert _get(url + "metrics?token=wrong")[0] == 401
        assert _get(url + "metrics", {"Authorization": f"Bearer {token}"})[0] == 200
        status, _page, headers = _get(f"{url}?token={token}")
        assert status == 200 and "HttpOnly" in headers["Set-Cookie"] and "SameSite=Strict" in headers["Set-Cookie"]
        cookie = headers["Set-Cookie"].split(";")[0]
        assert _get(url + "api/actors", {"Cookie": cookie})[0] == 200
        assert _get(url + "api/actors", {"Cookie": "castor_console_token=nope"})[0] == 401
        # One keep-alive connection: a refused request after an admitted ?token= one carried the
        # token in its Set-Cookie (401 and 403 alike).
        parts = urlsplit(url)
        conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=10)
        conn.request("GET", f"/metrics?token={token}", headers={"Host": parts.netloc})
        first = conn.getresponse()
        first.read()
        assert first.status == 200 and first.getheader("Set-Cookie")
        for headers in ({"Host": parts.netloc}, {"Host": "evil.example"}):
            conn.request("GET", "/metrics", headers=headers)
            refused = conn.getresponse()
            refused.read()
            assert refused.status in (401, 403) and refused.getheader("Set-Cookie") is None, headers
        conn.close()
    finally:
        stop(server)


@pytest.mark.parametrize("argv, code", [
    (["--console", "10.0.0.1:8080"], "forbidden"),
    (["--console", "127.0.0.1:0", "--console-token-file", "/nonexistent/token"], "not_found"),
    (["--console-token-file", "x"], "invalid_params"),
])
def test_a_bad_console_setting_fails_the_command_before_it_listens(tmp_path, argv, code):
    import subprocess
    import sys

    sock = tmp_path / "s.sock"
    done = subprocess.run([sys.executable, "-m", "castor", "serve", "--socket", str(sock), *argv],
                          capture_output=True, text=True, timeout=30)
    assert done.returncode != 0 and done.stderr.strip().splitlines()[-1].startswith(f"castor: {code}:")
    assert not sock.exists()
    if code == "forbidden":  # a refused address is a usage error, as the endpoint's own --tcp
        assert done.returncode == 2


@pytest.mark.timeout(60)
@pytest.mark.parametrize("which", ["--console", "--tcp"])
def test_a_port_another_process_holds_is_a_conflict_naming_the_listener_and_the_address(tmp_path, which):
    """It read "storage_unavailable: Address already in use (EADDRINUSE)", naming neither the
    console (or the endpoint) nor the address."""
    import socket
    import subprocess
    import sys

    (tmp_path / "home").mkdir()
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        endpoint = ["--socket", str(tmp_path / "s.sock")] if which == "--console" else []
        done = subprocess.run([sys.executable, "-m", "castor", "serve", *endpoint, which, f"127.0.0.1:{port}"],
                              capture_output=True, text=True, timeout=30, env=serve_env(tmp_path))
    assert done.returncode == 1
    listener = "the console" if which == "--console" else "the castor endpoint"
    assert done.stderr.strip().splitlines()[-1] == (
        f"castor: conflict: {listener} cannot listen on 127.0.0.1:{port}: another process holds that address "
        "(choose another port, or 0 for a free one)")


def test_a_short_token_is_refused(tmp_path):
    import subprocess
    import sys

    (tmp_path / "token").write_text("short\n")
    (tmp_path / "token").chmod(0o600)
    done = subprocess.run([sys.executable, "-m", "castor", "serve", "--socket", str(tmp_path / "s.sock"),
                           "--console", "127.0.0.1:0", "--console-token-file", str(tmp_path / "token")],
                          capture_output=True, text=True, timeout=30)
    assert done.returncode != 0 and "castor: invalid_params:" in done.stderr


def _private(path: Path, text: str | bytes) -> Path:
    path.write_bytes(text.encode() if isinstance(text, str) else text)
    path.chmod(0o600)
    return path


@pytest.mark.parametrize("make, code, says", [
    (lambda d: _private(d / "t", "x" * 32).chmod(0o644) or d / "t", "forbidden", "readable by group or others"),
    (lambda d: (d / "link").symlink_to(_private(d / "t", "x" * 32)) or d / "link", "forbidden", "is a symlink"),
    (lambda d: (d / "dir").mkdir() or d / "dir", "forbidden", "not a regular file"),
    (lambda d: _private(d / "t", b"\xff" * 32), "invalid_params", "is not UTF-8 text"),
    (lambda d: d / "missing", "not_found", "does not exist"),
])
def test_a_console_token_file_others_could_read_or_plant_is_refused_before_a_runtime_starts(tmp_path, make, code,
                                                                                           says):
    """The console's token file gets the checks the endpoint's has: a 0644 one (or a link to one)
    was used, so every user of the machine could read the token and open the console; a bad one
    failed only after the runtime had started (exit 1, a path shown as "."). Now each is one line
    naming the file, exit 2, and nothing listens."""
    import subprocess
    import sys

    path = make(tmp_path)
    sock = tmp_path / "s.sock"
    done = subprocess.run([sys.executable, "-m", "castor", "serve", "--socket", str(sock), "--console", "127.0.0.1:0",
                           "--console-token-file", str(path)], capture_output=True, text=True, timeout=30)
    last = done.stderr.strip().splitlines()[-1]
    assert done.returncode == 2 and last.startswith(f"castor: {code}:") and says in last and str(path) in last, \
        done.stderr
    assert not sock.exists()


def test_streams_are_bounded_and_a_silent_client_does_not_hold_a_thread(busy_console):
    from castor.console.server import MAX_STREAMS

    live = busy_console
    parsed = urlsplit(live.url)
    held = []
    try:
        for _ in range(MAX_STREAMS):
            conn = http.client.HTTPConnection(parsed.hostname, parsed.port, timeout=10)
            conn.request("GET", "/events", headers=_auth(live.url))
            response = conn.getresponse()
            assert response.status == 200
            held.append((conn, response))  # the response owns the socket: keep it open
        one_more = http.client.HTTPConnection(parsed.hostname, parsed.port, timeout=10)
        one_more.request("GET", "/events", headers=_auth(live.url))
        assert one_more.getresponse().status == 503
        one_more.close()
        # Pages still answer while the streams are full.
        assert _get(live.url + "api/actors")[0] == 200
    finally:
        for conn, response in held:
            response.close()
            conn.close()
    # Once they are gone, a new stream is served again.
    def reopened() -> bool:
        conn = http.client.HTTPConnection(parsed.hostname, parsed.port, timeout=10)
        conn.request("GET", "/events", headers=_auth(live.url))
        ok = conn.getresponse().status == 200
        conn.close()
        return ok
    wait_for(reopened, timeout=15, what="a stream slot freed by a closed client")
    # A client that sends half a request and goes silent is dropped after the socket timeout.
    with socket.create_connection((parsed.hostname, parsed.port), timeout=30) as raw:
        raw.sendall(b"GET / HTTP/1.1\r\nHost: x")
        assert raw.recv(100) == b""  # closed by the server (SOCKET_TIMEOUT_S), not held open


@pytest.mark.timeout(90)
def test_the_icarus_worker_stats_are_on_the_console(tmp_path):
    import sys

    from castor.testing.reference_backend import reference_backend

    agent_dir = tmp_path / "home" / ".pi" / "agent"
    agent_dir.mkdir(parents=True)
    section = {"icarusDir": str(reference_backend()), "python": sys.executable,
               "fabricDir": str(tmp_path / "fabric"), "timeoutMs": 10000}
    (agent_dir / "settings.json").write_text(json.dumps({"piIcarusHook": section}))
    server, url, sock = start_console(tmp_path)
    try:
        project = tmp_path / "project"
        project.mkdir()
        with Client.connect_unix(str(sock)) as client:
            client.on_request("session.append_entry", lambda p: {"ok": True, "entry_id": "e"})
            client.call("session.open", {"session_id": "mem", "cwd": str(project), "trusted": True}, timeout=20)
            written = client.call("icarus.tool", {"session_id": "mem", "name": "fabric_write",
                                                  "params": {"type": "note", "summary": "s", "content": "c"}},
                                  timeout=30)
            assert written.get("status") == "written", written
            doc = json.loads(_get(url + "api/actors")[1])
            (worker,) = [w for w in doc["workers"] if w["session_id"] == "mem"]
            assert worker["state"] == "active" and worker["workers_started"] == 1
            assert worker["process"]["pid"] > 0 and worker["process"]["calls"] >= 1
            text = _get(url + "metrics")[1]
            assert _metric(text, "castor_worker_calls_total") >= 1
    finally:
        stop(server)


def test_the_endpoint_s_token_guards_the_console_when_it_has_no_token_file_of_its_own(tmp_path):
    import os

    token = "endp0int-" + "y" * 30
    token_file = tmp_path / "endpoint.token"
    token_file.write_text(token + "\n")
    os.chmod(token_file, 0o600)
    server, url, _sock = start_console(tmp_path, "--require-token", "--token-file", str(token_file))
    try:
        assert _get(url + "api/actors")[0] == 401
        assert _get(url + "api/actors", {"Authorization": f"Bearer {token}"})[0] == 200
    finally:
        stop(server)


def test_the_console_cookie_never_carries_the_endpoint_s_token(tmp_path):
    """Browsers send a cookie to every port of its host (cookies are not kept apart by port): the
    console's cookie held the console's token -- the endpoint's own when the console has no token
    file of its own -- so any page on 127.0.0.1 another local user served (at a port of theirs)
    received it with the user's next visit, and with it a trusted session on the endpoint (its
    utility commands run as castor's user). The cookie now holds a secret of this console's run
    alone, named after its port; it opens the console and nothing else."""
    import os

    token = "endp0int-" + "z" * 30
    token_file = tmp_path / "endpoint.token"
    token_file.write_text(token + "\n")
    os.chmod(token_file, 0o600)
    server, url, sock = start_console(tmp_path, "--require-token", "--token-file", str(token_file))
    try:
        status, _page, headers = _get(f"{url}?token={token}")
        assert status == 200, status
        set_cookie = headers["Set-Cookie"]
        assert token not in set_cookie, set_cookie
        assert "HttpOnly" in set_cookie and "SameSite=Strict" in set_cookie and "Path=/" in set_cookie
        cookie = set_cookie.split(";")[0]
        assert cookie.split("=", 1)[0].endswith(str(urlsplit(url).port)), cookie
        assert _get(url + "api/actors", {"Cookie": cookie})[0] == 200
        # The token itself is no cookie (it is never handed out as one), nor is another port's name.
        name, value = cookie.split("=", 1)
        assert _get(url + "api/actors", {"Cookie": f"{name}={token}"})[0] == 401
        assert _get(url + "api/actors", {"Cookie": f"castor_console_1={value}"})[0] == 401
        # What the cookie gets on the endpoint: nothing (it is not the token).
        with pytest.raises(CastorError) as refused:
            Client.connect_unix(str(sock), token=value, default_timeout=10)
        assert refused.value.code == "unauthenticated"
    finally:
        stop(server)


def test_a_console_with_no_token_of_its_own_gets_one_and_refuses_everyone_else(tmp_path):
    """`--socket` without a token and `--console`: the console's loopback port is open to every
    user of the machine, and it shows each cast's request, run directory and the actor tree. castor
    makes it a token of its own (a 0600 file, named in the serving line, removed at exit)."""
    import stat

    server, url, _sock = start_console(tmp_path)
    token_file = TOKEN_FILES[url]
    try:
        token = TOKENS[url]
        assert stat.S_IMODE(token_file.stat().st_mode) == 0o600 and len(token) >= 32
        for route in ("", "api/actors", "metrics", "events", "cast/s/c"):
            assert _get(url + route, {"Cookie": "none=1"})[0] == 401, route  # no credentials
        assert _get(url + "api/actors", {"Authorization": f"Bearer {token}"})[0] == 200
        status, _page, headers = _get(f"{url}?token={token}")
        assert status == 200 and "HttpOnly" in headers.get("Set-Cookie", "")
    finally:
        stop(server)
    assert not token_file.exists(), "the console's token file outlived the server"


@contextlib.contextmanager
def _console_logging_at_debug(token: str) -> Iterator[tuple[ConsoleServer, io.StringIO]]:
    """A console on 127.0.0.1 with ``token`` over a fresh runtime, every log record at DEBUG written
    to the yielded sink; afterwards the console and runtime stopped and logging back at ERROR."""
    from castor.console.server import ConsoleServer
    from castor.logs import configure_logging
    from castor.runtime import Runtime, RuntimeSettings

    sink = io.StringIO()
    configure_logging("DEBUG", sink=sink)
    runtime = Runtime(RuntimeSettings())
    console = ConsoleServer(runtime, "127.0.0.1", 0, token=token).start()
    try:
        yield console, sink
    finally:
        console.stop()
        runtime.shutdown(10)
        configure_logging("ERROR")


@pytest.mark.timeout(30)
def test_the_access_log_names_each_request_and_never_its_token(tmp_path):
    """The console's access lines read `127.0.0.1 "%s" %s %s` (http.server's format handed to
    loguru unformatted): no route, no status. They name both now, and the token a request
    carried in its query is not written."""
    token = "t0ken-" + "x" * 40
    with _console_logging_at_debug(token) as (console, sink):
        with urllib.request.urlopen(f"{console.url}metrics?token={token}", timeout=10) as reply:
            assert reply.status == 200
        try:
            urllib.request.urlopen(f"{console.url}metrics?token=wrong&x=1", timeout=10)
        except urllib.error.HTTPError as refused:
            assert refused.code in (401, 403)
    lines = [line for line in sink.getvalue().splitlines() if '"GET /metrics' in line]
    assert any('"GET /metrics?token=… HTTP/1.1" 200' in line for line in lines), lines
    assert any('"GET /metrics?token=…&x=1 HTTP/1.1" 40' in line for line in lines), lines
    assert token not in sink.getvalue() and "wrong" not in sink.getvalue() and "%s" not in sink.getvalue()


def test_a_closed_session_s_cast_page_is_not_found(busy_console):
    live = busy_console
    sid, cast_id = "session-3", live.casts["session-3"][0]
    assert _get(f"{live.url}cast/{sid}/{cast_id}")[0] == 200  # seen live: its run dir is remembered
    assert _get(live.url + "api/actors")[0] == 200
    live.client.call("session.close", {"session_id": sid}, timeout=20)
    status, body, _ = _get(f"{live.url}cast/{sid}/{cast_id}")
    assert status == 404 and f"no open session {sid}" in body, body
    assert _get(f"{live.url}events/cast/{sid}/{cast_id}")[0] == 404
    # The other sessions' casts are still served.
    assert _get(f"{live.url}cast/session-1/{live.casts['session-1'][0]}")[0] == 200


def test_the_console_keeps_no_run_dir_of_a_closed_session(tmp_path):
    """In process, a real runtime: a main-page push forgets the run dirs of sessions that closed."""
    from castor.console import pages
    from tests.actors.materia.helpers import make_runtime, open_session

    runtime = make_runtime()
    try:
        for sid in ("a", "b"):
            (tmp_path / sid).mkdir()
            open_session(runtime, sid, tmp_path / sid, [])
        pages._RUN_DIRS.update({("a", "c1"): str(tmp_path / "a"), ("b", "c2"): str(tmp_path / "b")})
        pages.tree_data(runtime)
        assert {k for k in pages._RUN_DIRS if k[0] in "ab"} == {("a", "c1"), ("b", "c2")}
        runtime.close_session("b")
        pages.tree_data(runtime)
        assert {k for k in pages._RUN_DIRS if k[0] in "ab"} == {("a", "c1")}
    finally:
        pages._RUN_DIRS.pop(("a", "c1"), None)
        pages._RUN_DIRS.pop(("b", "c2"), None)
        runtime.shutdown(timeout=10)


@pytest.mark.timeout(30)
@pytest.mark.parametrize("query", ["token={token}", "%74oken={token}", "x=1&tok%65n={token}"],
                         ids=["plain", "encoded-key", "encoded-key-later"])
def test_neither_the_access_log_nor_a_failed_request_s_log_line_carries_its_token(tmp_path, monkeypatch, query):
    """The access line hid ``token=VALUE`` only as written: a key the query parser decodes
    (``%74oken``, ``tok%65n``) opened the console and its token was written to the log. And a
    request that failed inside the console (an ``internal`` 500) was logged at error level with its
    raw path, ``?token=`` and all. Every query value whose decoded key is ``token`` is now hidden
    in both lines."""
    from castor.console import pages

    token = "t0ken-" + "q" * 40
    with _console_logging_at_debug(token) as (console, sink):
        with urllib.request.urlopen(f"{console.url}metrics?{query.format(token=token)}", timeout=10) as reply:
            assert reply.status == 200  # the parser took the key as `token`: the console opened

        def broken() -> str:
            raise RuntimeError("a page that cannot be drawn")

        monkeypatch.setattr(pages, "tree_page", broken)
        with pytest.raises(urllib.error.HTTPError) as failed:
            urllib.request.urlopen(f"{console.url}?{query.format(token=token)}", timeout=10)
        assert failed.value.code == 500
    log = sink.getvalue()
    assert "console request" in log and '"GET /metrics?' in log, log[-2000:]
    assert token not in log, [line for line in log.splitlines() if token in line]


def test_the_console_cookie_is_sent_only_under_a_secret_path_of_this_console(tmp_path):
    """A browser sends a host's cookies to every port of it: the console's cookie (``Path=/``)
    went with the user's next visit to any page another local user served on 127.0.0.1, and
    replayed there it opened the console (each cast's request, run directory, the actor tree). The
    cookie is now scoped to a path of this console's run that nobody else knows (``/c/<random>/``),
    where its pages, links and streams live, so a browser never sends it to another port's page
    (whose paths cannot be that one); and no page sends a ``Referer``."""
    import re

    from castor.console.server import ConsoleServer
    from castor.runtime import Runtime, RuntimeSettings

    token = "t0ken-" + "b" * 40
    runtime = Runtime(RuntimeSettings())
    console = ConsoleServer(runtime, "127.0.0.1", 0, token=token).start()
    other = ConsoleServer(runtime, "127.0.0.1", 0, token=token).start()
    try:
        status, page, headers = _get(f"{console.url}?token={token}")
        assert status == 200
        cookie_path = re.search(r"Path=([^;]+)", headers["Set-Cookie"]).group(1)
        assert re.fullmatch(r"/c/[A-Za-z0-9_-]{22,}/", cookie_path), headers["Set-Cookie"]
        assert cookie_path != _get(f"{other.url}?token={token}")[2]["Set-Cookie"].split("Path=")[1].split(";")[0]
        assert headers.get("Referrer-Policy") == "no-referrer", headers
        assert f'const BASE = "{cookie_path}"' in page, "the page's links and stream live under the cookie's path"
        cookie = {"Cookie": headers["Set-Cookie"].split(";")[0]}
        base = console.url.rstrip("/") + cookie_path
        for route, expected in (("", 200), ("api/actors", 200), ("metrics", 200), ("nope", 404)):
            assert _get(base + route, cookie)[0] == expected, route
        assert _get(base + "api/actors")[0] == 401  # the path opens nothing by itself
        assert _get(base + "api/actors", {"Authorization": f"Bearer {token}"})[0] == 200
        assert _get(console.url.rstrip("/") + "/c/another/api/actors", cookie)[0] == 404
    finally:
        console.stop()
        other.stop()
        runtime.shutdown(10)


def test_cookies_another_users_page_planted_on_the_host_never_lock_the_user_out(tmp_path):
    """A browser sends a host's cookies to every port of it, and any page of 127.0.0.1 may set them:
    another local user's page (a port of theirs the user visits) set ``castor_console_<port>=junk;
    Path=/`` or a cookie the standard library's parser gives up on (``a="unterminated``), and the
    console read only the last value of its name, or none at all: the user's own cookie was
    ignored and every page of the console answered 401 until they cleared the host's cookies. The
    console now accepts a request when any cookie of its name holds its secret, whatever else the
    header carries; a planted value alone still opens nothing."""
    with _console_and_its_cookie() as (own, name, base):
        # A browser sends the cookie of the longer path first, then the planted `Path=/` one.
        for header in (f"{own}; {name}=junk", f"{name}=junk; {own}", f'a="unterminated; {own}',
                       f"{own}; b=[x]; c=\"d\\\\", f"{own}; {name}"):
            assert _get(base + "api/actors", {"Cookie": header})[0] == 200, header
        for header in (f"{name}=junk", f'a="unterminated; {name}=junk', f"{name}", ""):
            assert _get(base + "api/actors", {"Cookie": header})[0] == 401, header


@contextlib.contextmanager
def _console_and_its_cookie():
    """A console over a bare runtime, visited once with its token: (its cookie as ``name=value``,
    the cookie's name, the URL of the path the cookie is sent to)."""
    import re

    from castor.console.server import ConsoleServer
    from castor.runtime import Runtime, RuntimeSettings

    token = "t0ken-" + "c" * 40
    runtime = Runtime(RuntimeSettings())
    console = ConsoleServer(runtime, "127.0.0.1", 0, token=token).start()
    try:
        status, _page, headers = _get(f"{console.url}?token={token}")
        assert status == 200
        own = headers["Set-Cookie"].split(";")[0]
        base = console.url.rstrip("/") + re.search(r"Path=([^;]+)", headers["Set-Cookie"]).group(1)
        yield own, own.split("=", 1)[0], base
    finally:
        console.stop()
        runtime.shutdown(10)


def test_a_host_full_of_planted_cookies_never_locks_the_user_out(tmp_path):
    """Any page of 127.0.0.1 may fill the host's cookies (a browser keeps about 180 of 4 KiB each for
    a host and sends them all in one ``Cookie`` line, ~700 KiB): the console bounded a request's
    headers at 64 KiB and answered 431 to every page until the user cleared the host's cookies. The
    console's own cookie anywhere in such a line now lets the request in (and a line without it is
    401, not 431); only past 1 MiB of cookies is the request refused 431."""
    from castor.console.server import MAX_COOKIE_BYTES

    with _console_and_its_cookie() as (own, name, base):
        junk = [f"junk{n}={'x' * 4000}" for n in range(180)]
        for cookies in (junk[:90] + [own] + junk[90:], [own] + junk, junk + [own],
                        junk[:5] + [f"{name}={'y' * 20_000}", own] + junk[5:]):
            assert _get(base + "api/actors", {"Cookie": "; ".join(cookies)})[0] == 200
        assert _get(base + "api/actors", {"Cookie": "; ".join(junk)})[0] == 401
        assert _get(base + "api/actors", {"Cookie": "; ".join(junk + [f"{name}=junk"])})[0] == 401
        past = [own] + [f"junk{n}={'x' * 4000}" for n in range(MAX_COOKIE_BYTES // 4000 + 2)]
        assert _get(base + "api/actors", {"Cookie": "; ".join(past)})[0] == 431


def test_a_saved_cast_s_visit_counts_cannot_put_markup_in_the_console_s_graph():
    """The cast page draws its loadout as an SVG the page sets as HTML, from the cast's
    ``state.json`` as it lies in the project (a project may ship or edit one). Every name in it was
    escaped but the visit counts, written as they were found: ``"visits": {"Socket-1": "<img src=x
    onerror=...>"}`` ran script in the console's page (inline handlers are allowed there), with the
    console's cookie and every cast's request within reach. The counts are escaped as the rest is."""
    from castor.console.pages import loadout_svg

    planted = '<img src=x onerror="alert(1)">'
    state = {"config": {"pipeline": {"entry": "Socket-1", "sockets": {
        "Socket-1": {"materia_name": "m", "socket": {"type": "agent", "edges": []}}}}},
        "visits": {"Socket-1": planted}, "active": False}
    svg = loadout_svg(state)
    assert "<img" not in svg and "&lt;img" in svg, svg


def test_a_project_s_fifo_link_or_huge_file_in_a_cast_s_directory_never_holds_the_console(tmp_path):
    """A cast's page reads its ``state.json``, ``usage.json`` and ``events.jsonl`` as they lie in
    the project, which may ship a cast's directory. They were opened as found: a FIFO in
    ``usage.json``'s place held the console's handler for ever (each visit or push one more, until
    its slots were gone), a link named ``events.jsonl`` showed another file's lines in the feed,
    and a sparse ``state.json`` of gigabytes was read whole. Each is now read only when it is a
    regular file (never through a link, never waited on) within castor's bound for run files."""
    import os
    import threading

    from castor.adapters.materia.artifacts import MAX_RUN_FILE_BYTES
    from castor.console import pages
    from tests.actors.materia.helpers import make_runtime, open_session

    project = tmp_path / "project"
    run_dir = project / ".pi" / "pi-materia" / "2026-01-01T00-00-00-000Z"
    run_dir.mkdir(parents=True)
    (run_dir / "state.json").write_text(json.dumps({"state": {"phase": "complete", "request": "shipped"}}))
    os.mkfifo(run_dir / "usage.json")
    elsewhere = tmp_path / "private.jsonl"
    elsewhere.write_text(json.dumps({"ts": "t", "type": "SECRET-LINE", "data": {}}) + "\n")
    (run_dir / "events.jsonl").symlink_to(elsewhere)
    huge = project / ".pi" / "pi-materia" / "2026-01-01T00-00-01-000Z"
    huge.mkdir()
    with open(huge / "state.json", "wb") as sparse:
        sparse.truncate(MAX_RUN_FILE_BYTES + 1)  # no disk cost: a hole
    runtime = make_runtime()
    results: dict[str, dict] = {}
    try:
        open_session(runtime, "s", project, [])

        def visit() -> None:
            for cast_id in (run_dir.name, huge.name):
                results[cast_id] = pages.cast_data(runtime, "s", cast_id)

        visitor = threading.Thread(target=visit, daemon=True)
        visitor.start()
        visitor.join(10)
        if visitor.is_alive():  # held by the FIFO: let it go before failing
            fd = os.open(run_dir / "usage.json", os.O_WRONLY | os.O_NONBLOCK)
            os.close(fd)
            visitor.join(20)
            pytest.fail("the console's read of a cast's usage.json waited on a FIFO")
        shipped = results[run_dir.name]
        assert shipped["request"] == "shipped" and shipped["usage"]["turns"] == 0
        assert shipped["events"] == [], shipped["events"]  # the link's target is never read
        assert results[huge.name]["phase"] is None  # over the bound: unread
    finally:
        for cast_id in (run_dir.name, huge.name):
            pages._RUN_DIRS.pop(("s", cast_id), None)
        runtime.shutdown(timeout=10)


@pytest.mark.parametrize("linked", ["run_directory", "artifact_root"])
def test_a_cast_s_page_never_follows_a_link_to_another_project_s_run_directory(tmp_path, linked):
    """A project may ship ``.pi/pi-materia/<id>`` (or ``.pi/pi-materia`` itself) as a link to
    another project's or user's cast: ``castor casts`` leaves a linked run directory out and
    ``castor status`` refuses it, but the console's cast page followed it and showed that cast's
    request. It is refused (``forbidden``, a 403), naming the link, and nothing behind it is read."""
    from castor.console import pages
    from castor.messages.errors import Forbidden
    from tests.actors.materia.helpers import make_runtime, open_session

    cast_id = "2026-01-01T00-00-00-000Z"
    theirs = tmp_path / "theirs" / ".pi" / "pi-materia"
    (theirs / cast_id).mkdir(parents=True)
    (theirs / cast_id / "state.json").write_text(json.dumps({"state": {"phase": "complete", "request": "SECRET"}}))
    project = tmp_path / "project"
    (project / ".pi").mkdir(parents=True)
    if linked == "run_directory":
        (project / ".pi" / "pi-materia").mkdir()
        (project / ".pi" / "pi-materia" / cast_id).symlink_to(theirs / cast_id)
    else:
        (project / ".pi" / "pi-materia").symlink_to(theirs)
    runtime = make_runtime()
    try:
        open_session(runtime, "s", project, [])
        with pytest.raises(Forbidden) as refused:
            pages.cast_data(runtime, "s", cast_id)
        assert "SECRET" not in refused.value.message
        said = {"run_directory": f"run directory {project / '.pi' / 'pi-materia' / cast_id} is a symbolic link",
                "artifact_root": f"'.pi/pi-materia' is a symbolic link to {theirs}, outside the project"}[linked]
        assert said in refused.value.message, refused.value.message
        assert ("s", cast_id) not in pages._RUN_DIRS
    finally:
        pages._RUN_DIRS.pop(("s", cast_id), None)
        runtime.shutdown(timeout=10)


@pytest.mark.timeout(30)
def test_every_open_page_shares_one_serialisation_of_each_push(tmp_path, monkeypatch):
    """Each open main page serialised the shared snapshot again every second: at 1,000 casts about
    2.5 MB of JSON, some 25 ms of castor's process per page per second. Pages open at once now
    share one serialisation of each event (the whole document a new stream starts with), as they
    share the snapshot."""
    import http.client
    import json as json_module

    from castor.console import pages
    from castor.console.server import ConsoleServer
    from castor.runtime import Runtime, RuntimeSettings

    snapshots: list[dict] = []
    written: list[int] = []
    real_tree_data, real_dumps = pages.tree_data, json_module.dumps

    def tree_data(runtime, moments=None):
        snapshots.append(real_tree_data(runtime, moments))
        return snapshots[-1]

    def dumps(value, *args, **kwargs):
        if isinstance(value, dict) and "full" in value:
            written.append(id(value))
        return real_dumps(value, *args, **kwargs)

    monkeypatch.setattr(pages, "tree_data", tree_data)
    monkeypatch.setattr(json_module, "dumps", dumps)
    runtime = Runtime(RuntimeSettings())
    console = ConsoleServer(runtime, "127.0.0.1", 0, token=None).start()
    streams = [http.client.HTTPConnection("127.0.0.1", console.port, timeout=10) for _ in range(3)]
    try:
        for stream in streams:
            stream.request("GET", "/events")
        for stream in streams:
            response = stream.getresponse()
            assert response.status == 200
            while not response.fp.readline().startswith(b"data: "):
                pass
        assert len(written) == len(snapshots) >= 1, (len(written), len(snapshots))
    finally:
        for stream in streams:
            stream.close()
        console.stop()
        runtime.shutdown(10)


@pytest.mark.timeout(30)
def test_a_stream_probe_answers_as_the_stream_would_and_holds_no_slot(monkeypatch):
    """A page whose stream was refused asks why with ``?probe``: answered as the stream would be
    (204 when one would be served now, 503 when every slot is taken), and holding no slot, so the
    page's own stream right after it is served (a probe that opened a stream kept it out)."""
    import http.client

    from castor.console import server
    from castor.runtime import Runtime, RuntimeSettings

    monkeypatch.setattr(server, "MAX_STREAMS", 1)
    runtime = Runtime(RuntimeSettings())
    console = server.ConsoleServer(runtime, "127.0.0.1", 0, token=None).start()
    try:
        for _ in range(3):
            assert _get(f"{console.url}events?probe")[0] == 204
        stream = http.client.HTTPConnection("127.0.0.1", console.port, timeout=10)
        stream.request("GET", "/events")
        held = stream.getresponse()
        assert held.status == 200
        status, body, _headers = _get(f"{console.url}events?probe")
        assert status == 503 and "too many live streams" in body
        held.close()
        stream.close()
    finally:
        console.stop()
        runtime.shutdown(10)


def test_a_project_s_casts_are_listed_whatever_their_status_and_need_attention_when_failed_since_open(tmp_path):
    """The casts a page lists without having watched them end are read from the session's
    project's casts' states, whatever their status (it listed failed ones alone: an operator who
    opened the console after a cast completed or was aborted found it nowhere): the newest
    SAVED_SCAN. Those that failed since the session opened need attention; one that failed before,
    or ended otherwise, does not."""
    from types import SimpleNamespace

    from castor.adapters.fs import project_artifact_root
    from castor.adapters.materia.state_store import CastStateStore
    from castor.console import pages

    project = tmp_path / "project"
    project.mkdir()
    root = project_artifact_root(str(project), None)
    root.mkdir(parents=True)
    store = CastStateStore(root)
    now = time.time()
    for n in range(pages.MAX_ENDED_PER_SESSION + 5):  # failed since the session opened, a second apart
        cast_id = f"c{n:03d}"
        store.save(cast_id, {"version": 2, "active": False, "phase": "failed", "failedReason": f"boom {n}",
                             "updatedAt": now - 100 + n}, incarnation=store.claim(cast_id))
    store.save("b000", {"version": 2, "active": False, "phase": "failed", "failedReason": "long ago",
                        "updatedAt": now - 7200}, incarnation=store.claim("b000"))
    store.save("d000", {"version": 2, "active": False, "phase": "complete", "updatedAt": now - 50},
               incarnation=store.claim("d000"))
    store.save("d001", {"version": 2, "active": False, "phase": "failed", "failedReason": "aborted by user",
                        "updatedAt": now - 40}, incarnation=store.claim("d001"))
    session = SimpleNamespace(info=SimpleNamespace(cwd=str(project), flags={}))
    runtime = SimpleNamespace(session=lambda sid: session, artifact_root_for=project_artifact_root)
    try:
        listed, total = pages._saved_casts(runtime, "s-bounded", uptime_s=3600.0)
    finally:
        pages._SAVED.clear()
        pages._OPENED.pop("s-bounded", None)
    assert total == pages.MAX_ENDED_PER_SESSION + 8
    by_id = {c["cast_id"]: c for c in listed}
    assert len(listed) == total and by_id["d000"]["status"] == "complete" and by_id["d001"]["status"] == "aborted"
    assert [c["cast_id"] for c in listed if c["attention"]] == \
        [f"c{n:03d}" for n in range(pages.MAX_ENDED_PER_SESSION + 4, -1, -1)]
    newest = pages.MAX_ENDED_PER_SESSION + 4
    assert by_id[f"c{newest:03d}"]["reason"] == f"boom {newest}" and not by_id["b000"]["attention"]


def _saved_failed_cast(root: Path, cast_id: str, request: str) -> None:
    """A cast saved under ``root`` as castor saves one (its state file and the cast index), failed just now."""
    from castor.adapters.materia.state_store import CastStateStore

    root.mkdir(parents=True, exist_ok=True)
    store = CastStateStore(root)
    store.save(cast_id, {"version": 2, "active": False, "phase": "failed", "failedReason": "boom",
                         "request": request, "updatedAt": time.time()}, incarnation=store.claim(cast_id))


@pytest.mark.parametrize("layer", ["project", "session_config"])
def test_a_saved_cast_under_a_configured_artifact_dir_is_found_as_castor_casts_finds_it(tmp_path, monkeypatch, layer):
    """``castor casts`` looks for a project's casts under its configured ``artifactDir`` (the
    project's layer, or the config the session was opened with). The console looked under the
    default ``.pi/pi-materia`` alone (and the run directories of casts it saw live): a saved cast's
    page was ``not_found`` and a cast that failed with no page open was listed nowhere. Both are
    found under the configured root now."""
    from castor.adapters.agents.scripted import ScriptedAgent, parse_script
    from castor.adapters.stderr_ui import StderrUi
    from castor.console import pages
    from castor.runtime import HarnessLink, SessionInfo
    from tests.actors.materia.helpers import make_runtime

    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.setenv("PI_CODING_AGENT_DIR", str(tmp_path / "home" / ".pi" / "agent"))
    monkeypatch.delenv("MATERIA_CONFIG", raising=False)
    project = tmp_path / "project"
    (project / ".pi").mkdir(parents=True)
    flags: dict[str, str] = {}
    if layer == "project":
        (project / ".pi" / "pi-materia.json").write_text(json.dumps({"artifactDir": "runs"}))
    else:
        (project / "alt.json").write_text(json.dumps({"artifactDir": "runs"}))
        flags["materia_config"] = str(project / "alt.json")
    cast_id = "2026-01-01T00-00-00-000Z"
    _saved_failed_cast(project / "runs", cast_id, "under runs")
    runtime = make_runtime()
    try:
        runtime.open_session(SessionInfo(session_id="s-conf", cwd=str(project), trusted=True, flags=flags),
                             HarnessLink(agent=ScriptedAgent(parse_script([])), session_log=None,
                                         ui=StderrUi(printer=lambda _line: None)))
        shown = pages.cast_data(runtime, "s-conf", cast_id)
        assert shown["request"] == "under runs" and shown["run_dir"] == str((project / "runs" / cast_id).resolve())
        failed, _total = pages._saved_casts(runtime, "s-conf", uptime_s=3600.0)
        assert [c["cast_id"] for c in failed] == [cast_id], failed
    finally:
        pages._RUN_DIRS.pop(("s-conf", cast_id), None)
        pages._SAVED.clear()
        pages._OPENED.pop("s-conf", None)
        runtime.shutdown(timeout=10)


@pytest.mark.parametrize("where", ["outside", "through_a_link"])
def test_a_configured_artifact_dir_leading_out_of_the_project_is_refused_as_castor_casts_refuses_it(
        tmp_path, monkeypatch, where):
    """An ``artifactDir`` outside the project, or one inside it that is a link leading out, is
    refused by ``castor casts`` (``forbidden``): the console refuses it the same way (a cast's page
    is ``forbidden``, naming the setting) and lists no failed cast from it; nothing behind it is read.
    The session's card says why its saved casts are not read (it said nothing: none were listed)."""
    from castor.console import pages
    from castor.messages.errors import Forbidden
    from tests.actors.materia.helpers import make_runtime, open_session

    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.setenv("PI_CODING_AGENT_DIR", str(tmp_path / "home" / ".pi" / "agent"))
    monkeypatch.delenv("MATERIA_CONFIG", raising=False)
    cast_id = "2026-01-01T00-00-00-000Z"
    theirs = tmp_path / "theirs"
    _saved_failed_cast(theirs, cast_id, "SECRET")
    project = tmp_path / "project"
    (project / ".pi").mkdir(parents=True)
    if where == "outside":
        configured = str(theirs)
    else:
        configured = "runs"
        (project / "runs").symlink_to(theirs)
    (project / ".pi" / "pi-materia.json").write_text(json.dumps({"artifactDir": configured}))
    runtime = make_runtime()
    try:
        open_session(runtime, "s-out", project, [])
        with pytest.raises(Forbidden) as refused:
            pages.cast_data(runtime, "s-out", cast_id)
        assert "SECRET" not in refused.value.message
        assert "artifactDir must stay inside the project" in refused.value.message, refused.value.message
        assert pages._saved_casts(runtime, "s-out", uptime_s=3600.0) == ([], 0)
        assert ("s-out", cast_id) not in pages._RUN_DIRS
        (session,) = [s for s in pages.tree_data(runtime)["sessions"] if s["session_id"] == "s-out"]
        assert "artifactDir must stay inside the project" in session["casts_refused"]  # said on its card
    finally:
        pages._RUN_DIRS.pop(("s-out", cast_id), None)
        pages._SAVED.clear()
        pages._OPENED.pop("s-out", None)
        pages._REFUSED.pop("s-out", None)
        runtime.shutdown(timeout=10)


@pytest.mark.timeout(30)
def test_the_main_stream_sends_the_whole_tree_once_then_only_what_changed(monkeypatch):
    """The main stream pushed the whole tree every second (about 2.6 MB a second at 1,000 casts),
    though nearly all of it changed only because its ages had grown. A stream now starts with the
    whole document and then sends what changed since the version it sent last: a second in which
    nothing happened is a few dozen bytes. A stream whose last version is no longer kept (a reader
    held back, a page that reconnects) gets the whole document again."""
    import http.client

    from castor.console import delta, server
    from castor.runtime import Runtime, RuntimeSettings

    monkeypatch.setattr(server, "PUSH_INTERVAL_S", 0.2)
    runtime = Runtime(RuntimeSettings())
    console = server.ConsoleServer(runtime, "127.0.0.1", 0, token=None).start()
    stream = http.client.HTTPConnection("127.0.0.1", console.port, timeout=10)
    try:
        stream.request("GET", "/events")
        response = stream.getresponse()
        assert response.status == 200
        events = []
        while len(events) < 4:
            line = response.fp.readline()
            if line.startswith(b"data: "):
                events.append(line[6:].strip())
        pushed = [json.loads(event) for event in events]
        assert "full" in pushed[0], list(pushed[0])[:5]
        held, version = pushed[0]["full"], pushed[0]["v"]
        for event, push in zip(events[1:], pushed[1:], strict=True):
            assert push["base"] == version and len(event) < 200, event[:300]
            held, version = delta.apply(held, push["patch"]), push["v"]
        assert {a["path"] for a in held["actors"]} == {a["path"] for a in runtime.system.snapshot_data()["actors"]}
        stream.close()
        monkeypatch.setattr(server, "PUSH_INTERVAL_S", 0.0)  # each call takes a new version
        newest, whole = console.tree_event(None)
        assert "full" in json.loads(whole)
        assert "patch" in json.loads(console.tree_event(newest)[1])
        for _ in range(server.KEPT_VERSIONS):  # the stream's version falls out of those kept
            latest, _text = console.tree_event(None)
        assert "full" in json.loads(console.tree_event(newest)[1]) and latest > newest
    finally:
        stream.close()
        console.stop()
        runtime.shutdown(10)


def test_a_cast_page_s_stream_sends_the_whole_document_once_then_only_what_changed(busy_console):
    """A cast page's stream pushed its whole document every second (the graph, 40 events, its actor's
    snapshot), though nearly nothing of it changes. It starts whole now and then sends what changed,
    as the main stream does: a second in which nothing happened is the push's time alone, and an
    agent turn that ends is its new events. What the page holds after every patch is what a whole
    push says."""
    from castor.console import delta

    live = busy_console
    sid, cast_id = "session-3", live.casts["session-3"][0]
    parsed = urlsplit(live.url)
    conn = http.client.HTTPConnection(parsed.hostname, parsed.port, timeout=10)
    conn.request("GET", f"/events/cast/{sid}/{cast_id}", headers=_auth(live.url))
    response = conn.getresponse()
    assert response.status == 200

    def pushed() -> tuple[bytes, dict]:
        line = b""
        while not line.startswith(b"data: "):
            line = response.fp.readline()
        return line, json.loads(line[6:])

    try:
        first, whole = pushed()
        assert "full" in whole and whole["full"]["cast_id"] == cast_id, first[:200]
        held, version = whole["full"], whole["v"]
        line, push = pushed()
        assert push["base"] == version and len(line) < len(first) / 20, line[:300]
        held, version = delta.apply(held, push["patch"]), push["v"]
        turn = live.client.call("cast.status", {"session_id": sid, "cwd": str(live.projects[sid]),
                                                "cast_id": cast_id}, timeout=20)
        assert turn["status"] == "active"
        before = len(held["events"])
        live.client.call("ops.fault", {"kind": "kill", "path": f"/root/session/{sid}/cast/{cast_id}"}, timeout=10)
        newest = whole["full"]["events"][-1]["event_id"]
        ends = time.monotonic() + 15
        while held["events"][-1]["event_id"] == newest:  # the restart's events arrive as patches adding them
            assert time.monotonic() < ends, "no new event in the cast's feed after its restart"
            line, push = pushed()
            assert "patch" in push and push["base"] == version, line[:300]
            held, version = delta.apply(held, push["patch"]), push["v"]
        assert "add" in push["patch"]["patch"]["events"], push  # the events that joined, not the feed again
        assert len(held["events"]) >= before and len(line) < len(first), line[:300]
    finally:
        conn.close()
    conn = http.client.HTTPConnection(parsed.hostname, parsed.port, timeout=10)
    conn.request("GET", f"/events/cast/{sid}/{cast_id}", headers=_auth(live.url))
    response = conn.getresponse()
    try:
        _line, again = pushed()  # a new stream (a page that reconnects) starts whole
    finally:
        conn.close()
    now = again["full"]
    for key in ("cast_id", "phase", "current_socket", "visits", "svg", "request", "usage"):
        assert held[key] == now[key], key
    assert held["events"] == now["events"][-len(held["events"]):] or held["events"][-1] in now["events"]


def test_every_cast_of_a_session_s_project_is_listed_a_page_at_a_time_and_nothing_else_is(tmp_path, monkeypatch):
    """``/casts/<session>`` lists every cast of the session's project (its main page lists the newest
    few): CASTS_PAGE at a time, newest first, each with its status and linked to its page, the next
    page by the cursor ``castor casts`` pages with. An id that is no actor name, a cursor that is no
    cursor, a closed session and a request without the token are refused; nothing outside the
    project is named."""
    import re
    from urllib.parse import quote

    from castor.console import pages, server
    from tests.actors.materia.helpers import make_runtime, open_session

    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.delenv("MATERIA_CONFIG", raising=False)
    project = tmp_path / "project"
    project.mkdir()
    root = project / ".pi" / "pi-materia"
    count = pages.CASTS_PAGE + 7
    for n in range(count):
        _saved_failed_cast(root, f"2026-01-01T00-00-{n // 60:02d}-{n % 60:03d}Z", f"request {n}")
    token = "t0ken-" + "p" * 40
    runtime = make_runtime()
    console = server.ConsoleServer(runtime, "127.0.0.1", 0, token=token).start()
    bearer = {"Authorization": f"Bearer {token}"}
    base = f"http://127.0.0.1:{console.port}{console.base}"
    try:
        open_session(runtime, "s-all", project, [])
        status, page, _ = _get(f"{base}casts/s-all", bearer)
        assert status == 200, page
        first = re.findall(r'<tr data-cast="([^"]+)">', page)
        assert len(first) == pages.CASTS_PAGE and first == sorted(first, reverse=True)
        assert f'href="{console.base}cast/s-all/{first[0]}"' in page and f"{count} casts under" in page
        nxt = re.search(r'data-next href="([^"]+)"', page)
        assert nxt is not None
        status, rest, _ = _get(f"http://127.0.0.1:{console.port}{nxt.group(1).replace('&amp;', '&')}", bearer)
        second = re.findall(r'<tr data-cast="([^"]+)">', rest)
        assert status == 200 and len(first) + len(second) == count and not set(first) & set(second)
        assert "data-next" not in rest
        for path, code in ((f"casts/{quote('..', safe='')}", 400), ("casts/a%2Fb", 400), ("casts/s-all/x", 404),
                           ("casts/s-all?cursor=..%2F..%2Fetc", 400), ("casts/s-all?cursor=0:..", 400),
                           ("casts/closed", 404), ("casts/%ff%fe", 400)):
            status, body, _ = _get(base + path, bearer)
            assert status == code, (path, status, body)
            assert str(tmp_path) not in body, (path, body)
        status, body, _ = _get(f"{base}casts/s-all")  # no token
        assert status == 401 and "request 1" not in body
    finally:
        console.stop()
        runtime.shutdown(timeout=10)


def test_a_project_whose_names_are_no_utf8_and_a_cast_with_a_lone_surrogate_are_shown_not_a_500(tmp_path,
                                                                                                   monkeypatch):
    """A project whose directory's name is no UTF-8, holding a cast whose hand-written state.json has
    a lone surrogate (a JSON escape) as its socket, request and failure reason: the project's cast
    list and the cast's page were 500 (no page can be encoded with a lone surrogate; the cast index
    could not store the row, which failed the whole listing -- ``castor casts`` too -- so the
    project's other casts were on no card either). Each is shown with the surrogate as its escape."""
    import os
    import re

    from castor.adapters.materia.state_store import list_page
    from castor.console import pages, server
    from tests.actors.materia.helpers import make_runtime, open_session

    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.delenv("MATERIA_CONFIG", raising=False)
    project = Path(os.fsdecode(os.fsencode(tmp_path) + b"/project-\xff"))
    project.mkdir()
    root = project / ".pi" / "pi-materia"
    hostile, fine = "2026-01-01T00-00-00-001Z", "2026-01-01T00-00-00-000Z"
    _saved_failed_cast(root, fine, "a fine request")
    _saved_failed_cast(root, hostile, "REQ")
    state = root / hostile / "state.json"
    config = {"pipeline": {"entry": "SOCK", "sockets": {"SOCK": {"socket": {"type": "agent"}, "materia_name": "m"}}}}
    document = json.loads(state.read_text())
    document["state"].update({"config": config, "currentSocketId": "SOCK", "visits": {"SOCK": 1},
                              "failedReason": "REASON"})
    state.write_text(json.dumps(document).replace("REQ", "r\\ud800").replace("SOCK", "s\\udfff")
                     .replace("REASON", "why \\udc80"))
    assert [c.cast_id for c in list_page(root).casts] == [hostile, fine]
    runtime = make_runtime()
    console = server.ConsoleServer(runtime, "127.0.0.1", 0, token=None).start()
    base = f"http://127.0.0.1:{console.port}/"
    try:
        open_session(runtime, "s-utf", project, [])
        status, page, _ = _get(f"{base}casts/s-utf")
        assert status == 200, page
        assert re.findall(r'<tr data-cast="([^"]+)">', page) == [hostile, fine]
        assert "r\\ud800" in page and "why \\udc80" in page and "project-\\udcff" in page
        status, page, _ = _get(f"{base}cast/s-utf/{hostile}")
        assert status == 200 and "s\\udfff" in page, page
        (session,) = [s for s in pages.tree_data(runtime)["sessions"] if s["session_id"] == "s-utf"]
        assert [c["cast_id"] for c in session["ended"]] == [hostile, fine]
    finally:
        pages._SAVED.clear()
        console.stop()
        runtime.shutdown(timeout=10)


def test_another_local_user_without_the_token_gets_nothing_from_any_route_even_knowing_its_paths(tmp_path,
                                                                                                  monkeypatch):
    """Another local user (another uid) reaches the console's loopback port like anyone: without the
    token every route is 401 -- the project's cast list and a cast's page and stream too, the ones
    under the console's secret path (as if a link had leaked), ``..`` and encoded tricks -- and no
    answer carries a byte of a cast's request, a path of the project or a run directory's name."""
    import os

    from castor.console import server
    from tests.actors.materia.helpers import make_runtime, open_session
    from tests.support.other_user import as_another_user

    if os.geteuid() != 0:
        pytest.skip("running as another user needs root")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.delenv("MATERIA_CONFIG", raising=False)
    project = tmp_path / "project"
    project.mkdir()
    cast_id = "2026-01-01T00-00-00-000Z"
    _saved_failed_cast(project / ".pi" / "pi-materia", cast_id, "THE SECRET REQUEST")
    token = "t0ken-" + "o" * 40
    runtime = make_runtime()
    console = server.ConsoleServer(runtime, "127.0.0.1", 0, token=token).start()
    try:
        open_session(runtime, "s-other", project, [])
        routes = ["", "events", "api/actors", "metrics", "casts/s-other", f"cast/s-other/{cast_id}",
                  f"events/cast/s-other/{cast_id}", f"events/cast/s-other/{cast_id}?probe", "casts/s-other?cursor=0:x",
                  "casts/..", "cast/s-other/..%2f..%2fetc", "casts/s-other?token=", "casts/s-other?%74oken=nope"]
        paths = [f"/{route}" for route in routes] + [f"{console.base}{route}" for route in routes]
        port = console.port

        def knock() -> bytes:
            answers = []
            for path in paths:
                conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
                conn.request("GET", path, headers={"Cookie": f"{console.cookie_name}=guess"})
                response = conn.getresponse()
                answers.append([path, response.status, response.read(65536).decode(errors="replace")])
                conn.close()
            return json.dumps(answers).encode()

        heard = as_another_user(knock)
    finally:
        console.stop()
        runtime.shutdown(timeout=10)
    assert not heard.startswith(b"RAISED"), heard
    answers = json.loads(heard)
    assert [path for path, _status, _body in answers] == paths
    assert {status for _path, status, _body in answers} == {401}, answers
    for _path, _status, body in answers:
        for secret in ("THE SECRET REQUEST", str(tmp_path), cast_id, token, console.base.strip("/")):
            assert secret not in body, (secret, body)


def test_a_project_whose_casts_take_long_to_read_never_holds_the_pages_push(tmp_path, monkeypatch):
    """A project of thousands of casts castor has not listed yet has no cast index: building it reads
    every state.json (2.3 s for 5,000 here), and the console read it inside the push, which every open
    page waits for, holding them all. The push waits SAVED_WAIT_S at most now and goes without that
    project's casts, which a later push lists once read (on a thread of its own)."""
    import threading

    from castor.adapters.materia.state_store import list_page
    from castor.console import pages
    from tests.actors.materia.helpers import make_runtime, open_session

    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.delenv("MATERIA_CONFIG", raising=False)
    project = tmp_path / "project"
    project.mkdir()
    cast_id = "2026-01-01T00-00-00-000Z"
    _saved_failed_cast(project / ".pi" / "pi-materia", cast_id, "r")
    release, reading = threading.Event(), threading.Event()

    def slow_list_page(*args, **kwargs):
        reading.set()
        assert release.wait(30)
        return list_page(*args, **kwargs)

    monkeypatch.setattr(pages, "list_page", slow_list_page)
    runtime = make_runtime()
    try:
        open_session(runtime, "s-slow", project, [])
        started = time.monotonic()
        (session,) = [s for s in pages.tree_data(runtime)["sessions"] if s["session_id"] == "s-slow"]
        assert time.monotonic() - started < pages.SAVED_WAIT_S + 2.0 and reading.is_set()
        assert session["ended"] == [] and session["casts_total"] == 0  # not read yet
        release.set()

        def listed() -> list[str] | None:
            (now,) = [s for s in pages.tree_data(runtime)["sessions"] if s["session_id"] == "s-slow"]
            return [c["cast_id"] for c in now["ended"]] or None

        assert wait_for(listed, timeout=10, what="the project's casts at a later push") == [cast_id]
    finally:
        release.set()
        pages._SAVED.clear()
        runtime.shutdown(timeout=10)


def test_head_is_answered_as_get_would_be_without_a_body_and_other_methods_say_what_is_allowed():
    """``curl -I`` and an uptime check's HEAD get what GET would (status, type, length, the same
    refusals), with no body and no stream slot held; a method the console does not serve is
    ``501`` in plain text with ``Allow: GET, HEAD``, never the standard library's HTML page."""
    from castor.console import server
    from castor.runtime import Runtime, RuntimeSettings

    runtime = Runtime(RuntimeSettings())
    token = "t" * 32
    console = server.ConsoleServer(runtime, "127.0.0.1", 0, token=token).start()

    def ask(method: str, path: str, headers: dict[str, str] | None = None) -> tuple[int, dict[str, str], bytes]:
        conn = http.client.HTTPConnection("127.0.0.1", console.port, timeout=10)
        try:
            conn.request(method, path, headers=headers or {})
            response = conn.getresponse()
            return response.status, {k.lower(): v for k, v in response.getheaders()}, response.read()
        finally:
            conn.close()

    try:
        for path in ("/metrics", "/", "/api/actors"):
            got, got_headers, body = ask("GET", f"{path}?token={token}")
            status, headers, nobody = ask("HEAD", f"{path}?token={token}")
            assert (status, nobody) == (got, b""), (path, status)
            assert headers["content-type"] == got_headers["content-type"]
            if path == "/metrics":
                assert int(headers["content-length"]) > 0
        assert ask("HEAD", "/metrics")[0] == 401
        assert ask("HEAD", f"/metrics?token={token}", {"Host": "attacker.example"})[0] == 403
        assert ask("HEAD", f"/nope?token={token}")[0] == 404
        status, headers, body = ask("HEAD", f"/events?token={token}")
        assert status == 200 and headers["content-type"].startswith("text/event-stream") and body == b""
        for method in ("OPTIONS", "POST", "PUT", "DELETE", "BREW"):
            status, headers, body = ask(method, f"/metrics?token={token}")
            assert status == 501, method
            assert headers["allow"] == "GET, HEAD", method
            assert headers["content-type"].startswith("text/plain"), method
            assert b"<" not in body and b"serves GET and HEAD" in body, body
        assert console.streams.acquire(blocking=False)  # no HEAD kept a stream's slot
        console.streams.release()
    finally:
        console.stop()
        runtime.shutdown(10)


def test_metrics_are_valid_exposition_with_help_and_type_and_no_label_that_names_a_session_or_cast(busy_console):
    """What a Prometheus scrape reads: the exposition parses (prometheus_client's own parser), every
    family says what it is (HELP) and its type, and no label carries a session, a cast, a project
    or a socket -- values that grow with every cast and would make a series per cast forever."""
    from prometheus_client.parser import text_string_to_metric_families

    live = busy_console
    sid, cast_id = "session-1", live.casts["session-1"][0]
    live.client.call("ops.fault", {"kind": "kill", "path": f"/root/session/{sid}/cast/{cast_id}"}, timeout=10)
    wait_for(lambda: 'castor_restarts_total{kind="CastActor"} 1.0' in _get(live.url + "metrics")[1], timeout=15,
             what="the kill's restart in /metrics")
    status, text, headers = _get(live.url + "metrics")
    assert status == 200
    families = list(text_string_to_metric_families(text))
    assert len({f.name for f in families}) == len(families) >= 20
    named = set(live.casts) | {c for casts in live.casts.values() for c in casts} | \
        {str(p) for p in live.projects.values()}
    for family in families:
        assert family.documentation.strip(), family.name
        assert family.type in ("gauge", "counter", "histogram"), (family.name, family.type)
        exposed = family.name + ("_total" if family.type == "counter" else "")  # as the text names it
        assert f"# HELP {exposed} " in text and f"# TYPE {exposed} {family.type}\n" in text, exposed
        for sample in family.samples:
            assert set(sample.labels) <= {"kind", "state", "phase", "le"}, sample
            for value in sample.labels.values():
                assert not any(n in value for n in named) and "Socket-" not in value, sample
    series = sum(len(f.samples) for f in families)
    assert series < 400, series  # a few per kind and status, whatever the casts


@pytest.mark.timeout(60)
def test_a_cast_another_runtime_holds_names_the_holding_process_and_its_command(tmp_path, monkeypatch):
    """A project's cast that is active and not running here (another castor command or a harness's
    serve holds its lease) is listed with the process that holds it: its pid and command line, as
    ``castor status`` names it; the page's row says it (``held by pid N (command)``)."""
    import subprocess
    import sys

    from castor.adapters.materia.state_store import CastStateStore
    from castor.console import pages
    from tests.actors.materia.helpers import make_runtime, open_session

    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.delenv("MATERIA_CONFIG", raising=False)
    project = tmp_path / "project"
    root = project / ".pi" / "pi-materia"
    root.mkdir(parents=True)
    cast_id = "2026-01-01T00-00-00-000Z"
    store = CastStateStore(root)
    store.save(cast_id, {"version": 2, "active": True, "phase": "running", "request": "r",
                         "updatedAt": time.time()}, incarnation=store.claim(cast_id))
    holder = subprocess.Popen(
        [sys.executable, "-c", "import fcntl, os, sys; fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT); "
                               "fcntl.flock(fd, fcntl.LOCK_EX); print('held', flush=True); sys.stdin.read()",
         str(root / cast_id / "owner.lock"), "holder-mark-3e1"],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    runtime = make_runtime()
    try:
        assert holder.stdout is not None and holder.stdout.readline() == "held\n"
        open_session(runtime, "s-held", project, [])

        def listed() -> dict | None:
            (now,) = [s for s in pages.tree_data(runtime)["sessions"] if s["session_id"] == "s-held"]
            return next((c for c in now["ended"] if c["cast_id"] == cast_id), None)

        row = wait_for(listed, timeout=20, what="the held cast on the session's card")
        assert row["status"] == "active"
        assert row["held_by"]["pid"] == holder.pid and "holder-mark-3e1" in row["held_by"]["command"]
        assert "', held by pid '" in pages.tree_page()  # the page's row says it
    finally:
        holder.kill()
        holder.wait(10)
        pages._SAVED.clear()
        runtime.shutdown(timeout=10)

"""Stdio mode in a real subprocess: a tiny script builds a Dispatcher and serves stdio."""

from __future__ import annotations

import os
import sys
import textwrap

import pytest

from castor.client import Client
from castor.messages.errors import InvalidParams

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

SCRIPT = textwrap.dedent("""
    import sys
    from castor.endpoint import Dispatcher, Params, serve

    class Add(Params):
        a: int
        b: int = 0

    def noisy(params, ctx):
        print("stray print that must not corrupt the protocol")
        return "ok"

    def ask(params, ctx):
        return ctx.call("model.list", {}, timeout=5)

    d = Dispatcher()
    d.register("add", lambda p, ctx: p.a + p.b, Add)
    d.register("noisy", noisy)
    d.register("ask", ask)
    serve(d, stdio=True, on_shutdown=lambda: sys.stderr.write("SHUTDOWN-HOOK-RAN\\n"))
    sys.stderr.write("SERVE-RETURNED\\n")
""")


@pytest.mark.timeout(30)
def test_stdio_server_subprocess_round_trip_and_eof_shutdown(tmp_path) -> None:
    err_path = tmp_path / "stderr.txt"
    with open(err_path, "wb") as err:
        client = Client.spawn_stdio([sys.executable, "-c", SCRIPT], cwd=ROOT, stderr=err.fileno(),
                                    default_timeout=10)
        try:
            assert client.call("add", {"a": 2, "b": 40}) == 42
            with pytest.raises(InvalidParams):
                client.call("add", {"a": "x"})
            assert client.call("noisy") == "ok"  # the print went to stderr, not into the stream
            client.on_request("model.list", lambda p: [{"id": "m1", "url": "http://127.0.0.1:1"}])
            assert client.call("ask") == [{"id": "m1", "url": "http://127.0.0.1:1"}]
            hello = client.call("runtime.hello")
            assert {"add", "noisy", "ask", "runtime.hello"} <= set(hello["methods"])
        finally:
            client.close(wait_process=10)  # closes the child's stdin: EOF
    assert client.process.returncode == 0
    log = err_path.read_text()
    assert "stray print" in log
    assert "SHUTDOWN-HOOK-RAN" in log and "SERVE-RETURNED" in log


@pytest.mark.timeout(30)
def test_stdio_server_stops_on_sigterm(tmp_path) -> None:
    err_path = tmp_path / "stderr.txt"
    with open(err_path, "wb") as err:
        client = Client.spawn_stdio([sys.executable, "-c", SCRIPT], cwd=ROOT, stderr=err.fileno(),
                                    default_timeout=10)
        assert client.call("add", {"a": 1}) == 1
        client.process.terminate()
        assert client.process.wait(10) == 0
        assert client.connection.wait_closed(5)
        client.close()
    assert "SHUTDOWN-HOOK-RAN" in err_path.read_text()


@pytest.mark.timeout(60)
def test_a_stdio_server_started_with_stdin_closed_still_stops_on_sigterm(tmp_path) -> None:
    """With fd 0 closed, the server's own wake-up socket took that number and was served as the
    peer; stopping closed it twice, the second close raised, and the server never counted as
    stopped: ``serve`` hung for good, SIGTERM included. Stopping now finishes whatever closing its
    own sockets says."""
    import subprocess

    from tests.support.waiting import wait_for

    script = textwrap.dedent("""
        import os, sys
        os.close(0)
        from castor.endpoint import Dispatcher, serve
        serve(Dispatcher(), stdio=True, on_ready=lambda server: print("READY", file=sys.stderr, flush=True))
        print("SERVE-RETURNED", file=sys.stderr, flush=True)
    """)
    err_path = tmp_path / "stderr.txt"
    with open(err_path, "wb") as err:
        proc = subprocess.Popen([sys.executable, "-c", script], cwd=ROOT, stdout=subprocess.PIPE,
                                stderr=err.fileno())
        try:
            wait_for(lambda: "READY" in err_path.read_text() or proc.poll() is not None, timeout=30,
                     what="the server to listen")
            proc.terminate()
            assert proc.wait(20) == 0, err_path.read_text()
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait(10)
            assert proc.stdout is not None
            proc.stdout.close()
    assert "SERVE-RETURNED" in err_path.read_text()

"""Endpoint bad input against a real ``python -m castor serve`` process with the full runtime.

* stdio (the harness's transport): wrong types, unknown methods, hostile
  session ids, a huge map and non-frame values all get typed errors on the
  same connection, and the runtime keeps serving it; undecodable bytes end
  the stream with an ``invalid_frame`` notification and a *clean* shutdown
  (stdio has one peer: its stream cannot be resynchronised, docs/protocol.md).
* Unix socket (several peers): random bytes, truncated frames, over-limit
  maps and strings each close only the hostile connection; a well-behaved
  client with an open session is served throughout and the process never dies.
"""

from __future__ import annotations

import random

import msgpack
import pytest

from castor.client import Client
from castor.messages.errors import CastorError, Forbidden, InvalidParams, NotFound, UnknownMethod

from .conftest import castor_argv, serve_env, wait_until

HOSTILE_SESSION_IDS = ["../x", "a/b", "a\x00b", "x" * 10240, "..", ".", "", "/etc", "a b"]


def _spawn_stdio(tmp_path, stderr_file) -> Client:
    return Client.spawn_stdio(castor_argv("serve", "--stdio"), env=serve_env(tmp_path), cwd=str(tmp_path),
                              stderr=stderr_file.fileno(), default_timeout=10)


def _error_codes(client: Client) -> list[str]:
    return [e.get("code") for e in client.errors]


@pytest.mark.timeout(30)
def test_stdio_bad_input_gets_typed_errors_and_the_runtime_keeps_serving(tmp_path):
    project = tmp_path / "project"
    project.mkdir()
    with open(tmp_path / "serve.stderr", "wb") as err:
        client = _spawn_stdio(tmp_path, err)
        try:
            assert client.call("runtime.hello")["name"] == "castor"
            with pytest.raises(UnknownMethod) as unknown:
                client.call("cast.teleport", {"to": "mars"})
            assert unknown.value.code == "unknown_method"

            # wrong types: typed invalid_params naming the field, never echoing the value
            for params in (
                {"session_id": 7, "cwd": str(project)},
                {"session_id": "ok", "cwd": {"a": 1}},
                {"session_id": ["x"], "cwd": None},
                {"session_id": "ok", "cwd": "/", "flags": "SECRET-FLAG"},
            ):
                with pytest.raises(InvalidParams) as bad:
                    client.call("session.open", params)
                assert "SECRET-FLAG" not in str(bad.value.to_wire())
            with pytest.raises(InvalidParams):
                client.call("harness.event", {"session_id": "ok", "event": "rm -rf", "data": {}})
            with pytest.raises(InvalidParams):
                client.call("harness.event", {"session_id": "ok", "event": "context", "data": [1, 2]})

            # hostile session ids: refused before any actor or file exists
            for sid in HOSTILE_SESSION_IDS:
                with pytest.raises(Forbidden) as bad:  # the one safe-id rule: forbidden, reason "invalid session_id"
                    client.call("session.open", {"session_id": sid, "cwd": str(project)})
                assert bad.value.code == "forbidden"
                with pytest.raises((Forbidden, NotFound, InvalidParams)):
                    client.call("harness.event", {"session_id": sid, "event": "context", "data": {}})
            assert client.call("ops.actors", {}) is not None
            assert list(project.iterdir()) == []

            # a huge map (60,000 unknown keys): one typed error, the connection stays usable
            huge = {f"k{i}": i for i in range(60_000)}
            with pytest.raises(InvalidParams) as bad:
                client.call("session.open", {"session_id": "ok", "cwd": str(project), **huge}, timeout=20)
            assert bad.value.code == "invalid_params"

            # well-formed msgpack that is not a frame: error notifications, connection kept
            for value in (42, {"a": 1}, [7, 7, 7], [0, "not-a-msgid", "runtime.hello", [{}]], [2, 5, [{}]]):
                client.connection.transport.sendall(msgpack.packb(value))
            wait_until(lambda: _error_codes(client).count("invalid_frame") >= 5, 10, "five invalid_frame notices")

            # and the runtime still serves the harness normally on the same stream
            opened = client.call("session.open", {"session_id": "good", "cwd": str(project)})
            assert opened["session_id"] == "good"
            assert client.call("harness.event", {"session_id": "good", "event": "session_start", "data": {}}) == {}
            assert client.call("session.close", {"session_id": "good"}) == {"closed": True}
            assert client.process.poll() is None

            # bytes that are not msgpack: notified, stream closed, runtime shut down cleanly (not crashed)
            client.connection.transport.sendall(b"\xc1\xc1" + random.Random(7).randbytes(256))
            wait_until(lambda: client.closed, 10, "the server to close the stream")
            assert client.process.wait(15) == 0
        finally:
            client.close(wait_process=10)
    assert client.errors and client.errors[-1]["code"] == "invalid_frame"
    assert "Traceback" not in (tmp_path / "serve.stderr").read_text(errors="replace")


def _request(msgid: int, method: str, params: dict) -> bytes:
    return msgpack.packb([0, msgid, method, [params]])


def _check_served(good: Client, server, n: int) -> None:
    """The good client's session still answers, and the process is alive."""
    assert server.alive(), "castor serve died"
    assert good.call("harness.event", {"session_id": "good", "event": "context", "data": {"n": n}}) == {}


@pytest.mark.timeout(40)
def test_hostile_socket_peers_lose_only_their_own_connection(socket_server, tmp_path):
    project = tmp_path / "project"
    project.mkdir()
    good = socket_server.client()
    try:
        good.call("session.open", {"session_id": "good", "cwd": str(project)})
        # a peer that leaves half a frame hanging must not hold anybody up
        lurker = socket_server.raw()
        lurker.send(_request(1, "runtime.hello", {"client": "lurker"})[:7])
        rng = random.Random(1234)
        valid = _request(9, "session.open", {"session_id": "x", "cwd": str(project)})
        destructive = {
            "random bytes": b"\xc1" + rng.randbytes(4096),
            "map header claiming 4 billion entries": b"\x94\x00\x01\xabruntime.hello\x91\xdf\xff\xff\xff\xff",
            # a header alone is only a promise: the unpacker buffer bound (16 MiB) ends it once data flows
            "str header claiming 4 GiB, then 17 MiB": b"\x94\x00\x01\xdb\xff\xff\xff\xff" + b"z" * (17 << 20),
            "map over the element limit": msgpack.packb([0, 1, "session.open", [{f"k{i}": 0 for i in range(70_000)}]]),
            "string over 8 MiB": msgpack.packb([0, 1, "session.open", [{"session_id": "s" * (9 << 20)}]]),
            "invalid utf-8 in a str": b"\x94\x00\x01\xa3\xff\xfe\xfd\x90",
        }
        for n, (name, payload) in enumerate(destructive.items()):
            peer = socket_server.raw()
            try:
                peer.send(payload)
            except (BrokenPipeError, ConnectionResetError):
                pass  # closed while we were still writing: that is the point
            values = peer.read(10)
            assert peer.eof, f"{name}: the hostile connection was not closed"
            notices = [v for v in values if isinstance(v, list) and v[:2] == [2, "error"]]
            assert all(v[2][0]["code"] == "invalid_frame" for v in notices), (name, values)
            peer.close()
            _check_served(good, socket_server, n)

        # truncated frames: half a request then end of stream; and a frame cut short mid-string
        for n, payload in enumerate((valid[: len(valid) // 2], valid[:-3])):
            peer = socket_server.raw()
            peer.send(payload)
            peer.sock.shutdown(1)  # SHUT_WR: end of stream after the truncated frame
            values = peer.read(10)
            assert peer.eof and not [v for v in values if isinstance(v, list) and v[:1] == [1]], values
            peer.close()
            _check_served(good, socket_server, 100 + n)

        # the lurker's connection is still open and unanswered; finishing its frame gets it served
        lurker.send(_request(1, "runtime.hello", {"client": "lurker"})[7:])
        answers = lurker.read(10, until=lambda vs: any(isinstance(v, list) and v[:2] == [1, 1] for v in vs))
        assert any(v[:2] == [1, 1] and v[2] is None and v[3]["name"] == "castor" for v in answers)
        lurker.close()
        assert socket_server.alive()
        tree = good.call("ops.actors", {})
        assert "good" in str(tree)
    finally:
        good.close()


@pytest.mark.timeout(30)
def test_one_connection_cannot_touch_another_connections_session(socket_server, tmp_path):
    project = tmp_path / "project"
    project.mkdir()
    owner, intruder = socket_server.client(), socket_server.client()
    try:
        owner.call("session.open", {"session_id": "mine", "cwd": str(project)})
        for method, params in (("harness.event", {"session_id": "mine", "event": "context", "data": {}}),
                               ("session.close", {"session_id": "mine"}),
                               ("icarus.config", {"session_id": "mine"})):
            with pytest.raises(CastorError) as denied:
                intruder.call(method, params)
            assert denied.value.code in ("forbidden", "not_found")
        intruder.close()
        assert owner.call("harness.event", {"session_id": "mine", "event": "context", "data": {}}) == {}
    finally:
        owner.close()

"""Another local user at ``castor serve --tcp``'s port, without the token: what the serve's log
tells the operator afterwards, at the default log level."""

from __future__ import annotations

import encodings.idna  # noqa: F401 - the forked peer of another uid cannot import it any more
import os
import re
import socket
import time

import msgpack
import pytest

from tests.support.other_user import NOBODY

from .conftest import free_port

pytestmark = pytest.mark.timeout(60)


def _as_nobody_guess_tokens(port: int, connections: int, tries: int) -> int:
    """Fork a process of uid ``NOBODY`` that opens ``connections`` connections to the port, each
    trying ``tries`` wrong tokens and reading the answers; returns the ports it connected from."""
    read_end, write_end = os.pipe()
    child = os.fork()
    if child == 0:  # pragma: no cover - the forked peer
        code = 1
        try:
            os.close(read_end)
            os.setgid(NOBODY)
            os.setuid(NOBODY)
            for c in range(connections):
                with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
                    os.write(write_end, sock.getsockname()[1].to_bytes(2, "big"))
                    for t in range(tries):
                        sock.sendall(msgpack.packb([0, t, "runtime.hello", [{"token": f"guess-{c}-{t}-" + "x" * 20}]]))
                    unpacker, answers = msgpack.Unpacker(raw=False), 0
                    while answers < tries and (chunk := sock.recv(65536)):
                        unpacker.feed(chunk)
                        answers += sum(1 for _ in unpacker)
            code = 0
        except BaseException as exc:  # noqa: BLE001 - said on stderr, the parent fails on the status
            os.write(2, f"the other user's peer failed: {exc!r}\n".encode())
        finally:
            os._exit(code)
    os.close(write_end)
    ports = []
    while chunk := os.read(read_end, 2):
        ports.append(int.from_bytes(chunk, "big"))
    os.close(read_end)
    _, status = os.waitpid(child, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    return ports[0]


@pytest.mark.skipif(os.geteuid() != 0, reason="another user's process needs root to fork")
def test_another_user_guessing_tokens_is_one_warning_naming_its_uid_and_how_many(tmp_path, serve):
    """Fifteen wrong tokens over five connections from another uid left no line at all in the
    serve's log at the default level (each closed connection is an INFO line): the operator could
    not tell anyone had tried. Now the first is a warning naming the peer's address and uid, and
    the rest within 10 s are counted on the next such warning, so guessing cannot fill the log."""
    port = free_port()
    served = serve(tmp_path, "--tcp", f"127.0.0.1:{port}")
    first_port = _as_nobody_guess_tokens(port, connections=5, tries=3)
    deadline = time.monotonic() + 5
    while "wrong token" not in served.log() and time.monotonic() < deadline:
        time.sleep(0.05)
    lines = [line for line in served.log().splitlines() if "token" in line and "listening on" not in line]
    assert len(lines) == 1, served.log()
    assert re.search(rf"WARNING .*runtime\.hello refused: missing or wrong token from tcp peer 127\.0\.0\.1:"
                     rf"{first_port} \(uid {NOBODY}\)", lines[0]), lines[0]

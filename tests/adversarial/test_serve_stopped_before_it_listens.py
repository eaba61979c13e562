"""``castor serve`` stopped by SIGTERM while it starts: after it has written its generated token
file, before it listens (it builds its runtime then, most of a second).

Python's default handler was still in place there: the process died on the spot (status -15, not
a word) and left its token file behind, a secret of a serve that never was. It now stops as on
Ctrl-C: the token files removed, ``castor: interrupted``, exit 143."""

from __future__ import annotations

import signal
import subprocess
import time
from pathlib import Path

import pytest

from tests.support.processes import killed_on_exit

from .conftest import CASTOR, castor_env

pytestmark = pytest.mark.timeout(180)


def _stopped_while_starting(tmp: Path, n: int) -> tuple[int, str] | None:
    """Start a serve and SIGTERM it as soon as its token file exists, if it does not listen yet
    (then its status and stderr); None when it listened first (the moment was missed)."""
    tokens = tmp / "xdg" / "castor"
    err = tmp / f"serve-{n}.stderr"
    with open(err, "wb") as stderr:
        proc = subprocess.Popen([*CASTOR, "serve", "--tcp", "127.0.0.1:0", "--console", "127.0.0.1:0"],
                                env=castor_env(tmp), cwd=str(tmp), stdin=subprocess.DEVNULL,
                                stdout=subprocess.DEVNULL, stderr=stderr)
    with killed_on_exit(proc):
        deadline = time.monotonic() + 30
        while not (tokens.is_dir() and any(tokens.iterdir())) and proc.poll() is None:
            assert time.monotonic() < deadline, "no token file within 30 s"
            time.sleep(0.001)
        if "listening on" in err.read_text():
            proc.wait(0) if proc.poll() is not None else proc.send_signal(signal.SIGTERM)
            proc.wait(30)
            return None
        proc.send_signal(signal.SIGTERM)
        status = proc.wait(30)
    said = err.read_text()
    return None if "listening on" in said else (status, said)


def test_a_serve_stopped_before_it_listens_removes_its_token_files_and_says_so(tmp_path):
    tokens = tmp_path / "xdg" / "castor"
    for n in range(5):
        stopped = _stopped_while_starting(tmp_path, n)
        if stopped is None:
            for leftover in tokens.iterdir():  # a serve that listened and stopped removes its own
                leftover.unlink()
            continue
        status, said = stopped
        assert status == 128 + signal.SIGTERM, (status, said)
        assert said.endswith("castor: interrupted\n"), said
        assert list(tokens.iterdir()) == []
        return
    pytest.skip("every serve listened before its token file was seen")

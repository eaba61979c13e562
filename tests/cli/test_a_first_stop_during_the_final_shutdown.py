"""``castor cast`` given its first stop signal (SIGTERM, Ctrl-C) while its runtime shuts down at the
end of a cast that completed by itself: the signal lands in the session's ``session_end`` handler,
run on the CLI's main thread.

It ends the process at once, as a second signal does during the shutdown, and it said so in a
second signal's words, ``castor: interrupted again; killed the commands still running``, to a
user who had pressed Ctrl-C once. It now says ``interrupted while shutting down``; "again" only
after a first stop. A real signal, sent by the CLI to itself from inside that handler."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.cli.interrupted_cast import ONE_SOCKET, REPO

pytestmark = pytest.mark.timeout(120)

_SIGNAL_IN_SESSION_END = r"""
import os, sys, threading
sig = int(sys.argv[1])
from castor.supervision import actor
real = actor.Actor.handle_envelope
def handle_envelope(self, envelope, handle, since=None):
    if threading.current_thread() is threading.main_thread() and envelope.type_name.endswith("session_end"):
        print("[test] signal inside session_end", file=sys.stderr, flush=True)
        os.kill(os.getpid(), sig)
    return real(self, envelope, handle, since)
actor.Actor.handle_envelope = handle_envelope
from castor.cli.app import main
sys.argv = ["castor", "cast", "x", "--agent", "script:answers.json", "--quiet"]
sys.exit(main())
"""


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT], ids=["sigterm", "ctrl-c"])
def test_a_first_stop_during_the_shutdown_is_not_called_a_second_one(tmp_path: Path, signum: int) -> None:
    import os

    root = tmp_path / "project"
    (root / ".pi").mkdir(parents=True)
    (root / ".pi" / "pi-materia.json").write_text(json.dumps(ONE_SOCKET))
    (root / "answers.json").write_text(json.dumps(["hi"]))
    env = {**os.environ, "PYTHONPATH": str(REPO), "CASTOR_AGENT": "", "HOME": str(tmp_path / "home"),
           "PI_MATERIA_PROFILE_DIR": str(tmp_path / "profile"), "MATERIA_CONFIG": ""}
    done = subprocess.run([sys.executable, "-c", _SIGNAL_IN_SESSION_END, str(int(signum))], cwd=root, env=env,
                          text=True, capture_output=True, timeout=90)
    assert "[test] signal inside session_end" in done.stderr, done.stderr
    assert done.returncode == 128 + signum, (done.returncode, done.stderr)
    assert "castor: interrupted while shutting down; killed the commands still running" in done.stderr, done.stderr
    assert "again" not in done.stderr, done.stderr

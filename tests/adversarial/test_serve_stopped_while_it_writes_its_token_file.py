"""``castor serve`` stopped (Ctrl-C, SIGTERM) at the worst moment of its start: while it writes a
token file it generated, the endpoint's or the console's, after the file exists and before its
content is on disk.

A real signal, sent by the serve process to itself from inside the file's ``fsync`` (the moment a
user's Ctrl-C can land on and no sleep-based sweep hits reliably). Ctrl-C raised there and left the
half-written file behind (its path not yet known to the code that removes it), and so did a SIGTERM
while the console's file was made: a secret of a serve that never was, in the runtime directory.
Now the signal is taken once the file's path is known: the file is removed, ``castor:
interrupted``, exit 130 / 143."""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

import pytest

from .conftest import castor_env

pytestmark = pytest.mark.timeout(120)

_SIGNAL_IN_FSYNC = r"""
import os, signal, sys
sig, label = int(sys.argv[1]), sys.argv[2]
real = os.fsync
def fsync(fd):
    try:
        name = os.path.basename(os.readlink(f"/proc/self/fd/{fd}"))
    except OSError:
        name = ""
    if name.startswith(label + "-") and name.endswith(".token"):
        os.kill(os.getpid(), sig)  # delivered before the next bytecode: inside the token file's making
    return real(fd)
os.fsync = fsync
from castor.cli.app import main
sys.argv = ["castor", *sys.argv[3:]]
sys.exit(main())
"""


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM], ids=["ctrl-c", "sigterm"])
@pytest.mark.parametrize("label", ["serve", "console"])
def test_a_stop_while_a_token_file_is_written_removes_it(tmp_path: Path, signum: int, label: str) -> None:
    flags = (["--tcp", "127.0.0.1:0"] if label == "serve"
             else ["--socket", str(tmp_path / "castor.sock"), "--console", "127.0.0.1:0"])
    done = subprocess.run([sys.executable, "-c", _SIGNAL_IN_FSYNC, str(int(signum)), label, "serve", *flags],
                          env=castor_env(tmp_path), cwd=str(tmp_path), stdin=subprocess.DEVNULL,
                          capture_output=True, text=True, timeout=90)
    assert done.returncode == 128 + signum, (done.returncode, done.stderr)
    assert done.stderr.endswith("castor: interrupted\n"), done.stderr
    assert "listening on" not in done.stderr
    tokens = tmp_path / "xdg" / "castor"
    assert sorted(p.name for p in tokens.iterdir()) == [], "a token file was left behind"

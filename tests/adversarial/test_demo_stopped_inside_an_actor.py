"""``castor demo`` stopped (SIGTERM, Ctrl-C) by a signal that lands while an actor's code runs on
the demo's main thread: the ``on_start`` of a CastActor its session starts there.

The actor took the ``Terminated`` (or ``KeyboardInterrupt``) raised there for its own crash: the
section failed ("crashed handling materia.session.start: KeyboardInterrupt"), the demo ran on to
its summary and exited 1, the stop lost. The first signal now always counts: it is held while the
actor code runs and raised once the main thread has left it: the demo stops, names what it kept
and exits 143 / 130.

A real signal, sent by the demo process to itself from inside that ``on_start`` (no sweep of
delays hits the moment reliably)."""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

import pytest

from .conftest import castor_env

pytestmark = pytest.mark.timeout(180)

_SIGNAL_IN_ON_START = r"""
import os, sys, threading
sig = int(sys.argv[1])
from castor.supervision import actor
real = actor.Actor._actor_loop_setup
def setup(self):
    if threading.current_thread() is threading.main_thread() and not getattr(setup, "sent", False):
        setup.sent = True
        print(f"[test] signal inside the on_start of {type(self).__name__}", file=sys.stderr, flush=True)
        os.kill(os.getpid(), sig)  # delivered before the next bytecode: inside the actor's code
    return real(self)
actor.Actor._actor_loop_setup = setup
from castor.cli.app import main
sys.argv = ["castor", "demo", "--quiet", "--workdir", sys.argv[2]]
sys.exit(main())
"""


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT], ids=["sigterm", "ctrl-c"])
def test_a_signal_inside_an_actors_code_on_the_main_thread_stops_the_demo(tmp_path: Path, signum: int) -> None:
    workdir = tmp_path / "demo"
    done = subprocess.run([sys.executable, "-c", _SIGNAL_IN_ON_START, str(int(signum)), str(workdir)],
                          env=castor_env(tmp_path), cwd=str(tmp_path), stdin=subprocess.DEVNULL,
                          capture_output=True, text=True, timeout=150)
    assert "[test] signal inside the on_start of" in done.stderr, done.stderr
    assert done.returncode == 128 + signum, (done.returncode, done.stdout[-2000:], done.stderr[-2000:])
    assert f"castor demo: stopped before its end; kept: {workdir}\n" in done.stderr, done.stderr
    assert done.stderr.endswith("castor: interrupted\n"), done.stderr
    assert "castor demo summary" not in done.stdout, done.stdout

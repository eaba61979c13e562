"""``castor demo`` stopped while an actor's code that never returns runs on its main thread.

A stop that lands while an actor's code runs on the demo's main thread is held until that code
returns (tests/adversarial/test_demo_stopped_inside_an_actor.py). Code that never returns (a hung
``on_start``, here) held it for ever: the demo neither stopped nor went on, and a second Ctrl-C
was raised inside that code, where the actor took it for its own crash. Now the hold is bounded:
a second stop, or the demo's shutdown timeout (10 s) of holding, cuts the demo loose -- it says
what it kept, which actor code was still running, ``castor: interrupted``, and exits with the
first stop's status.

A real process; the signal is sent by the demo to itself from inside the ``on_start`` of the
first actor started on its main thread, which then hangs (a test-only wrapper planted by the
script below, no hook of castor's)."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.support.processes import killed_on_exit

from .conftest import castor_env

pytestmark = pytest.mark.timeout(180)

_HANG_IN_ON_START = r"""
import os, sys, threading
sig = int(sys.argv[1])
from castor.supervision import actor
real = actor.Actor._actor_loop_setup
def setup(self):
    if threading.current_thread() is threading.main_thread() and not getattr(setup, "sent", False):
        setup.sent = True
        os.kill(os.getpid(), sig)  # delivered before the next bytecode: inside the actor's code
        print(f"[test] hanging in the on_start of {type(self).__name__}", file=sys.stderr, flush=True)
        threading.Event().wait()  # never returns
    return real(self)
actor.Actor._actor_loop_setup = setup
from castor.cli.app import main
sys.argv = ["castor", "demo", "--quiet", "--workdir", sys.argv[2]]
sys.exit(main())
"""


def _demo_hanging(tmp_path: Path, first: int) -> tuple[subprocess.Popen[str], Path]:
    workdir = tmp_path / "demo"
    proc = subprocess.Popen([sys.executable, "-c", _HANG_IN_ON_START, str(int(first)), str(workdir)],
                            env=castor_env(tmp_path), cwd=str(tmp_path), stdin=subprocess.DEVNULL,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    return proc, workdir


def _said_until_hanging(proc: subprocess.Popen[str]) -> str:
    said = ""
    assert proc.stderr is not None
    while "[test] hanging" not in said:
        line = proc.stderr.readline()
        assert line, said  # the demo ended before its on_start hung
        said += line
    return said


def _check_cut_loose(said: str, workdir: Path) -> None:
    assert f"castor demo: stopped before its end; kept: {workdir}\n" in said, said
    assert "castor: cut loose: the on_start of " in said and "was still running on the main thread" in said, said
    assert said.endswith("castor: interrupted\n"), said


@pytest.mark.parametrize(("first", "second"), [(signal.SIGTERM, signal.SIGTERM), (signal.SIGINT, signal.SIGINT),
                                               (signal.SIGHUP, signal.SIGTERM)],
                         ids=["sigterm-twice", "ctrl-c-twice", "sighup-then-sigterm"])
def test_a_second_stop_cuts_loose_a_demo_whose_held_stop_waits_for_a_hung_on_start(tmp_path: Path, first: int,
                                                                                   second: int) -> None:
    proc, workdir = _demo_hanging(tmp_path, first)
    with killed_on_exit(proc):
        said = _said_until_hanging(proc)
        proc.send_signal(second)
        out, rest = proc.communicate(timeout=30)  # before: no end (or the second Ctrl-C taken for a crash)
    said += rest
    assert proc.returncode == 128 + first, (proc.returncode, out[-2000:], said[-3000:])
    _check_cut_loose(said, workdir)
    assert "when a second stop came" in said, said
    assert "castor demo summary" not in out, out


def test_a_held_stop_cuts_the_demo_loose_after_its_shutdown_timeout(tmp_path: Path) -> None:
    proc, workdir = _demo_hanging(tmp_path, signal.SIGTERM)
    with killed_on_exit(proc):
        said = _said_until_hanging(proc)
        hung_at = time.monotonic()
        out, rest = proc.communicate(timeout=60)  # before: never (the stop held for ever)
        waited = time.monotonic() - hung_at
    said += rest
    assert proc.returncode == 128 + signal.SIGTERM, (proc.returncode, out[-2000:], said[-3000:])
    _check_cut_loose(said, workdir)
    assert "for 10 s after the stop" in said, said
    assert 9.0 <= waited < 40, waited

"""OS-process checks shared by the tests."""

from __future__ import annotations

import contextlib
import subprocess
from collections.abc import Iterator

import psutil


def process_gone(pid: int) -> bool:
    """True when the process no longer runs (absent, or a zombie awaiting reaping); race-free:
    one psutil call, so a process reaped in between cannot raise."""
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


@contextlib.contextmanager
def killed_on_exit(proc: subprocess.Popen) -> Iterator[subprocess.Popen]:
    """Yield ``proc``; whatever the block did, a process still running after it is killed and reaped
    (so a failed assertion never leaves a server behind)."""
    try:
        yield proc
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)


def terminate_then_kill(proc: subprocess.Popen, grace_s: float = 15.0) -> int | None:
    """End ``proc`` as an operator would: SIGTERM, then SIGKILL if it has not exited within
    ``grace_s``; reaped either way. Its exit status (negative: the signal that ended it)."""
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(grace_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)
    return proc.returncode

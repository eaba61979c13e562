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

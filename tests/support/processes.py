"""OS-process checks shared by the tests."""

from __future__ import annotations

import psutil


def process_gone(pid: int) -> bool:
    """True when the process no longer runs (absent, or a zombie awaiting reaping); race-free:
    one psutil call, so a process reaped in between cannot raise."""
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True

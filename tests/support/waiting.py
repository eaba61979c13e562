"""Deadline-bounded waits for state that has no event of its own (files, processes, other actors).

Two shapes, one implementation each: :func:`wait_for` returns the predicate's truthy value or
fails the test with what it waited for; :func:`poll_until` answers True/False for tests that
assert on it themselves.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any


def wait_for(predicate: Callable[[], Any], timeout: float = 10.0, what: str = "condition",
             interval: float = 0.005) -> Any:
    """The predicate's first truthy value; AssertionError naming ``what`` at the deadline."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() >= deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(interval)


def poll_until(predicate: Callable[[], Any], timeout: float = 5.0, interval: float = 0.005) -> bool:
    """True once the predicate holds, False if it still does not at the deadline."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(interval)
    return bool(predicate())

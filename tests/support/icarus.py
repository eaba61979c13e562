"""Small helpers shared by the Icarus test areas (session, security, conformance).

``RecordingUi`` is a TEST FAKE of SessionUiPort; the rest read real files and
real processes.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psutil


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def gone(pid: int) -> bool:
    """True when the process no longer runs (absent, or a zombie awaiting reaping)."""
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def wait_until(predicate: Callable[[], Any], timeout: float = 10.0, what: str = "condition") -> Any:
    """Deadline-bounded wait for a condition that has no event of its own; returns its value."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() >= deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.005)


class RecordingUi:
    """TEST FAKE of SessionUiPort: records every call in order."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, Any]] = []
        self._lock = threading.Lock()

    def send_message(self, custom_type: str, content: str, *, display: bool, trigger_turn: bool = False) -> None:
        with self._lock:
            self.calls.append(("message", {"custom_type": custom_type, "content": content, "display": display,
                                           "trigger_turn": trigger_turn}))

    def set_status(self, key: str, text: str | None) -> None:
        with self._lock:
            self.calls.append(("status", (key, text)))

    def notify(self, message: str, level: str = "info") -> None:
        with self._lock:
            self.calls.append(("notify", (message, level)))

    def of(self, kind: str) -> list[Any]:
        with self._lock:
            return [v for k, v in self.calls if k == kind]

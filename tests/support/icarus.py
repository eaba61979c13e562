"""Small helpers shared by the Icarus test areas (session, security, conformance).

``RecordingUi`` is a TEST FAKE of SessionUiPort; the rest read real files and
real processes.
"""

from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import Any

from tests.support.processes import process_gone as gone  # noqa: F401 - re-exported for the Icarus tests
from tests.support.waiting import wait_for as wait_until  # noqa: F401 - re-exported for the Icarus tests


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


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

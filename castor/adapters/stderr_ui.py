"""A SessionUiPort for standalone runs (``castor cast``, ``castor recast``): text on stderr.

Guarantees: never raises (a broken stderr is ignored); thread-safe (one lock around each
write). ``printer`` replaces the default writer (the CLI routes through its rich console so
live progress and notifications do not garble each other).
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Callable

from castor.shown import lines_kept, one_line


class StderrUi:
    def __init__(self, printer: Callable[[str], None] | None = None) -> None:
        self._printer = printer
        self._lock = threading.Lock()
        self.statuses: dict[str, str] = {}
        self.notifications: list[tuple[str, str]] = []
        #: Applied to each notification's text before it is kept and shown (None: as is). The CLI
        #: sets it so that a ``castor continue ID`` castor's own message names carries the flags its
        #: user typed (``--cwd``, ``--agent``): typed as shown, it finds the same cast and agent.
        self.spell: Callable[[str], str] | None = None

    def _write(self, line: str) -> None:
        with self._lock:
            try:
                if self._printer is not None:
                    self._printer(line)
                else:
                    sys.stderr.write(line + "\n")
                    sys.stderr.flush()
            except Exception:  # noqa: BLE001 - UI output must never fail a run
                pass

    def notify(self, message: str, level: str = "info", *, code: str | None = None) -> None:
        if self.spell is not None:
            message = self.spell(message)
        self.notifications.append((level, message))
        self._write(f"[{level}] {one_line(message)}")  # one line: no forged line after it

    def set_status(self, key: str, text: str | None) -> None:
        if text is None:
            self.statuses.pop(key, None)
        else:
            self.statuses[key] = text

    def send_message(self, custom_type: str, content: str, *, display: bool, trigger_turn: bool = False) -> None:
        if display:
            self._write(lines_kept(content))

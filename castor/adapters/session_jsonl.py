"""Standalone SessionPort: custom session entries appended to a local JSONL file.

Used when castor runs without a harness (``castor demo``, ``castor cast``):
it stands in for Pi's ``appendEntry``. Each entry is one line
``{"type": "custom", "customType", "data", "timestamp"}``.

Guarantees: one complete line per entry, written with a single ``write`` on
an ``O_APPEND`` descriptor and fsynced before :meth:`append_entry` returns
(the acknowledgement); appends from threads of this process are serialised.
A torn tail left by a crash is sealed so it never fuses with a new entry.
Failure: a passed deadline raises :class:`Timeout` before anything is
written; an unserialisable value raises :class:`InvalidParams` before
anything is written; OS errors propagate as ``OSError``.
"""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path
from typing import Any

from castor.adapters.fs import append_json_line, ensure_dir, read_json_lines
from castor.domain.timestamps import iso_now_ms
from castor.messages.errors import InvalidParams, Timeout


class JsonlSessionLog:
    """Append-only session entries in ``path`` (parent directories are created)."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        self._lock = threading.Lock()

    def append_entry(self, custom_type: str, data: dict[str, Any], deadline: float, *,
                     expires: bool = False) -> None:
        """One line, written only while ``deadline`` has not passed (checked under the lock, just
        before the write): every entry here expires at its deadline, ``expires`` or not."""
        if not isinstance(custom_type, str) or not custom_type:
            raise InvalidParams("custom_type must be a non-empty string")
        record = {
            "type": "custom",
            "customType": custom_type,
            "data": data,
            "timestamp": iso_now_ms(),
        }
        with self._lock:
            if time.monotonic() >= deadline:
                raise Timeout("session entry not written: deadline passed", may_have_started=False)
            ensure_dir(self.path.parent)
            try:
                append_json_line(self.path, record)
            except (TypeError, ValueError) as exc:
                raise InvalidParams("session entry is not JSON-serialisable") from exc

    def entries(self, custom_type: str | None = None) -> list[dict[str, Any]]:
        """Every readable entry (optionally of one custom type), in append order."""
        if not self.path.exists():
            return []
        rows = [r for r in read_json_lines(self.path).records if isinstance(r, dict)]
        return [r for r in rows if custom_type is None or r.get("customType") == custom_type]

"""Run directories pi-materia itself wrote, as a listing shows them.

pi-materia keeps a cast's state in the harness's session file, not beside its artifacts: its run
directory holds ``events.jsonl`` (and the artifacts) but no ``state.json``. A project that ran
pi-materia before castor has such directories under the same artifact root. castor cannot resume
them (it has no state to resume from), but it can say what they were, as pi-materia's own
``casts`` does when the session's state is not at hand: the status from the events (``cast_end``'s
``ok``; an error naming an abort is an abort; no ``cast_end``: active or unknown), the socket of
the latest ``socket_start`` / ``socket_complete`` / ``materia_model_settings`` event, and the
request of ``cast_start``.

Guarantees: reads at most :data:`HEAD_BYTES` from the start of ``events.jsonl`` and
:data:`TAIL_BYTES` from its end, whatever its size; never follows a symlink in place of the file
(``O_NOFOLLOW``), never waits on a FIFO (``O_NONBLOCK``, regular files only); never raises -- a
file it cannot read describes nothing (``None``); a directory castor made (its lease file is there)
is never taken for pi-materia's, whatever became of its ``state.json``. What it does not do: tell a run pi-materia is
still writing from one that stopped (both read "active or unknown").
"""

from __future__ import annotations

import json
import os
import stat
from dataclasses import dataclass
from typing import Any

from castor.adapters.materia.artifacts import CastArtifacts
from castor.adapters.materia.cast_lease import LEASE_FILE

HEAD_BYTES = 1 << 20  # cast_start carries the prepared loadout: allow a large one
TAIL_BYTES = 256 * 1024
_PROGRESS = ("socket_start", "socket_complete", "materia_model_settings")


@dataclass(frozen=True)
class PiMateriaRun:
    """What a pi-materia run directory's events say."""

    outcome: str  # "complete", "failed", "aborted", or "active or unknown"
    socket: str | None
    request: str | None
    error: str | None

    def reason(self) -> str:
        """The listing's ``failed_reason`` for it: whose run it is, why castor cannot resume it,
        and how it stands."""
        where = f" at {self.socket}" if self.socket else ""
        said = f": {self.error}" if self.error else ""
        return f"a pi-materia run (no castor state; not resumable here): {self.outcome}{where}{said}"


def _records(chunk: bytes, *, whole_first: bool) -> list[dict[str, Any]]:
    """The JSON objects of ``chunk``'s lines (the first, partial line dropped unless the chunk
    starts the file); lines that are not event records are skipped."""
    lines = chunk.split(b"\n")
    if not whole_first:
        lines = lines[1:]
    records = []
    for line in lines:
        try:
            record = json.loads(line)
        except (ValueError, RecursionError):
            continue
        if isinstance(record, dict) and isinstance(record.get("type"), str):
            records.append(record)
    return records


def _text(data: object, key: str) -> str | None:
    value = data.get(key) if isinstance(data, dict) else None
    return value if isinstance(value, str) else None


def describe(run_dir: str) -> PiMateriaRun | None:
    """The run in ``run_dir`` as its ``events.jsonl`` tells it; None when there is no such file,
    it is not a regular file, or it holds no event record, or castor made the directory."""
    if os.path.lexists(f"{run_dir}/{LEASE_FILE}"):
        return None
    try:
        fd = os.open(f"{run_dir}/{CastArtifacts.EVENTS}",
                     os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | getattr(os, "O_NOFOLLOW", 0))
    except OSError:
        return None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            return None
        size = st.st_size
        head = os.pread(fd, min(size, HEAD_BYTES), 0)
        tail_at = max(0, size - TAIL_BYTES)
        tail = head if tail_at == 0 else os.pread(fd, TAIL_BYTES, tail_at)
    except OSError:
        return None
    finally:
        os.close(fd)
    first = _records(head.split(b"\n", 1)[0], whole_first=True)
    records = _records(tail, whole_first=tail_at == 0)
    if not first and not records:
        return None
    request = next((_text(r.get("data"), "request") for r in first if r["type"] == "cast_start"), None)
    socket = next((_text(r.get("data"), "socket") for r in reversed(records) if r["type"] in _PROGRESS), None)
    outcome, error = "active or unknown", None
    end = next((r for r in reversed(records) if r["type"] == "cast_end"), None)
    if end is not None:
        data = end.get("data") if isinstance(end.get("data"), dict) else {}
        if data.get("ok") is True:
            outcome = "complete"
        else:
            error = _text(data, "error")
            outcome = "aborted" if error is not None and "abort" in error.lower() else "failed"
    return PiMateriaRun(outcome=outcome, socket=socket, request=request, error=error)

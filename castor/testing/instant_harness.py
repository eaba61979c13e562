"""A harness session over castor's endpoint that answers every agent turn at once.

For benchmarks and tests of a long-lived server (``bench/longrun.py``, the retention test): one
connection, ``runtime.hello`` and ``session.open`` on it, every ``agent.run_turn`` answered with
``agent.turn_ended`` (off the client's reader thread), and a cast's end seen in the session log
entry the runtime appends. It keeps nothing per finished cast.
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

from castor.client import Client


class InstantHarness:
    """One harness session on ``client``: answers turns at once, sees its casts end."""

    def __init__(self, client: Client, sid: str, project: Path, *, client_name: str) -> None:
        self.client = client
        self.sid = sid
        self._ended: dict[str, threading.Event] = {}
        self._lock = threading.Lock()
        client.on_notification("agent.run_turn", self._run_turn)
        client.on_request("session.append_entry", self._entry)
        for name in ("ui.notify", "ui.status", "message.send"):
            client.on_notification(name, lambda _p: None)
        client.call("runtime.hello", {"client": client_name})
        client.call("session.open", {"session_id": sid, "cwd": str(project), "trusted": True})

    def _event(self, cast_id: str) -> threading.Event:
        with self._lock:
            return self._ended.setdefault(cast_id, threading.Event())

    def _run_turn(self, params: dict[str, Any]) -> None:
        def answer() -> None:
            self.client.call("agent.turn_ended", {"session_id": self.sid, "turn_id": params["turn_id"],
                                                  "text": "done", "stop_reason": "stop"})

        threading.Thread(target=answer, daemon=True).start()  # not on the client's reader thread

    def _entry(self, params: dict[str, Any]) -> dict[str, Any]:
        data = params.get("data") or {}
        if data.get("phase") in ("complete", "failed") and data.get("castId"):
            self._event(data["castId"]).set()
        return {"ok": True, "entry_id": "e"}

    def cast(self, request: str, *, timeout_s: float) -> str:
        """Start a cast and wait for it to end; its id. ``RuntimeError`` if it did not end in time."""
        cast_id: str = self.client.call("cast.start", {"session_id": self.sid, "request": request})["cast_id"]
        if not self._event(cast_id).wait(timeout_s):
            raise RuntimeError(f"cast {cast_id} did not end")
        with self._lock:
            self._ended.pop(cast_id, None)
        return cast_id

    def close(self) -> None:
        self.client.call("session.close", {"session_id": self.sid})
        self.client.close()

"""Mirror cast state records into the harness session log without blocking any actor.

pi-materia appended a cast-state snapshot to the Pi session on every save. castor's durable
record is ``state.json``; the session entry is a mirror for the harness. Appending it is a
round trip to the harness (``session.append_entry``), and the harness may be waiting on this
very runtime (an endpoint reader running a ``cast.status`` handler) — so a CastActor must never
wait for it. :class:`SessionMirror` queues records and appends them in order on one daemon
thread per session.

Guarantees: records of one session are appended in submission order; ``submit`` never blocks
(beyond a lock); at most ``limit`` records wait — beyond that the oldest are dropped and
counted in ``dropped`` (state.json still has everything); append failures are never raised and
logged once per spell -- the first as a warning, the rest of the spell at debug level, and the
first append that succeeds again says how many were not recorded (a log that stays refused, a
planted link or a full disk, would otherwise put the same warning on stderr for every entry of
every transition); ``close()`` lets queued records drain for up to ``drain_s`` seconds.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from typing import Any

from castor._log import logger
from castor.supervision.threads import start_thread

DEADLINE_S = 5.0


class SessionMirror:
    def __init__(self, session_log: Any, *, name: str, limit: int = 1000) -> None:
        self.session_log = session_log
        self.limit = limit
        self.dropped = 0
        self.appended = 0
        self.failing = 0  # entries not recorded since the last one that was
        self._queue: deque[tuple[str, dict[str, Any]]] = deque()
        self._cond = threading.Condition()
        self._closed = False
        self._log = logger.bind(actor=f"{name}/session-mirror")
        self._thread = start_thread(self._run, name=f"session-mirror:{name}", owner=name,
                                    purpose="appends the session log entries in order")

    def submit(self, custom_type: str, data: dict[str, Any]) -> None:
        with self._cond:
            if self._closed:
                return
            self._queue.append((custom_type, data))
            while len(self._queue) > self.limit:
                self._queue.popleft()
                self.dropped += 1
            self._cond.notify()

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._queue and not self._closed:
                    self._cond.wait()
                if not self._queue:
                    return
                custom_type, data = self._queue.popleft()
            try:
                self.session_log.append_entry(custom_type, data, time.monotonic() + DEADLINE_S)
            except Exception as exc:  # noqa: BLE001 - a mirror failure never fails a cast
                self.failing += 1
                if self.failing == 1:
                    self._log.warning("session entry {t} not recorded: {exc} (the next failures are logged at "
                                      "debug level until an entry is recorded again)", t=custom_type, exc=exc)
                else:
                    self._log.debug("session entry {t} not recorded: {exc}", t=custom_type, exc=exc)
                continue
            self.appended += 1
            if self.failing:
                self._log.info("session entries are recorded again ({n} were not)", n=self.failing)
                self.failing = 0

    def close(self, drain_s: float = 2.0) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify()
        self._thread.join(drain_s)

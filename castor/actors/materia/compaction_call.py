"""One host compaction under a deadline, answered exactly once (used by CastActor and SocketActor).

:class:`CompactionCall` wraps :meth:`HostContextPort.compact` so the actor that asked never waits:

| what happens first | ``deliver`` gets |
|---|---|
| the port replies | its :class:`CompactionOutcome` |
| the deadline passes | ``ok=False``, "host compaction timed out after Ns" (a late reply is dropped) |
| the port raises instead of replying | ``ok=False``, "could not start the host compaction: …" |
| :meth:`cancel` (abort, the actor stops) | nothing, ever |

Guarantees: ``deliver`` runs at most once, never on the caller's stack of :meth:`start`, and never
after :meth:`cancel` returned. ``deliver`` should only tell an actor (a mailbox put); an error it
raises is logged and swallowed.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

from castor._log import logger
from castor.ports.host_context import CompactionOutcome, CompactionRequest, HostContextPort
from castor.supervision.timers import CancelToken, call_later

Deliver = Callable[[CompactionOutcome], None]


class CompactionCall:
    def __init__(self, port: HostContextPort, request: CompactionRequest, *, timeout_s: float,
                 deliver: Deliver) -> None:
        self.port = port
        self.request = request
        self.timeout_s = timeout_s
        self._deliver = deliver
        self._lock = threading.Lock()
        self._done = False
        self._timer: CancelToken | None = None  # the deadline, armed by start()

    def start(self) -> CompactionCall:
        self._timer = call_later(self.timeout_s, self._expire, owner=f"compaction/{self.request.cast_id}")
        try:
            self.port.compact(self.request, self._settle, timeout_s=self.timeout_s)
        except Exception as exc:  # noqa: BLE001 - a port must not raise; if it does, it is an outcome
            from castor.supervision.threads import start_thread  # only this rare path starts a thread

            outcome = CompactionOutcome.failed(f"could not start the host compaction: {exc}")
            start_thread(self._settle, args=(outcome,), name=f"compaction-failed-{self.request.cast_id}",
                         owner=f"cast {self.request.cast_id}", purpose="reports a compaction that could not start")
        return self

    def cancel(self) -> None:
        """Stop waiting: nothing is delivered after this returns (the host may still compact)."""
        with self._lock:
            self._done = True
        if self._timer is not None:
            self._timer.cancel()

    @property
    def done(self) -> bool:
        return self._done

    def _expire(self) -> None:
        self._settle(CompactionOutcome.failed(f"host compaction timed out after {self.timeout_s:g}s"))

    def _settle(self, outcome: CompactionOutcome) -> None:
        with self._lock:
            if self._done:
                return
            self._done = True
            # Delivered under the lock so a cancel() that returned can never be followed by a
            # delivery; deliver only puts a message in a mailbox.
            if self._timer is not None:
                self._timer.cancel()
            try:
                self._deliver(outcome)
            except Exception as exc:  # noqa: BLE001 - the outcome's recipient may be gone; nothing to tell
                logger.debug("compaction outcome for {cast} had nowhere to go: {exc}", cast=self.request.cast_id,
                             exc=exc)

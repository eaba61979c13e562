"""Exactly-once, off-stack replies for in-flight agent turns (shared by the adapters).

``TurnBook`` is the bookkeeping every AgentPort adapter needs:

- ``accept`` registers a turn (``Conflict`` for a duplicate in-flight id,
  ``ActorStopped`` once closed);
- ``settle`` delivers the outcome at most once, on the book's own small
  thread pool (never on the caller's stack) — or at once, on the settling
  thread, for a reply marked :func:`~castor.ports.agent.enqueues_only`
  (it only tells an actor, so no thread hop is needed); a second settle is a no-op;
- ``cancel`` settles with an ``aborted``/``cancelled`` outcome and runs the
  turn's cancel hook (so the adapter can stop its timer or socket);
- ``close`` cancels everything in flight, then stops the pool.

A reply callback that raises is logged and swallowed: one bad caller cannot
break the adapter for others.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from castor._log import logger
from castor.messages.errors import ActorStopped, Conflict
from castor.ports.agent import ErrorKind, TurnError, TurnOutcome, TurnReply, TurnRequest, may_reply_inline
from castor.supervision.threads import start_thread

__all__ = ["TurnBook", "cancelled_outcome", "error_outcome"]


def error_outcome(turn_id: str, message: str, kind: ErrorKind, **fields: Any) -> TurnOutcome:
    return TurnOutcome(turn_id=turn_id, stop_reason="error", error=TurnError(message=message, kind=kind, **fields))


def cancelled_outcome(turn_id: str) -> TurnOutcome:
    return TurnOutcome(
        turn_id=turn_id, stop_reason="aborted", error=TurnError(message="agent turn cancelled", kind="cancelled")
    )


class _Pending:
    __slots__ = ("request", "reply", "on_cancel")

    def __init__(self, request: TurnRequest, reply: TurnReply) -> None:
        self.request = request
        self.reply = reply
        self.on_cancel: Callable[[], None] | None = None


class TurnBook:
    def __init__(self, name: str, *, max_workers: int = 2) -> None:
        self._name = name
        self._lock = threading.Lock()
        self._pending: dict[str, _Pending] = {}
        self._closed = False
        self._pool = ThreadPoolExecutor(max_workers=max_workers, thread_name_prefix=f"{name}-reply")

    def accept(self, request: TurnRequest, reply: TurnReply) -> None:
        with self._lock:
            if self._closed:
                raise ActorStopped(f"{self._name} agent adapter is closed", may_have_started=False)
            if request.turn_id in self._pending:
                raise Conflict(f"turn {request.turn_id} is already in flight", data={"turn_id": request.turn_id})
            self._pending[request.turn_id] = _Pending(request, reply)

    def set_cancel_hook(self, turn_id: str, hook: Callable[[], None]) -> bool:
        """Attach a hook run on cancel; False if the turn is no longer pending."""
        with self._lock:
            pending = self._pending.get(turn_id)
            if pending is None:
                return False
            pending.on_cancel = hook
            return True

    def is_pending(self, turn_id: str) -> bool:
        with self._lock:
            return turn_id in self._pending

    def in_flight(self) -> list[str]:
        with self._lock:
            return list(self._pending)

    def _deliver(self, pending: _Pending, outcome: TurnOutcome) -> None:
        try:
            pending.reply(outcome)
        except Exception:  # noqa: BLE001 - a caller's bug must not kill the adapter
            logger.bind(adapter=self._name, turn_id=outcome.turn_id).exception("agent reply callback raised")

    def settle(self, turn_id: str, outcome: TurnOutcome) -> bool:
        """Deliver ``outcome`` if the turn is still pending; True if delivered."""
        with self._lock:
            pending = self._pending.pop(turn_id, None)
            if pending is None:
                return False
            if not may_reply_inline(pending.reply):
                try:
                    self._pool.submit(self._deliver, pending, outcome)
                except RuntimeError:
                    # Pool already shut down (close raced us): still never reply on the caller's stack.
                    start_thread(self._deliver, args=(pending, outcome), name="agent-turn-reply", owner="agent",
                                 purpose="delivers a turn's outcome after the pool closed")
                return True
        self._deliver(pending, outcome)  # an enqueue-only reply: outside the lock, on this thread
        return True

    def cancel(self, turn_id: str) -> bool:
        with self._lock:
            pending = self._pending.get(turn_id)
            hook = pending.on_cancel if pending else None
        delivered = self.settle(turn_id, cancelled_outcome(turn_id))
        if delivered and hook is not None:
            try:
                hook()
            except Exception:  # noqa: BLE001 - a broken reply callback must not stop the turn book
                logger.bind(adapter=self._name, turn_id=turn_id).exception("agent cancel hook raised")
        return delivered

    def close(self) -> None:
        with self._lock:
            self._closed = True
            ids = list(self._pending)
        for turn_id in ids:
            self.cancel(turn_id)
        # wait=False: close may be called from a reply callback (a pool thread).
        self._pool.shutdown(wait=False)

"""One cancel token, and timers as messages: a delayed ``tell`` that can be called off.

Guarantees:

* **A cancel token is one-shot and idempotent.** :meth:`CancelToken.cancel` runs each armed
  callback exactly once, on the cancelling thread, outside the token's lock; a callback armed
  after the cancellation is refused (``on_cancel`` returns False), so the caller knows not to
  start what it would have to call off.
* **A timer is a message.** :func:`tell_later` tells ``message`` to a handle once ``delay``
  seconds have passed, from one shared daemon thread (``castor-timers``); the handler runs on
  the actor's own thread like any message, so a timer never races the actor's state. The
  returned token cancels it: a timer cancelled before it fires is never told.
* **A timer never fails its scheduler.** A tell that the handle refuses (the actor is gone,
  its mailbox closed or full) is dropped and logged at debug level: a timer's target that
  went away has nothing to be reminded of. A callback that raises anything else (even
  ``SystemExit``) is logged; the thread goes on. A delay that is NaN, infinite or past
  ``threading.TIMEOUT_MAX`` is refused ``invalid_params`` when the timer is set.

Not guaranteed: a timer fires no earlier than its delay, but it may fire later under load
(one thread serves every timer, in deadline order), and a cancel that races the firing may
come too late (the message is then in the mailbox; handlers check that it is still wanted,
as for any message).
"""

from __future__ import annotations

import heapq
import itertools
import os
import threading
import time
import weakref
from typing import Any, Callable, Protocol

from castor._log import logger
from castor.messages.errors import CastorError, InvalidParams
from castor.supervision.threads import start_thread

_GUARD = threading.Lock()
"""Guards the arming state of every :class:`CancelToken` (see there)."""


class CancelToken:
    """Cancels one piece of work from any thread (a call, a wait, a timer).

    Made, armed and disarmed once per worker call, so the common case is kept cheap: no lock
    or list of its own. One callback is held in a slot (what nearly every token carries),
    further ones in a list made only when needed. Every read-modify-write of that state takes
    one process-wide guard lock: the critical sections are a few attribute stores and never
    call out (callbacks run after it is released), so the guard is uncontended in practice
    and cannot take part in a deadlock.
    """

    __slots__ = ("_cancelled", "_callback", "_more")

    def __init__(self) -> None:
        self._cancelled = False
        self._callback: Callable[[], None] | None = None  # the first armed callback
        self._more: list[Callable[[], None]] | None = None  # the others, in arming order

    @property
    def cancelled(self) -> bool:
        return self._cancelled

    def cancel(self) -> None:
        """Cancel (idempotent): every armed callback runs once, here, outside the lock, in the
        order they were armed."""
        with _GUARD:
            if self._cancelled:
                return
            self._cancelled = True
            first, more = self._callback, self._more
            self._callback = self._more = None
        if first is not None:
            first()
        if more:
            for callback in more:
                callback()

    def on_cancel(self, callback: Callable[[], None]) -> bool:
        """Arm ``callback`` for the cancellation; False (not armed) when already cancelled."""
        with _GUARD:
            if self._cancelled:
                return False
            if self._callback is None and not self._more:  # the slot runs first: keep the order
                self._callback = callback
            elif self._more is None:
                self._more = [callback]
            else:
                self._more.append(callback)
            return True

    def disarm(self, callback: Callable[[], None]) -> None:
        """Forget an armed ``callback`` (the work it would call off is over); one arming of it
        per call, as :meth:`on_cancel` armed it."""
        with _GUARD:
            slot = self._callback
            # Equal, not only the same object: a bound method is a new object at every lookup.
            if slot is not None and (slot is callback or slot == callback):
                self._callback = None
            elif self._more:
                try:
                    self._more.remove(callback)
                except ValueError:
                    pass

    def wake(self, event: threading.Event) -> None:
        """Set ``event`` on cancellation (at once when already cancelled): for waiters."""
        if not self.on_cancel(event.set):
            event.set()


def _reset_guard() -> None:
    """In a forked child: a guard held by a thread of the parent would never be released."""
    global _GUARD
    _GUARD = threading.Lock()


os.register_at_fork(after_in_child=_reset_guard)


class Tellable(Protocol):
    """What a timer tells: an actor handle (anything with ``tell``)."""

    @property
    def path(self) -> str: ...

    def tell(self, message: Any) -> None: ...


class Timers:
    """A heap of delayed tells (and short callbacks) served by one daemon thread, started on first use.

    A callback runs on that thread, so it must be short (set a flag, close a socket, tell an
    actor); anything longer belongs in an actor the callback tells.
    """

    def __init__(self, name: str = "castor-timers") -> None:
        self.name = name
        self._lock = threading.Condition(threading.Lock())
        self._heap: list[tuple[float, int, Callable[[], object], str, CancelToken]] = []
        self._order = itertools.count()
        self._thread: threading.Thread | None = None
        me = weakref.ref(self)
        os.register_at_fork(after_in_child=lambda: _reset(me()))

    def tell_later(self, handle: Tellable, message: Any, delay: float) -> CancelToken:
        """Tell ``message`` to ``handle`` after ``delay`` seconds; cancel the token to call it off."""
        return self.call_later(delay, lambda: handle.tell(message), owner=handle.path)

    def call_later(self, delay: float, callback: Callable[[], object], *, owner: str = "/root") -> CancelToken:
        """Run ``callback`` on the timer thread after ``delay`` seconds (short work only: see the
        class doc); cancel the token to call it off. A typed error it raises is logged and dropped."""
        if not delay <= threading.TIMEOUT_MAX:  # NaN fails this too
            # A NaN would break the heap's order (timers fired early or late), and a wait past
            # what a lock can be given would end the timer thread, every timer with it.
            raise InvalidParams(f"a timer's delay must be a number of seconds up to {threading.TIMEOUT_MAX:.0f}, "
                                f"not {delay!r}", data={"delay": repr(delay)})
        token = CancelToken()
        due = time.monotonic() + max(delay, 0.0)
        with self._lock:
            heapq.heappush(self._heap, (due, next(self._order), callback, owner, token))
            if self._thread is None:
                self._thread = start_thread(self._run, name=self.name, owner="/root",
                                            purpose="fires delayed tells (timers as messages)")
            self._lock.notify()
        return token

    @property
    def pending(self) -> int:
        """Timers not yet fired (cancelled ones included until their deadline passes)."""
        with self._lock:
            return len(self._heap)

    def _run(self) -> None:
        while True:
            with self._lock:
                while not self._heap or self._heap[0][0] > time.monotonic():
                    self._lock.wait(None if not self._heap else self._heap[0][0] - time.monotonic())
                _due, _n, callback, owner, token = heapq.heappop(self._heap)
            if token.cancelled:
                continue
            try:
                callback()
            except CastorError as exc:
                logger.bind(actor=owner).debug("timer dropped: {exc}", exc=exc)
            except BaseException as exc:  # noqa: BLE001 - a callback's bug (even SystemExit) must not stop every other timer
                logger.bind(actor=owner).opt(exception=exc).error("timer callback failed: {kind}",
                                                                  kind=type(exc).__name__)

    def reset_after_fork(self) -> None:
        """In a forked child: the parent's timer thread does not exist here; start afresh."""
        self._lock = threading.Condition(threading.Lock())
        self._heap = []
        self._thread = None


def _reset(timers: Timers | None) -> None:
    if timers is not None:
        timers.reset_after_fork()


TIMERS = Timers()
"""The process's timer thread."""


def tell_later(handle: Tellable, message: Any, delay: float) -> CancelToken:
    """Tell ``message`` to ``handle`` after ``delay`` seconds (see the module doc); returns the
    token that calls it off."""
    return TIMERS.tell_later(handle, message, delay)


def call_later(delay: float, callback: Callable[[], object], *, owner: str = "/root") -> CancelToken:
    """Run a short ``callback`` on the process's timer thread after ``delay`` seconds; returns the
    token that calls it off."""
    return TIMERS.call_later(delay, callback, owner=owner)


__all__ = ["TIMERS", "CancelToken", "Tellable", "Timers", "call_later", "tell_later"]

"""Mailboxes that can be inspected without consuming and closed without stranding.

Guarantees:

* **No stranded request.** ``put`` and ``close`` take the same lock, so a
  message either lands before the mailbox closes (and is then handed to the
  closer, which rejects it) or is refused at ``put`` with the closing error.
  This closes pykka's window between checking the actor is alive and putting.
* **Bounded.** With a capacity, a ``put`` beyond it raises
  :class:`~castor.messages.errors.MailboxFull` at once; a sender never blocks.
  Control items (stop, kill) are never refused by capacity and jump the queue.
* **Inspectable.** ``snapshot`` reads depth, the oldest message's age and the
  counts by type under the lock, consuming nothing.
* **Cancellable.** ``cancel`` removes a still-queued envelope atomically, so a
  caller that gave up can know for sure that its work never started.
* **A consumer need not hold a thread while it waits.** ``get(resume)`` on an empty mailbox
  returns None at once and leaves a *resumer* where a parked consumer's lock would be: whatever
  would have woken the consumer (a put, a control item, the end of an inline handler, a close)
  calls ``resume`` instead, with the resumer, under the mailbox's lock, and the consumer's
  continuation runs once, in the context it left in (``resumer.run``), even where a
  ``KeyboardInterrupt`` on the putting thread made the hand-off twice. To
  everything else (``claim_idle`` included) the consumer looks parked in ``get``.
"""

from __future__ import annotations

import contextvars
import threading
import time
from _thread import allocate_lock as _allocate_lock
from collections import deque
from typing import Any, Callable, Protocol, final

from castor.messages.base import Message, type_name_of
from castor.messages.errors import CastorError, MailboxFull
from castor.supervision.kinds import ControlKind

QUEUED, STARTED, CANCELLED, REJECTED = 0, 1, 2, 3

_REPLY_GUARD = threading.Lock()  # makes the first set/fail of a Reply win; uncontended in practice


class ReplySlot(Protocol):
    """Where the answer to one ask goes: resolved once (the first outcome wins), then read."""

    value: Any
    error: BaseException | None

    @property
    def done(self) -> bool: ...

    def set(self, value: Any) -> bool: ...

    def fail(self, error: BaseException) -> bool: ...

    def wait(self, timeout: float | None) -> bool: ...


class Reply:
    """A one-shot result slot for a single waiter (cheaper than a Condition)."""

    __slots__ = ("_gate", "_done", "value", "error")

    def __init__(self) -> None:
        self._gate = threading.Lock()
        self._gate.acquire()
        self._done = False
        self.value: Any = None
        self.error: BaseException | None = None

    def set(self, value: Any) -> bool:
        """Resolve with a value; False when already resolved (the first outcome wins)."""
        with _REPLY_GUARD:
            if self._done:
                return False
            self._done = True
            self.value = value
        self._gate.release()
        return True

    def fail(self, error: BaseException) -> bool:
        """Resolve with an error; False when already resolved."""
        with _REPLY_GUARD:
            if self._done:
                return False
            self._done = True
            self.error = error
        self._gate.release()
        return True

    @property
    def done(self) -> bool:
        return self._done

    def wait(self, timeout: float | None) -> bool:
        """Block until resolved or ``timeout`` seconds pass; True when resolved."""
        if self._done:
            return True
        got = self._gate.acquire(timeout=-1 if timeout is None else max(timeout, 0.0))
        if got:
            self._gate.release()  # let later waits return at once
        return got


class Latch:
    """A one-shot flag (set once, never cleared) with ``threading.Event``'s set/is_set/wait.

    Built on one pre-acquired lock like :class:`Reply`: a handle makes several
    per incarnation, and an Event (a Condition and its waiter list) costs more.
    Any number of threads may wait; each passes the lock on to the next.
    """

    __slots__ = ("_gate", "_set")

    def __init__(self) -> None:
        self._gate = threading.Lock()
        self._gate.acquire()
        self._set = False

    def set(self) -> None:
        with _REPLY_GUARD:
            if self._set:
                return
            self._set = True
        self._gate.release()

    def is_set(self) -> bool:
        return self._set

    def wait(self, timeout: float | None = None) -> bool:
        """Block until set or ``timeout`` seconds pass; True when set."""
        if self._set:
            return True
        got = self._gate.acquire(timeout=-1 if timeout is None else max(timeout, 0.0))
        if got:
            self._gate.release()  # let the next waiter through
        return got


#: Type names of message classes, found once per class: a Message's ``type_name`` is a class
#: attribute (set by Message.__init_subclass__), so its class decides it -- unless an instance
#: carries its own (a field of that name), and then it is never cached. An envelope's type name
#: is ``TYPE_NAMES.get(type(message)) or find_type_name(message)``.
TYPE_NAMES: dict[type, str] = {}


def find_type_name(message: Any) -> str:
    """A message's type name when :data:`TYPE_NAMES` has none for its class (cached there when
    its class decides it)."""
    name = type_name_of(message)
    if isinstance(message, Message) and "type_name" not in message.__dict__:
        TYPE_NAMES[type(message)] = name
    return name


@final
class Envelope:
    """A message on its way through a mailbox, with its reply slot for asks.

    An inline ask (ActorHandle.ask) builds its envelope without ``__init__`` (no Python frame, no
    type call): it sets these same five slots itself, so the two must be kept in step."""

    __slots__ = ("message", "reply", "enqueued_at", "state", "type_name")

    def __init__(self, message: Any, reply: ReplySlot | None, state: int = QUEUED) -> None:
        self.message = message
        self.reply = reply
        self.enqueued_at = time.monotonic()
        self.state = state
        self.type_name = TYPE_NAMES.get(type(message)) or find_type_name(message)


@final
class Control:
    """A lifecycle instruction for the actor loop; never counted as a message."""

    __slots__ = ("kind", "payload")

    def __init__(self, kind: ControlKind, payload: Any = None) -> None:
        self.kind = kind
        self.payload = payload

    def __repr__(self) -> str:
        return f"Control({self.kind.value!r})"


_CLOSED_STOP = Control(ControlKind.STOP)
"""What :meth:`Mailbox.get` hands a reader of a closed, drained mailbox: a stop, so its loop ends."""


@final
class _Resumer:
    """Stands in the waiters' list for a consumer that left ``get`` instead of blocking in it.

    Released (under the mailbox's lock, as a parked consumer's lock is) it calls ``resume`` with
    itself: ``resume`` must only hand the consumer's continuation to a thread, as
    ``resumer.run(continuation)`` (it must not call back into this mailbox), and say itself why it
    failed, if it does. If it raises (no thread to be had, and the consumer could not arrange a
    retry of its own), the resumer goes back among the waiters of an open mailbox, so the next put
    retries; the put itself succeeded and does not raise.

    An interrupt raised on the releasing thread inside the hand-off (``KeyboardInterrupt``: Ctrl-C
    lands on the main thread between any two steps, and a put made there releases resumers) used
    to take the resumer with it: the consumer was never resumed. The hand-off is now made again
    until one runs through, then the interrupt goes on; :meth:`run` runs the continuation once
    however often it was handed (the interrupt may have come after a hand-off that took)."""

    __slots__ = ("resume", "context", "mailbox", "_once")

    def __init__(self, resume: Callable[[_Resumer], None], context: contextvars.Context,
                 mailbox: Mailbox) -> None:
        self.resume = resume
        self.context = context
        self.mailbox = mailbox
        self._once = _allocate_lock()

    def run(self, continuation: Callable[..., Any], *args: Any) -> Any:
        """``continuation(*args)`` in the context the consumer left ``get`` in (as
        :meth:`contextvars.Context.run`), unless a hand-off of it has already run it (or runs it
        now): then nothing, None."""
        if self._once.acquire(False):
            return self.context.run(continuation, *args)
        return None

    def release(self) -> None:
        interrupt: BaseException | None = None
        while True:
            try:
                self.resume(self)
            except Exception:  # noqa: BLE001 - e.g. "can't start new thread": retried by the next put
                mailbox = self.mailbox  # its lock is held: the resumer is part of its waiters' state
                if mailbox._closed is None:  # noqa: SLF001 - the mailbox's own helper
                    mailbox._waiters.append(self)  # noqa: SLF001 - the mailbox's own helper
            except BaseException as exc:  # noqa: BLE001 - an interrupt mid-hand-off: hand off again, then raise it
                interrupt = exc
                continue
            break
        if interrupt is not None:
            raise interrupt


class MailboxClosed(Exception):
    """Raised by ``put`` on a closed mailbox; ``error`` is what the sender should see."""

    def __init__(self, error: CastorError, revivable: bool) -> None:
        super().__init__(str(error))
        self.error = error
        self.revivable = revivable


class Mailbox:
    """A FIFO of envelopes plus a priority lane of control items."""

    def __init__(self, capacity: int | None = None) -> None:
        if capacity is not None and capacity < 1:
            raise ValueError("mailbox capacity must be >= 1 or None")
        self.capacity = capacity
        self._lock = threading.Lock()
        # Consumers parked in get(), each on its own pre-acquired lock: a lean Condition
        # (no ownership checks, no waiter-list scans); a put wakes at most one of them.
        # The waiters and the control lane hold an item or two at a time: plain lists (an
        # empty deque is 760 bytes, an empty list 56, and every actor has a mailbox).
        self._waiters: list[Any] = []
        self._queue: deque[Envelope] = deque()
        self._control: list[Control] = []
        self._by_type: dict[str, int] = {}  # queued messages by type name (a plain dict: made per mailbox)
        self._closed: Callable[[], CastorError] | None = None
        self._revivable = False
        self._inline = False  # a handler runs on an asker's thread (claim_idle .. end_inline)
        #: Messages this mailbox refused (full; closed for good) and asks it held when it was
        #: closed (the closer fails each). A put to a mailbox closed by a retirement is not
        #: counted: its handle delivers it to a fresh mailbox (new demand) or counts it itself.
        self.rejected = 0

    # -- producers -------------------------------------------------------
    def put(self, envelope: Envelope) -> None:
        """Enqueue or raise: MailboxClosed when closed, MailboxFull when at capacity."""
        with self._lock:
            if self._closed is not None:
                if not self._revivable:
                    self.rejected += 1
                raise MailboxClosed(self._closed(), self._revivable)
            if self.capacity is not None and len(self._queue) >= self.capacity:
                self.rejected += 1
                raise MailboxFull(
                    f"mailbox full ({self.capacity} messages)",
                    data={"capacity": self.capacity},
                    may_have_started=False,
                )
            first = None  # the waiter this put wakes, once chosen
            try:
                self._queue.append(envelope)
                by_type = self._by_type
                by_type[envelope.type_name] = by_type.get(envelope.type_name, 0) + 1
                if self._waiters:
                    # Woken before it leaves the list, not popped first: an interrupt between
                    # the pop and the wake-up took the waiter with it (a parked consumer never
                    # woke, a resumer was never handed), and the message stayed queued.
                    waiters = self._waiters
                    first = waiters[0]
                    first.release()
                    del waiters[0]
            except BaseException:  # an interrupt (Ctrl-C on the main thread) mid-put
                queue = self._queue
                if queue and queue[-1] is envelope:  # it was queued: it is counted and handed
                    self._finish_interrupted_put(envelope, first)
                raise

    def _finish_interrupted_put(self, envelope: Envelope, first: Any) -> None:
        """What an interrupted :meth:`put` that queued ``envelope`` left undone, done (under the
        lock, on the interrupted thread, before the interrupt goes on): its type counted (the
        count made again from the queue: the interrupt may have come before or after it was
        bumped) and the first waiter woken and then removed (a wake-up that had already taken is
        made again: a parked consumer's lock that is already released stays so, a resumer runs
        its continuation once however often it is handed)."""
        name = envelope.type_name
        self._by_type[name] = sum(1 for queued in self._queue if queued.type_name == name)
        waiters = self._waiters
        if not waiters or (first is not None and waiters[0] is not first):
            return  # the chosen waiter was woken and has left the list: the next one is not this put's
        waiter = waiters[0]
        try:
            waiter.release()
        except RuntimeError:  # a parked consumer's lock the interrupted put had released
            pass
        del waiters[0]

    def put_control(self, item: Control) -> bool:
        """Queue a control item ahead of every message; False when closed."""
        with self._lock:
            if self._closed is not None:
                return False
            self._control.append(item)
            if self._waiters:
                self._waiters.pop(0).release()
            return True

    def claim_idle(self, turn: Any) -> bool:
        """Take ``turn`` (without blocking) only if the consumer is parked in :meth:`get` on an
        empty, open mailbox. Until :meth:`end_inline`, :meth:`get` hands out nothing: what is put
        meanwhile stays queued (and counted in the depth) behind the inline handler."""
        with self._lock:
            if (self._closed is not None or self._inline or self._queue or self._control
                    or not self._waiters or not turn.acquire(False)):
                return False
            self._inline = True
            return True

    def end_inline(self, turn: Any) -> None:
        """The inline handler is done: release ``turn`` (taken by :meth:`claim_idle`); the
        consumer may take what queued behind it. One lock round trip for both."""
        with self._lock:
            turn.release()
            self._inline = False
            if (self._queue or self._control or self._closed is not None) and self._waiters:
                self._waiters.pop(0).release()

    # -- the consumer ----------------------------------------------------
    def get(self, resume: Callable[[_Resumer], None] | None = None,
            linger: float = 0.0) -> Envelope | Control | None:
        """Block until a control item or an envelope is available; controls first. Once the
        mailbox is closed and drained, a stop (the reader's loop must end: nothing more will come).

        With ``resume``, block at most ``linger`` seconds: when nothing has come by then, return
        None and call ``resume(resumer)`` when something does (``resumer.run(continuation)`` runs
        ``continuation`` once, in the caller's :func:`contextvars.copy_context`), on the thread
        that makes it available (see the module's guarantees)."""
        lock = self._lock
        with lock:
            lingered = linger <= 0
            while self._inline or (not self._control and not self._queue):
                if self._closed is not None and not self._inline:
                    # Closed and drained: nothing will ever come. Only an incarnation cut loose
                    # by a brutal shutdown still reads here (once its handler returns): it ends.
                    return _CLOSED_STOP
                if resume is not None and lingered:
                    self._waiters.append(_Resumer(resume, contextvars.copy_context(), self))
                    return None
                waiter = _allocate_lock()
                waiter.acquire()
                self._waiters.append(waiter)
                lock.release()
                try:
                    # released by a put (or close) that popped it
                    woken = waiter.acquire() if resume is None else waiter.acquire(True, linger)
                finally:
                    lock.acquire()
                if not woken and waiter in self._waiters:  # nothing came while it lingered
                    self._waiters.remove(waiter)
                    lingered = True
            if self._control:
                return self._control.pop(0)
            envelope = self._queue.popleft()
            self._by_type[envelope.type_name] -= 1  # it was counted by its put
            envelope.state = STARTED
            return envelope

    def put_back(self, item: Envelope | Control) -> None:
        """Return an item taken by a consumer that must not handle it (an abandoned loop), at the front."""
        with self._lock:
            if type(item) is Envelope:
                if self._closed is not None:
                    item.state = REJECTED  # the closer already rejected the rest; this one fails below
                else:
                    item.state = QUEUED
                    self._queue.appendleft(item)
                    self._by_type[item.type_name] = self._by_type.get(item.type_name, 0) + 1
            elif self._closed is None:
                self._control.insert(0, item)
            if self._waiters:
                self._waiters.pop(0).release()

    def clear_control(self) -> None:
        """Drop control items left for an incarnation that is gone (before a new one starts)."""
        with self._lock:
            self._control.clear()

    def cancel(self, envelope: Envelope) -> bool:
        """Withdraw a queued envelope; True only if it had not started and now never will."""
        with self._lock:
            if envelope.state != QUEUED:
                return False
            try:
                self._queue.remove(envelope)
            except ValueError:
                return False
            self._by_type[envelope.type_name] -= 1
            envelope.state = CANCELLED
            return True

    def close(self, error_factory: Callable[[], CastorError], *, revivable: bool = False) -> list[Envelope]:
        """Refuse every later put and hand back what was queued (for the closer to reject).

        ``revivable`` marks a closure after retirement: a later put may then
        create new demand instead of failing (see ActorHandle).
        """
        with self._lock:
            if self._closed is None:
                self._closed = error_factory
                self._revivable = revivable
            drained = list(self._queue)
            self._queue.clear()
            self._control.clear()
            self._by_type.clear()
            for envelope in drained:
                envelope.state = REJECTED
                if envelope.reply is not None:  # an ask the closer fails (a tell is a dead letter)
                    self.rejected += 1
            while self._waiters:
                self._waiters.pop(0).release()
            return drained

    @property
    def closed(self) -> bool:
        return self._closed is not None

    # -- inspection ------------------------------------------------------
    def snapshot(self) -> tuple[int, float | None, dict[str, int]]:
        """(depth, oldest age in seconds, counts by type) — consumes nothing."""
        with self._lock:
            depth = len(self._queue)
            oldest = time.monotonic() - self._queue[0].enqueued_at if depth else None
            by_type = {name: n for name, n in self._by_type.items() if n > 0}
        return depth, oldest, by_type

    def peek(self, limit: int) -> list[Envelope]:
        """The oldest ``limit`` queued envelopes, oldest first -- consumes nothing (a snapshot
        reads them; their messages are immutable)."""
        with self._lock:
            queue = self._queue
            return [queue[i] for i in range(min(limit, len(queue)))]

    def __len__(self) -> int:
        return len(self._queue)

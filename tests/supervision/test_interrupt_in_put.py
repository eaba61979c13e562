"""A ``KeyboardInterrupt`` (Ctrl-C: Python raises it on the main thread between any two steps)
landing anywhere inside :meth:`Mailbox.put`.

``put`` used to take the first waiter out of the list and then wake it: an interrupt between the
two took the waiter with it. A consumer parked in ``get`` was never woken (its lock was no longer
where any later put or close would find it), a resumer was never handed, and the message stayed
queued behind a consumer that would never come. Now whatever a put queued is counted and handed
before the interrupt goes on, and a put the interrupt stopped before it queued anything leaves
the waiter where it was.

The interrupt is injected by a trace function on the putting thread, at each step of ``put`` (and
of whatever it calls in the mailbox module) in turn, one step per put: the step right after the
waiter left the list among them. No sweep of real signals lands on one bytecode reliably."""

from __future__ import annotations

import dis
import queue
import sys
import threading
from typing import Any

import pytest

from castor.messages.errors import ActorStopped
from castor.supervision import mailbox as mailbox_module
from castor.supervision.mailbox import STARTED, Envelope, Mailbox
from tests.support.waiting import poll_until

pytestmark = pytest.mark.timeout(120)

MAILBOX_FILE = mailbox_module.__file__
_CALLS = {"CALL", "CALL_FUNCTION_EX"}


class _Injector:
    """Raises KeyboardInterrupt on the putting thread at step ``at`` of its steps in the mailbox
    module (never when ``at`` is None); tracing stops there. A step is a place where CPython
    runs a pending signal's handler: a function's entry, and the instruction after each call
    returns (3.11 checks for pending signals at the end of its call instructions, at function
    entry and on backward jumps: a loop goes through a call each turn here)."""

    def __init__(self, at: int | None) -> None:
        self.at = at
        self.steps = 0
        self.fired = False

    def _step(self) -> None:
        if self.at is not None and self.steps == self.at:
            self.fired = True
            raise KeyboardInterrupt
        self.steps += 1

    def __call__(self, frame: Any, event: str, arg: Any) -> Any:
        if event != "call" or frame.f_code.co_filename != MAILBOX_FILE:
            return None
        frame.f_trace_opcodes = True
        frame.f_trace_lines = False
        self._step()
        code = frame.f_code.co_code
        after_a_call = [False]

        def local(frame: Any, event: str, arg: Any) -> Any:
            if event == "opcode":
                if after_a_call[0]:
                    after_a_call[0] = False
                    self._step()
                after_a_call[0] = dis.opname[code[frame.f_lasti]] in _CALLS
            return local

        return local

    def put(self, mailbox: Mailbox, envelope: Envelope) -> bool:
        """``mailbox.put(envelope)`` traced; True when the interrupt was raised out of it."""
        sys.settrace(self)
        try:
            mailbox.put(envelope)
        except KeyboardInterrupt:
            assert self.fired
            return True
        finally:
            sys.settrace(None)
        assert not self.fired
        return False


def _queued_or_taken(mailbox: Mailbox, envelope: Envelope) -> bool:
    with mailbox._lock:  # noqa: SLF001 - the test reads the state the put left
        return envelope.state == STARTED or any(item is envelope for item in mailbox._queue)  # noqa: SLF001


def _counts_match_the_queue(mailbox: Mailbox) -> None:
    with mailbox._lock:  # noqa: SLF001
        names = [item.type_name for item in mailbox._queue]  # noqa: SLF001
        counted = {name: n for name, n in mailbox._by_type.items() if n}  # noqa: SLF001
    assert counted == {name: names.count(name) for name in set(names)}


class _ParkedConsumer:
    """A consumer parked in ``get()`` on its own lock (no resume): what it takes goes to ``got``."""

    def __init__(self, mailbox: Mailbox) -> None:
        self.mailbox = mailbox
        self.got: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()
        assert poll_until(lambda: len(mailbox._waiters) == 1)  # noqa: SLF001 - parked

    def _run(self) -> None:
        while True:
            item = self.mailbox.get()
            if not isinstance(item, Envelope):
                return
            self.got.put(item)


class _ResumedConsumer:
    """A consumer that leaves ``get`` at once (a resumer stands in its place): each hand-off is
    run on one worker thread; the continuation takes what is there and leaves again."""

    def __init__(self, mailbox: Mailbox) -> None:
        self.mailbox = mailbox
        self.got: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self.handed: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self.runs = 0
        self.thread = threading.Thread(target=self._worker, daemon=True)
        self.thread.start()
        assert mailbox.get(self.handed.put, linger=0.0) is None  # nothing there: a resumer waits

    def _worker(self) -> None:
        while True:
            resumer = self.handed.get()
            if resumer is None:
                return
            resumer.run(self._continue)

    def _continue(self) -> None:
        self.runs += 1
        while True:
            item = self.mailbox.get(self.handed.put, linger=0.0)
            if item is None:
                return
            if not isinstance(item, Envelope):
                return
            self.got.put(item)

    def stop(self) -> None:
        self.handed.put(None)


def _take(consumer: Any, timeout: float = 10.0) -> Any:
    try:
        return consumer.got.get(timeout=timeout)
    except queue.Empty:
        return None


def _end(mailbox: Mailbox, consumer: Any) -> None:
    """Close the mailbox and see the consumer's thread end (none left parked in a get)."""
    mailbox.close(lambda: ActorStopped("closed"))
    if isinstance(consumer, _ResumedConsumer):
        consumer.stop()
    consumer.thread.join(10)
    assert not consumer.thread.is_alive()


def _sweep(make_consumer: Any) -> int:
    """Interrupt a put at each of its steps in turn; returns how many steps were swept."""
    assert threading.current_thread() is threading.main_thread()  # where Ctrl-C's interrupt lands
    at = 0
    while True:
        mailbox = Mailbox()
        consumer = make_consumer(mailbox)
        first, second = Envelope("first", None), Envelope("second", None)
        interrupted = _Injector(at).put(mailbox, first)
        if not interrupted:  # every step swept: the put ran through
            assert _take(consumer) is first
            _end(mailbox, consumer)
            return at
        _counts_match_the_queue(mailbox)
        if _queued_or_taken(mailbox, first):
            # Queued before the interrupt: handed all the same, no further put needed.
            assert _take(consumer) is first, f"interrupted at step {at}: queued, never handed"
        # The waiter is where the next put finds it (before: lost, this one never arrived).
        mailbox.put(second)
        assert _take(consumer) is second, f"interrupted at step {at}: the waiter was lost"
        assert consumer.got.empty()
        _counts_match_the_queue(mailbox)
        assert len(mailbox) == 0
        if isinstance(consumer, _ResumedConsumer):
            assert consumer.runs <= 2  # one continuation per resumer, however often it was handed
        _end(mailbox, consumer)
        at += 1


def test_an_interrupt_anywhere_in_a_put_to_a_parked_consumer_loses_neither_message_nor_consumer():
    swept = _sweep(_ParkedConsumer)
    assert swept >= 4  # its entry, after the append, the count and the wake-up (and the lock's exit)


def test_an_interrupt_anywhere_in_a_put_to_a_resumer_loses_neither_message_nor_resumer():
    swept = _sweep(_ResumedConsumer)
    assert swept >= 4

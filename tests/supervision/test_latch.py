"""Latch: the one-shot flag handles use instead of threading.Event."""

from __future__ import annotations

import threading

from castor.supervision.mailbox import Latch


def test_wait_times_out_until_set_then_returns_at_once():
    latch = Latch()
    assert not latch.is_set()
    assert latch.wait(0.01) is False
    assert latch.wait(0) is False
    latch.set()
    latch.set()  # a second set is a no-op, not a second release
    assert latch.is_set() and latch.wait(0) and latch.wait(None)


def test_every_waiter_wakes_on_one_set():
    latch = Latch()
    woke = threading.Semaphore(0)
    ready = threading.Barrier(9)

    def waiter() -> None:
        ready.wait(5)
        if latch.wait(5):
            woke.release()

    threads = [threading.Thread(target=waiter, daemon=True) for _ in range(8)]
    for thread in threads:
        thread.start()
    ready.wait(5)
    latch.set()
    for _ in threads:
        assert woke.acquire(timeout=5)
    for thread in threads:
        thread.join(5)
    assert latch.wait(0)

"""A ``KeyboardInterrupt`` (Ctrl-C: Python raises it on the main thread, between any two steps)
that lands while a put on the main thread hands an idle actor's loop back to a thread.

The put had popped the actor's resumer from its mailbox's waiters; the interrupt went past the
hand-off's ``except Exception`` and the resumer was gone: the message stayed queued, and the
actor's loop was never resumed (nothing else would find it), the next put too queued behind it.
Now the hand-off is made again before the interrupt goes on, and the loop's continuation runs at
most once however often it was handed (an interrupt after a hand-off that took must not start a
second loop beside the first).

The interrupt is injected at the hand-off itself (the loop-thread pool's ``run`` raises it once,
before or after handing the task on): no sweep of real signals hits that instant reliably."""

from __future__ import annotations

import threading

import pytest

from castor.supervision import ActorSystem, ChildSpec, Restart, handles
from castor.supervision import actor as actor_module
from tests.supervision.helpers import Journal, poll_until
from tests.supervision.test_idle_resume_races import Recorder, Seq, _all_idle_without_thread, _by_sender, recorder

pytestmark = pytest.mark.timeout(60)


class OneAtATime(Recorder):
    """Records each Seq, and whether two of its handlers ever ran at once (two loops)."""

    def on_start(self) -> None:
        super().on_start()
        self.inside = threading.Lock()

    @handles(Seq)
    def seq(self, message: Seq) -> tuple[str, int, int]:
        if not self.inside.acquire(False):
            self.journal.add("overlap", self.name)
        try:
            threading.Event().wait(0.002)  # a handler long enough for a second loop to run into it
            return super().seq(message)
        finally:
            self.inside.release()


def _interrupt_once(monkeypatch, cls_name: str, *, after_handing: bool) -> list[str]:
    """The pool's ``run`` raises KeyboardInterrupt once for ``cls_name``'s loop: before the task is
    handed to a thread, or once it has been (``after_handing``)."""
    real = actor_module.LOOP_THREADS.run
    raised: list[str] = []

    def run(task, name):
        if name == cls_name and not raised:
            raised.append(name)
            if after_handing:
                real(task, name)
            raise KeyboardInterrupt
        return real(task, name)

    monkeypatch.setattr(actor_module.LOOP_THREADS, "run", run)
    return raised


@pytest.mark.parametrize("after_handing", [False, True], ids=["before-the-hand-off", "after-the-hand-off"])
def test_an_interrupt_inside_the_resume_hand_off_loses_no_loop_and_starts_no_second(monkeypatch, after_handing):
    assert threading.current_thread() is threading.main_thread()  # where Ctrl-C's interrupt lands
    journal = Journal()
    with ActorSystem() as system:
        handle = system.spawn(ChildSpec("i", recorder("i", journal, OneAtATime), restart=Restart.TEMPORARY))
        handle.ask(Seq(sender="warm", n=0), timeout=10)
        assert poll_until(_all_idle_without_thread)
        raised = _interrupt_once(monkeypatch, "OneAtATime", after_handing=after_handing)
        with pytest.raises(KeyboardInterrupt):
            handle.tell(Seq(sender="q", n=1))  # the put queued it; the interrupt goes on to the caller
        assert raised == ["OneAtATime"]
        # No further put: the loop must have been resumed all the same (before: never, the resumer lost).
        assert poll_until(lambda: _by_sender(journal).get("i:q") == [1], timeout=10), _by_sender(journal)
        for n in range(2, 40):
            handle.tell(Seq(sender="q", n=n))
        assert handle.ask(Seq(sender="q", n=40), timeout=10) == ("i", 40, 1)
        assert _by_sender(journal)["i:q"] == list(range(1, 41))  # each once, in order
        assert journal.count("overlap", "i") == 0  # one loop, never two

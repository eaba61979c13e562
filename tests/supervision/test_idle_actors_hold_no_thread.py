"""An idle actor holds no thread: its loop leaves the thread while its mailbox is empty and is
resumed on a loop thread when mail comes, with the same context, order and guarantees."""

from __future__ import annotations

import contextvars
import sys
import threading

import pytest

from castor.supervision import Actor, ActorSystem, ChildSpec, Restart, handles
from castor.supervision import actor as actor_module
from castor.supervision.actor import running_actor
from castor.supervision.mailbox import Envelope, Mailbox
from tests.supervision.helpers import Journal, Ping, poll_until, worker

pytestmark = pytest.mark.timeout(30)

_VAR: contextvars.ContextVar[str] = contextvars.ContextVar("test_idle_actors_var")


def _threads_in_get() -> int:
    """Threads blocked in a Mailbox.get (a loop waiting for mail on its own thread)."""
    count = 0
    for frame in sys._current_frames().values():
        while frame is not None:
            if frame.f_code is Mailbox.get.__code__:
                count += 1
                break
            frame = frame.f_back
    return count


def test_idle_actors_wait_without_a_thread():
    journal = Journal()
    with ActorSystem() as system:
        handles_ = [system.spawn(ChildSpec(f"w{i}", worker(f"w{i}", journal), restart=Restart.TEMPORARY))
                    for i in range(40)]
        for i, handle in enumerate(handles_):
            assert handle.ask(Ping(n=i), timeout=5) == (f"w{i}", 1, i)
        # Before this change each of the 40 idle loops blocked in get() on its own thread.
        assert poll_until(lambda: _threads_in_get() == 0)
        for i, handle in enumerate(handles_):  # and each still answers, resumed on a loop thread
            assert handle.ask(Ping(n=100 + i), timeout=5) == (f"w{i}", 1, 100 + i)


class _Remembers(Actor):
    def on_start(self) -> None:
        _VAR.set("set in on_start")

    @handles(Ping)
    def ping(self, message: Ping) -> tuple[str | None, bool]:
        if message.n == 1:
            _VAR.set("set by a handler")
        return _VAR.get(None), running_actor() is self.handle


def test_a_resumed_loop_keeps_its_context_and_knows_its_actor():
    with ActorSystem() as system:
        handle = system.spawn(ChildSpec("m", _Remembers, restart=Restart.TEMPORARY))
        assert handle.ask(Ping(n=0), timeout=5) == ("set in on_start", True)
        assert poll_until(lambda: _threads_in_get() == 0)  # left its thread while idle
        assert handle.ask(Ping(n=1), timeout=5) == ("set by a handler", True)
        assert poll_until(lambda: _threads_in_get() == 0)
        assert handle.ask(Ping(n=2), timeout=5) == ("set by a handler", True)


def test_mail_that_finds_no_thread_stays_queued_and_the_next_put_resumes_the_loop(monkeypatch):
    journal = Journal()
    with ActorSystem() as system:
        handle = system.spawn(ChildSpec("w", worker("w", journal), restart=Restart.TEMPORARY))
        assert handle.ask(Ping(n=0), timeout=5) == ("w", 1, 0)
        assert poll_until(lambda: _threads_in_get() == 0)
        real = actor_module.LOOP_THREADS.run
        failures = []

        def run(task, name):
            if not failures:
                failures.append(name)
                raise RuntimeError("can't start new thread")
            return real(task, name)

        monkeypatch.setattr(actor_module.LOOP_THREADS, "run", run)
        handle.tell(Ping(n=1))  # queued; its resume fails: the tell itself does not
        assert failures == ["Worker"]
        assert handle.ask(Ping(n=2), timeout=5) == ("w", 1, 2)  # resumes the loop: both handled, in order
        assert [e[2] for e in journal.entries if e[0] == "ping"] == [0, 1, 2]
        assert handle.alive


def test_a_mailbox_resumes_a_consumer_that_left_get_once_with_its_context():
    mailbox = Mailbox()
    resumed: list[contextvars.Context] = []
    token = _VAR.set("the consumer's")
    try:
        assert mailbox.get(resumed.append) is None  # nothing queued: no blocking, no item
    finally:
        _VAR.reset(token)
    assert resumed == []
    turn = threading.Lock()
    assert mailbox.claim_idle(turn)  # to an inline ask the consumer looks parked in get
    mailbox.end_inline(turn)
    assert resumed == []  # nothing came: still waiting
    envelope = Envelope(Ping(n=1), None)
    mailbox.put(envelope)
    mailbox.put(Envelope(Ping(n=2), None))
    assert len(resumed) == 1 and resumed[0].run(_VAR.get, None) == "the consumer's"
    assert mailbox.get(resumed.append) is envelope


def test_a_closed_mailbox_resumes_its_waiting_consumer_to_stop_it():
    mailbox = Mailbox()
    resumed: list[contextvars.Context] = []
    assert mailbox.get(resumed.append) is None
    mailbox.close(lambda: RuntimeError("closed"))
    assert len(resumed) == 1
    assert mailbox.get(resumed.append).kind.value == "stop"


class _Lingers(Actor):
    idle_linger_seconds = 30.0

    @handles(Ping)
    def ping(self, message: Ping) -> int:
        return threading.get_ident()


def test_mail_that_comes_within_the_linger_is_taken_on_the_same_thread():
    with ActorSystem() as system:
        handle = system.spawn(ChildSpec("l", _Lingers, restart=Restart.TEMPORARY))
        first = handle.ask(Ping(n=0), timeout=5)
        assert poll_until(lambda: any(
            frame.f_code is Mailbox.get.__code__ for ident, frame in sys._current_frames().items()
            if ident == first))  # its loop waits on its own thread, within the linger
        assert handle.ask(Ping(n=1), timeout=5) == first

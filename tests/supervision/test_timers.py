"""Timers as messages and the cancel token (castor.supervision.timers)."""

from __future__ import annotations

import threading
import time

import pytest

from castor.messages.errors import ActorStopped
from castor.supervision import Actor, ActorSystem, CancelToken, ChildSpec, handles
from castor.supervision.timers import Timers


class Ping:
    def __init__(self, n: int) -> None:
        self.n = n


class Recorder(Actor):
    def __init__(self, seen: list[tuple[int, str]], got: threading.Event) -> None:
        super().__init__()
        self.seen = seen
        self.got = got

    @handles(Ping)
    def on_ping(self, message: Ping) -> None:
        self.seen.append((message.n, threading.current_thread().name))
        self.got.set()


class _Sink:
    path = "/test/sink"

    def __init__(self) -> None:
        self.told: list[object] = []
        self.told_event = threading.Event()
        self.refuse = False

    def tell(self, message: object) -> None:
        if self.refuse:
            raise ActorStopped("gone", may_have_started=False)
        self.told.append(message)
        self.told_event.set()


def test_a_timer_is_a_message_handled_on_the_actors_own_thread():
    seen: list[tuple[int, str]] = []
    got = threading.Event()
    with ActorSystem() as system:
        handle = system.spawn(ChildSpec("rec", lambda: Recorder(seen, got)))
        started = time.monotonic()
        handle.actor.tell_self_later(Ping(1), 0.05)  # type: ignore[union-attr]  # a running incarnation
        assert got.wait(5)
        assert time.monotonic() - started >= 0.05
        assert seen[0][0] == 1 and seen[0][1] != "castor-timers"  # the loop thread, not the timer's


def test_a_cancelled_timer_is_never_told_and_timers_fire_in_deadline_order():
    timers = Timers(name="castor-timers-test")
    sink = _Sink()
    late = timers.tell_later(sink, "late", 0.15)
    cancelled = timers.tell_later(sink, "cancelled", 0.05)
    timers.tell_later(sink, "early", 0.01)
    cancelled.cancel()
    late.on_cancel(lambda: None)  # armed callbacks do not disturb firing
    deadline = time.monotonic() + 5
    while len(sink.told) < 2 and time.monotonic() < deadline:
        sink.told_event.wait(0.05)
        sink.told_event.clear()
    assert sink.told == ["early", "late"]


def test_a_refused_tell_is_dropped_without_killing_the_timer_thread():
    timers = Timers(name="castor-timers-test-refused")
    refusing, sink = _Sink(), _Sink()
    refusing.refuse = True
    timers.tell_later(refusing, "lost", 0.0)
    timers.tell_later(sink, "after", 0.02)
    assert sink.told_event.wait(5)
    assert sink.told == ["after"] and refusing.told == []


def test_cancel_token_runs_each_callback_once_and_refuses_late_arming():
    token = CancelToken()
    calls: list[str] = []
    assert token.on_cancel(lambda: calls.append("a"))
    gone = lambda: calls.append("disarmed")  # noqa: E731 - a named callback to disarm
    assert token.on_cancel(gone)
    token.disarm(gone)
    token.cancel()
    token.cancel()
    assert calls == ["a"] and token.cancelled
    assert token.on_cancel(lambda: calls.append("late")) is False
    waiter = threading.Event()
    token.wake(waiter)
    assert waiter.is_set() and calls == ["a"]


@pytest.mark.parametrize("threads", [8])
def test_cancel_from_many_threads_runs_the_callback_exactly_once(threads):
    token = CancelToken()
    calls: list[int] = []
    token.on_cancel(lambda: calls.append(1))
    barrier = threading.Barrier(threads)

    def hit() -> None:
        barrier.wait(5)
        token.cancel()

    workers = [threading.Thread(target=hit) for _ in range(threads)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join(5)
    assert calls == [1]


def test_a_started_thread_is_listed_in_the_tree_snapshot_until_it_ends():
    from castor.messages.inspection import TreeSnapshot
    from castor.supervision.threads import running_threads, start_thread

    release = threading.Event()
    with ActorSystem() as system:
        thread = start_thread(release.wait, args=(5,), name="test-reader", owner="/root/test",
                              purpose="waits for the test")
        rows = [row for row in system.snapshot_data()["threads"] if row["name"] == "test-reader"]
        assert rows and rows[0]["owner"] == "/root/test" and rows[0]["purpose"] == "waits for the test"
        assert "test-reader" in [t.name for t in TreeSnapshot.model_validate(system.snapshot_data()).threads]
        assert "test-reader" in [row["name"] for row in system.snapshot_data("/root/test", pace_s=0.001)["threads"]]
        assert "test-reader" not in [row["name"] for row in running_threads("/root/other")]
        release.set()
        thread.join(5)
        assert "test-reader" not in [row["name"] for row in running_threads()]


@pytest.mark.timeout(10)
def test_call_later_runs_short_callbacks_once_and_a_failing_one_does_not_stop_the_thread():
    timers = Timers(name="test-call-later")
    fired: list[str] = []
    done = threading.Event()

    def boom() -> None:
        raise ValueError("a callback's bug")

    timers.call_later(0.01, boom)
    cancelled = timers.call_later(0.02, lambda: fired.append("cancelled"))
    cancelled.cancel()
    timers.call_later(0.03, lambda: fired.append("late"))
    timers.call_later(0.0, lambda: fired.append("first"))
    timers.call_later(0.05, done.set)
    assert done.wait(5), "the timer thread stopped after a failing callback"
    assert fired == ["first", "late"]


@pytest.mark.timeout(10)
def test_cancel_token_keeps_the_arming_order_across_its_slot_and_its_list():
    """One callback sits in the token's slot, the rest in a list: cancel still runs them in the
    order they were armed, each once, whichever were disarmed in between."""
    token = CancelToken()
    calls: list[str] = []
    first = lambda: calls.append("first")  # noqa: E731 - named callbacks to disarm
    second = lambda: calls.append("second")  # noqa: E731 - named callbacks to disarm
    assert token.on_cancel(first) and token.on_cancel(second)
    token.disarm(first)  # the slot is free again, but "second" was armed before "third"
    assert token.on_cancel(lambda: calls.append("third"))
    token.disarm(lambda: None)  # never armed: nothing happens
    token.cancel()
    assert calls == ["second", "third"]


@pytest.mark.timeout(10)
def test_arming_and_disarming_across_threads_never_runs_a_disarmed_callback_or_loses_an_armed_one():
    """The worker call's pattern (arm, work, disarm) racing a cancel: a callback runs only if the
    cancel came while it was armed, and one armed when the cancel came always runs."""
    for _ in range(200):
        token = CancelToken()
        ran = threading.Event()
        state = {"armed": False}
        start = threading.Barrier(2)

        def work(token: CancelToken = token, ran: threading.Event = ran, state: dict = state,
                 start: threading.Barrier = start) -> None:
            start.wait(5)
            kill = ran.set
            if token.on_cancel(kill):
                state["armed"] = True
                token.disarm(kill)

        thread = threading.Thread(target=work)
        thread.start()
        start.wait(5)
        token.cancel()
        thread.join(5)
        assert token.on_cancel(lambda: None) is False
        if ran.is_set():
            assert state["armed"]  # it ran only because it was armed when the cancel came


@pytest.mark.timeout(10)
def test_disarming_a_bound_method_looked_up_again_forgets_it() -> None:
    from castor.supervision.timers import CancelToken

    class Work:
        def __init__(self) -> None:
            self.killed = 0

        def kill(self) -> None:
            self.killed += 1

    work = Work()
    token = CancelToken()
    assert token.on_cancel(work.kill)
    token.disarm(work.kill)  # a different bound-method object, equal to the armed one
    token.cancel()
    assert work.killed == 0

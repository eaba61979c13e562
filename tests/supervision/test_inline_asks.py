"""Inline asks (``Actor.inline_asks``): an idle actor's ask runs on the asking thread, and every
guarantee of the mailbox still holds -- one message at a time, arrival order, retirement rejects
what is queued, a crash hands the queue to the next incarnation, a stop waits for the handler."""

from __future__ import annotations

import threading
import time
from bisect import bisect_left

import pytest

from castor.messages.base import Message
from castor.messages.errors import ActorCrashed, Retired
from castor.supervision import ActorSystem, ChildSpec, handles
from castor.supervision.meters import BUCKETS
from castor.supervision.supervisor import Restart
from tests.supervision.helpers import Block, Boom, Journal, Ping, Worker, poll_until


class WhoRuns(Message, type_name="test.inline.who"):
    pass


class Linger(Message, type_name="test.inline.linger"):
    seconds: float


class RetireNow(Message, type_name="test.inline.retire"):
    key: str


class InlineWorker(Worker):
    inline_asks = True

    @handles(WhoRuns)
    def who(self, _message: WhoRuns) -> int:
        return threading.get_ident()

    @handles(Linger)
    def linger(self, message: Linger) -> int:
        until = time.monotonic() + message.seconds  # runs this long, on the asker's thread
        while time.monotonic() < until:
            pass
        return threading.get_ident()

    @handles(RetireNow)
    def retire_now(self, message: RetireNow) -> str:
        self.journal.event(f"{message.key}:entered").set()
        self.journal.event(message.key).wait(10)
        self.retire("asked to")
        return "retiring"


@pytest.fixture
def world():
    journal = Journal()
    system = ActorSystem([ChildSpec("w", lambda: InlineWorker("w", journal), restart=Restart.PERMANENT)])
    handle = system.lookup("/root/w")
    handle.ask(Ping(n=0), timeout=5)  # started, loop parked
    yield journal, handle
    system.shutdown(10)


def in_thread(fn):
    box: dict = {}

    def run():
        try:
            box["value"] = fn()
        except BaseException as exc:  # noqa: BLE001 - handed to the test
            box["error"] = exc

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, box


def test_an_idle_actor_runs_the_ask_on_the_asking_thread(world):
    _journal, handle = world
    poll_until(lambda: handle._mailbox._waiters, 5)
    assert handle.ask(WhoRuns(), timeout=5) == threading.get_ident()
    assert handle.processed >= 2


def test_a_busy_actor_queues_the_ask_in_order(world):
    journal, handle = world
    blocker = handle.ask_pending(Block(key="b1"), timeout=10)  # runs on the loop thread
    assert journal.event("b1:entered").wait(5)
    thread, box = in_thread(lambda: handle.ask(Ping(n=7), timeout=10))
    poll_until(lambda: len(handle._mailbox) == 1, 5)
    journal.event("b1").set()
    assert blocker.result() == "b1"
    thread.join(10)
    assert box["value"] == ("w", 1, 7)
    assert [e[0] for e in journal.entries if e[0] in ("blocked", "ping")][-2:] == ["blocked", "ping"]


def test_a_message_sent_during_an_inline_handler_runs_after_it(world):
    journal, handle = world
    poll_until(lambda: handle._mailbox._waiters, 5)
    thread, box = in_thread(lambda: handle.ask(Block(key="i1"), timeout=10))  # inline, on that thread
    assert journal.event("i1:entered").wait(5)
    later = handle.ask_pending(Ping(n=9), timeout=10)
    # The ping stays queued (and shown as queued) behind the inline handler: it has not run.
    assert not journal.wait_for(lambda es: ("ping", "w", 9) in es, timeout=0.2)
    snapshot = handle.snapshot().mailbox
    assert snapshot.depth == 1 and snapshot.in_flight is not None and snapshot.in_flight.message_type == "test.block"
    journal.event("i1").set()
    thread.join(10)
    assert box["value"] == "i1" and later.result() == ("w", 1, 9)
    order = [e for e in journal.entries if e[0] in ("blocked", "ping") and e[-1] in ("i1", 9)]
    assert order == [("blocked", "w", "i1"), ("ping", "w", 9)]


def test_a_retirement_in_an_inline_handler_rejects_what_queued_behind_it(world):
    journal, handle = world
    poll_until(lambda: handle._mailbox._waiters, 5)
    thread, box = in_thread(lambda: handle.ask(RetireNow(key="r1"), timeout=10))
    assert journal.event("r1:entered").wait(5)
    queued = [handle.ask_pending(Ping(n=i), timeout=10) for i in range(5)]
    journal.event("r1").set()
    thread.join(10)
    assert box["value"] == "retiring"
    for pending in queued:
        with pytest.raises(Retired):
            pending.result()
    assert journal.count("ping", "w", 3) == 0  # none of them ran
    assert journal.wait_for(lambda es: ("end", "w", 1, "retired") in es)
    assert handle.ask(Ping(n=42), timeout=10) == ("w", 2, 42)  # new demand: a fresh incarnation


def test_a_crash_in_an_inline_handler_hands_the_queue_to_the_next_incarnation(world):
    journal, handle = world
    poll_until(lambda: handle._mailbox._waiters, 5)
    with pytest.raises(ActorCrashed):
        handle.ask(Boom(), timeout=10)
    assert handle.ask(Ping(n=5), timeout=10) == ("w", 2, 5)  # restarted by its supervisor
    assert journal.count("end", "w", 1, "crashed") == 1


def test_a_stop_waits_for_the_inline_handler(world):
    journal, handle = world
    poll_until(lambda: handle._mailbox._waiters, 5)
    thread, box = in_thread(lambda: handle.ask(Block(key="s1"), timeout=10))
    assert journal.event("s1:entered").wait(5)
    stopper, _ = in_thread(lambda: handle.stop(10))
    assert not journal.wait_for(lambda es: ("end", "w", 1, "stopped") in es, timeout=0.2)
    journal.event("s1").set()
    thread.join(10)
    stopper.join(10)
    assert box["value"] == "s1"
    ends = [e for e in journal.entries if e[0] in ("blocked", "end")]
    assert ends[-2:] == [("blocked", "w", "s1"), ("end", "w", 1, "stopped")]


@pytest.mark.timeout(30)
def test_an_inline_ask_is_counted_in_the_ask_latency_histogram(world):
    _journal, handle = world
    meters = handle.registry.meters

    def asks_seen() -> float:
        _counters, histograms = meters.collect()
        row = histograms.get(("ask_seconds", "InlineWorker"))
        return sum(row[:-1]) if row else 0

    before = asks_seen()
    assert handle.ask(WhoRuns(), timeout=5) == threading.get_ident()  # ran inline
    assert asks_seen() == before + 1


@pytest.mark.timeout(30)
def test_an_inline_asks_latency_spans_its_handler_from_start_to_end(world):
    # The inline path takes the handler's end from handle_envelope's own clock reading: the
    # recorded duration must still cover the whole run, in the bucket it belongs to.
    _journal, handle = world
    meters = handle.registry.meters
    before = list(meters.collect()[1][("ask_seconds", "InlineWorker")])
    assert handle.ask(Linger(seconds=0.03), timeout=5) == threading.get_ident()  # ran inline
    after = meters.collect()[1][("ask_seconds", "InlineWorker")]
    assert 0.03 <= after[-1] - before[-1] < 5
    grown = [i for i in range(len(after) - 1) if after[i] != before[i]]
    assert grown == [bisect_left(BUCKETS, after[-1] - before[-1])]

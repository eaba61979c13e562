"""Races at the seam of an idle actor that holds no thread: its loop leaves its thread after
``idle_linger_seconds`` on an empty mailbox and is resumed on a loop thread by whatever comes
next (a put, a control item, the end of an inline handler, a close).

Every test synchronises on events, answers and deadlines; the short sleeps only land senders
near the linger's expiry (a perturbation: no assertion depends on them)."""

from __future__ import annotations

import contextvars
import random
import sys
import threading
import time
from collections import defaultdict

import pytest

from castor.messages.base import Message
from castor.messages.errors import ActorStopped
from castor.supervision import Actor, ActorSystem, ChildSpec, Restart, handles
from castor.supervision import actor as actor_module
from castor.supervision.kinds import HandleState
from castor.supervision.threads import LOOP_THREADS, LoopThreads
from tests.supervision.helpers import Journal, poll_until
from tests.supervision.test_idle_actors_hold_no_thread import _threads_in_get

pytestmark = pytest.mark.timeout(60)

LINGER = Actor.idle_linger_seconds


class Seq(Message, type_name="test.races.seq"):
    sender: str
    n: int


class Hold(Message, type_name="test.races.hold"):
    key: str


class Crash(Message, type_name="test.races.crash"):
    pass


class Count(Message, type_name="test.races.count"):
    pass


class Relay(Message, type_name="test.races.relay"):
    n: int


_COUNTER: contextvars.ContextVar[int] = contextvars.ContextVar("test_idle_resume_races_counter")
_NAME: contextvars.ContextVar[str] = contextvars.ContextVar("test_idle_resume_races_name")


class Recorder(Actor):
    """Records each Seq once (sender, n, incarnation); holds on Hold; crashes on Crash."""

    def __init__(self, name: str, journal: Journal) -> None:
        super().__init__()
        self.name = name
        self.journal = journal

    def on_start(self) -> None:
        _NAME.set(self.name)
        _COUNTER.set(0)

    @handles(Seq)
    def seq(self, message: Seq) -> tuple[str, int, int]:
        self.journal.add("seq", self.name, message.sender, message.n, self.incarnation)
        return (self.name, message.n, self.incarnation)

    @handles(Hold)
    def hold(self, message: Hold) -> str:
        self.journal.event(f"{message.key}:entered").set()
        assert self.journal.event(message.key).wait(20)
        return message.key

    @handles(Crash)
    def crash(self, _message: Crash) -> None:
        self.journal.add("crash", self.name, self.incarnation)
        raise ValueError("crash right after a resume")

    @handles(Count)
    def count(self, _message: Count) -> tuple[str, int]:
        value = _COUNTER.get() + 1  # a LookupError here: the resumed loop lost its context
        _COUNTER.set(value)
        return _NAME.get(), value


class InlineRecorder(Recorder):
    inline_asks = True


def recorder(name: str, journal: Journal, cls: type[Recorder] = Recorder):
    return lambda: cls(name, journal)




def _busy_threads() -> int:
    """Live threads that are not parked in the loop-thread park (a parked thread runs nothing)."""
    busy = 0
    for frame in sys._current_frames().values():
        parked = False
        while frame is not None:
            if frame.f_code is LoopThreads._park.__code__:
                parked = True
                break
            frame = frame.f_back
        busy += not parked
    return busy


def _all_idle_without_thread() -> bool:
    return _threads_in_get() == 0


def _near_linger(rng: random.Random) -> None:
    """Perturbation only: land the next send around the linger's expiry."""
    time.sleep(rng.uniform(LINGER * 0.6, LINGER * 1.4))


def _run_threads(targets) -> list[BaseException]:
    errors: list[BaseException] = []
    start = threading.Barrier(len(targets))

    def wrap(fn):
        def run():
            try:
                start.wait(10)
                fn()
            except BaseException as exc:  # noqa: BLE001 - handed to the test
                errors.append(exc)
        return run

    threads = [threading.Thread(target=wrap(fn), daemon=True) for fn in targets]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(40)
        assert not thread.is_alive(), "a sender never got its answers"
    return errors


def _by_sender(journal: Journal, name: str | None = None) -> dict[str, list[int]]:
    rows: dict[str, list[int]] = defaultdict(list)
    with journal.lock:
        for entry in journal.entries:
            if entry[0] == "seq" and (name is None or entry[1] == name):
                rows[f"{entry[1]}:{entry[2]}"].append(entry[3])
    return rows


@pytest.mark.parametrize("cls", [Recorder, InlineRecorder], ids=["queued", "inline"])
def test_many_actors_many_asks_around_the_linger_are_each_answered_once_in_order(cls):
    journal = Journal()
    rng = random.Random(7)
    with ActorSystem() as system:
        names = [f"a{i}" for i in range(12)]
        actors = {name: system.spawn(ChildSpec(name, recorder(name, journal, cls), restart=Restart.TEMPORARY))
                  for name in names}
        for handle in actors.values():
            handle.ask(Seq(sender="warm", n=0), timeout=10)

        def sender(tag: str, seed: int):
            local = random.Random(seed)

            def run():
                for n in range(25):
                    name = local.choice(names)
                    handle = actors[name]
                    if local.random() < 0.3:
                        handle.tell(Seq(sender=tag, n=n))
                    else:
                        assert handle.ask(Seq(sender=tag, n=n), timeout=20) == (name, n, 1)
                    if local.random() < 0.5:
                        _near_linger(local)
            return run

        errors = _run_threads([sender(f"s{i}", rng.randrange(1 << 30)) for i in range(8)])
        assert errors == []
        # every tell handled too: one last ask per actor per sender drains behind them
        for name, handle in actors.items():
            assert handle.ask(Seq(sender="last", n=0), timeout=20) == (name, 0, 1)
        rows = _by_sender(journal)
        sent = sum(len(v) for k, v in rows.items() if not k.endswith((":warm", ":last")))
        assert sent == 8 * 25  # each handled exactly once
        for key, ns in rows.items():
            assert ns == sorted(ns) and len(set(ns)) == len(ns), (key, ns)  # in order per sender, no double
        for handle in actors.values():
            assert handle.alive and handle.incarnation == 1


def test_tells_and_asks_from_many_threads_while_the_loop_leaves_and_resumes():
    journal = Journal()
    with ActorSystem() as system:
        handle = system.spawn(ChildSpec("r", recorder("r", journal), restart=Restart.TEMPORARY))
        per = 6
        for rnd in range(15):
            assert poll_until(_all_idle_without_thread)  # the loop has left its thread

            def sender(tag: str, seed: int):
                local = random.Random(seed)

                def run():
                    for n in range(per):
                        if n % 3 == 2:
                            assert handle.ask(Seq(sender=tag, n=n), timeout=20) == ("r", n, 1)
                        else:
                            handle.tell(Seq(sender=tag, n=n))
                        if local.random() < 0.3:
                            _near_linger(local)
                return run

            assert _run_threads([sender(f"{rnd}.{i}", rnd * 100 + i) for i in range(6)]) == []
            assert handle.ask(Seq(sender=f"{rnd}.end", n=0), timeout=20) == ("r", 0, 1)
        rows = _by_sender(journal)
        for key, ns in rows.items():
            if not key.endswith(".end"):
                assert ns == list(range(per)), (key, ns)


def test_an_inline_ask_racing_a_resume_keeps_one_message_at_a_time_in_order():
    journal = Journal()
    with ActorSystem() as system:
        handle = system.spawn(ChildSpec("i", recorder("i", journal, InlineRecorder), restart=Restart.TEMPORARY))
        for rnd in range(20):
            assert poll_until(_all_idle_without_thread)
            # A held inline handler: the loop's resumer stays in the waiters; tells that come
            # meanwhile resume the loop, which must wait for the turn and then take them in order.
            key = f"hold{rnd}"
            box: dict = {}
            asker = threading.Thread(target=lambda box=box, key=key: box.setdefault(
                "v", handle.ask(Hold(key=key), timeout=20)), daemon=True)
            asker.start()
            assert journal.event(f"{key}:entered").wait(10)
            for n in range(5):
                handle.tell(Seq(sender=f"t{rnd}", n=n))
            if rnd % 2:
                time.sleep(LINGER * 2)  # perturbation: the resumed loop lingers out behind the turn
            journal.event(key).set()
            asker.join(10)
            assert box.get("v") == key
            # handled with no further put: the end of the inline handler resumes the loop
            tag = f"t{rnd}"
            assert journal.wait_for(lambda entries, tag=tag: sum(
                1 for e in entries if e[0] == "seq" and e[2] == tag) == 5, timeout=10)
            assert handle.ask(Seq(sender=f"t{rnd}", n=5), timeout=20) == ("i", 5, 1)
        for key, ns in _by_sender(journal).items():
            assert ns == list(range(6)), (key, ns)


@pytest.mark.parametrize("how", ["stop_child", "kill", "retire"])
def test_ending_an_actor_idle_without_a_thread_strands_no_ask(how):
    journal = Journal()
    with ActorSystem() as system:
        spec = ChildSpec("x", recorder("x", journal), restart=Restart.TEMPORARY, revive_on_demand=False)
        handle = system.spawn(spec)
        handle.ask(Seq(sender="warm", n=0), timeout=10)
        assert poll_until(_all_idle_without_thread)
        # Asks queued behind a held handler, then the end asked for while idle-without-thread
        # before them: each is answered or failed, none is left waiting for its deadline.
        box: dict = {}
        holder = threading.Thread(target=lambda: box.setdefault("v", handle.ask(Hold(key="h"), timeout=20)),
                                  daemon=True)
        holder.start()
        assert journal.event("h:entered").wait(10)
        pending = [handle.ask_pending(Seq(sender="q", n=n), timeout=30) for n in range(5)]
        if how == "stop_child":
            stopper = threading.Thread(target=lambda: system.stop_child("/root/x", timeout=20), daemon=True)
            stopper.start()
        elif how == "kill":
            assert handle.kill("test")
        else:
            assert handle.retire("test")
        journal.event("h").set()
        holder.join(10)
        started = time.monotonic()
        outcomes = []
        for ask in pending:
            try:
                outcomes.append(ask.result())
            except ActorStopped as exc:
                outcomes.append(type(exc).__name__)
            except Exception as exc:  # noqa: BLE001 - recorded, checked below
                outcomes.append(type(exc).__name__)
        assert time.monotonic() - started < 10, "an ask waited for its deadline"
        assert "Timeout" not in outcomes, outcomes
        if how == "stop_child":
            stopper.join(20)
            assert not stopper.is_alive()


def test_stop_while_idle_without_thread_and_while_being_resumed(monkeypatch):
    """The pooled thread that resumes the loop is held before it runs the loop: a stop that comes
    in that gap (the resumer already taken) is still seen, and the queued asks fail ActorStopped."""
    journal = Journal()
    real = LOOP_THREADS.run
    gate = threading.Event()
    handed = threading.Event()

    def run(task, name):
        if name == "Recorder" and not gate.is_set():
            def held():
                handed.set()
                assert gate.wait(20)
                task()
            return real(held, name)
        return real(task, name)

    with ActorSystem() as system:
        handle = system.spawn(ChildSpec("y", recorder("y", journal), restart=Restart.TEMPORARY))
        handle.ask(Seq(sender="warm", n=0), timeout=10)
        assert poll_until(_all_idle_without_thread)
        monkeypatch.setattr(actor_module.LOOP_THREADS, "run", run)
        pending = [handle.ask_pending(Seq(sender="q", n=n), timeout=30) for n in range(4)]
        assert handed.wait(10)  # its loop is being resumed, not yet running
        stopper = threading.Thread(target=lambda: system.stop_child("/root/y", timeout=20), daemon=True)
        stopper.start()
        assert poll_until(lambda: handle.state == HandleState.STOPPING, timeout=10)  # its stop is queued
        gate.set()
        stopper.join(20)
        assert not stopper.is_alive()
        for ask in pending:  # handled before the stop was taken, or failed ActorStopped: never stranded
            try:
                assert ask.result()[0] == "y"
            except ActorStopped:
                pass


def test_a_crash_right_after_a_resume_hands_the_queue_to_the_next_incarnation():
    journal = Journal()
    with ActorSystem() as system:
        handle = system.spawn(ChildSpec("c", recorder("c", journal), restart=Restart.PERMANENT))
        handle.ask(Seq(sender="warm", n=0), timeout=10)
        for rnd in range(3):  # the root's restart intensity: 3 in 5 s
            assert poll_until(_all_idle_without_thread)
            incarnation = handle.incarnation
            handle.tell(Crash())  # resumes the loop, whose first message crashes it
            pending = [handle.ask_pending(Seq(sender=f"r{rnd}", n=n), timeout=20) for n in range(5)]
            answers = [ask.result() for ask in pending]  # handled by the next incarnation
            assert [a[1] for a in answers] == list(range(5))
            assert all(a[2] == incarnation + 1 for a in answers), answers
        for key, ns in _by_sender(journal).items():
            assert ns == sorted(set(ns)), (key, ns)


def test_a_thread_pool_failure_at_a_resume_under_concurrent_senders_loses_nothing(monkeypatch):
    journal = Journal()
    with ActorSystem() as system:
        handle = system.spawn(ChildSpec("p", recorder("p", journal), restart=Restart.TEMPORARY))
        handle.ask(Seq(sender="warm", n=0), timeout=10)
        real = actor_module.LOOP_THREADS.run
        for rnd in range(10):
            assert poll_until(_all_idle_without_thread)
            failed = []

            def run(task, name, failed=failed):
                if name == "Recorder" and not failed:
                    failed.append(name)
                    raise RuntimeError("can't start new thread")
                return real(task, name)

            monkeypatch.setattr(actor_module.LOOP_THREADS, "run", run)
            handle.tell(Seq(sender=f"f{rnd}", n=0))  # its resume fails: queued, the loop still waits
            assert failed == ["Recorder"]

            def sender(tag: str):
                def go():
                    for n in range(1, 6):
                        assert handle.ask(Seq(sender=tag, n=n), timeout=20) == ("p", n, 1)
                return go

            assert _run_threads([sender(f"f{rnd}" if i == 0 else f"g{rnd}.{i}") for i in range(4)]) == []
            monkeypatch.setattr(actor_module.LOOP_THREADS, "run", real)
        for key, ns in _by_sender(journal).items():
            assert ns == sorted(set(ns)), (key, ns)
        assert sum(len(ns) for k, ns in _by_sender(journal).items() if ":f" in k) == 10 * 6


def test_a_thread_pool_failure_at_a_stop_is_retried_by_the_next_put(monkeypatch):
    journal = Journal()
    with ActorSystem() as system:
        handle = system.spawn(ChildSpec("s", recorder("s", journal), restart=Restart.PERMANENT))
        handle.ask(Seq(sender="warm", n=0), timeout=10)
        assert poll_until(_all_idle_without_thread)
        real = actor_module.LOOP_THREADS.run
        failed = []

        def run(task, name):
            if name == "Recorder" and not failed:
                failed.append(name)
                raise RuntimeError("can't start new thread")
            return real(task, name)

        monkeypatch.setattr(actor_module.LOOP_THREADS, "run", run)
        assert handle.kill("test")  # a control item whose resume fails
        assert failed == ["Recorder"]
        # the next put resumes the loop: the kill first (controls first), then the ask, by the
        # next incarnation
        assert handle.ask(Seq(sender="after", n=1), timeout=20) == ("s", 1, 2)


def test_contextvars_survive_many_resumes_under_concurrent_askers():
    journal = Journal()
    with ActorSystem() as system:
        handles_ = [system.spawn(ChildSpec(f"v{i}", recorder(f"v{i}", journal), restart=Restart.TEMPORARY))
                    for i in range(4)]
        seen: dict[str, list[int]] = defaultdict(list)
        lock = threading.Lock()

        def asker(seed: int):
            local = random.Random(seed)

            def run():
                for _ in range(30):
                    handle = local.choice(handles_)
                    name, value = handle.ask(Count(), timeout=20)
                    assert name == handle.path.rsplit("/", 1)[1]
                    with lock:
                        seen[name].append(value)
                    if local.random() < 0.5:
                        _near_linger(local)
            return run

        assert _run_threads([asker(i) for i in range(5)]) == []
        for name, values in seen.items():  # one counter per incarnation, carried over every resume
            assert sorted(values) == list(range(1, len(values) + 1)), (name, sorted(values))


class ChainLink(Actor):
    """Relays to the next idle link (an ask from its handler): a chain of resumes."""

    def __init__(self, nxt: list) -> None:
        super().__init__()
        self.nxt = nxt

    @handles(Relay)
    def relay(self, message: Relay) -> list[int]:
        if not self.nxt:
            return [message.n]
        return [message.n, *self.nxt[0].ask(Relay(n=message.n + 1), timeout=20)]


def test_a_handler_asking_another_idle_actor_resumes_a_chain_of_loops():
    with ActorSystem() as system:
        links: list = []
        depth = 8
        tails: list[list] = [[] for _ in range(depth)]
        for i in reversed(range(depth)):
            links.insert(0, system.spawn(ChildSpec(f"l{i}", (lambda t=tails[i]: ChainLink(t)),
                                                   restart=Restart.TEMPORARY)))
            if i + 1 < depth:
                tails[i].append(links[1])
        rng = random.Random(3)
        for rnd in range(20):
            if rnd % 4 == 0:
                assert poll_until(_all_idle_without_thread)  # every link waits without a thread
            elif rnd % 2:
                _near_linger(rng)
            assert links[0].ask(Relay(n=0), timeout=30) == list(range(depth))

        def chain():
            for _ in range(5):
                assert links[0].ask(Relay(n=0), timeout=30) == list(range(depth))
        assert _run_threads([chain for _ in range(4)]) == []


def test_shutdown_with_hundreds_of_idle_actors_leaks_no_thread():
    baseline = _busy_threads()
    journal = Journal()
    system = ActorSystem()
    try:
        handles_ = [system.spawn(ChildSpec(f"h{i}", recorder(f"h{i}", journal), restart=Restart.TEMPORARY))
                    for i in range(300)]
        for handle in handles_:
            handle.ask(Seq(sender="warm", n=0), timeout=10)
        assert poll_until(_all_idle_without_thread, timeout=10)
        assert _busy_threads() < baseline + 20  # 300 idle actors, no thread each
    finally:
        assert system.shutdown(30)
    assert all(not handle.alive for handle in handles_)
    assert poll_until(lambda: _busy_threads() <= baseline, timeout=10), (_busy_threads(), baseline)
    assert LOOP_THREADS.parked <= LOOP_THREADS.max_parked


class CutLoose(Recorder):
    def after_cut_loose(self) -> None:
        self.journal.add("cut loose ended", self.name, self.incarnation)
        self.journal.event("cut loose ended").set()


def test_an_incarnation_cut_loose_while_idle_without_thread_ends_when_its_mailbox_closes():
    """A brutal stop (abandon, then close) of an actor waiting without a thread: the close
    resumes its loop, which finds the mailbox closed and ends (after_cut_loose runs)."""
    journal = Journal()
    with ActorSystem() as system:
        handle = system.spawn(ChildSpec("k", recorder("k", journal, CutLoose), restart=Restart.TEMPORARY))
        handle.ask(Seq(sender="warm", n=0), timeout=10)
        assert poll_until(_all_idle_without_thread)
        handle.abandon()
        assert not journal.event("cut loose ended").is_set()  # nothing came: it still waits, threadless
        handle.close("brutal stop")
        assert journal.event("cut loose ended").wait(10)
        assert journal.count("cut loose ended", "k", 1) == 1
        with pytest.raises(ActorStopped):
            handle.ask(Seq(sender="late", n=1), timeout=5)


class Tracked(Recorder):
    def on_terminate(self, cause) -> None:
        self.journal.add("terminated", self.name, str(cause))


def _fail_once(monkeypatch, cls_name: str) -> list[str]:
    real = actor_module.LOOP_THREADS.run
    failed: list[str] = []

    def run(task, name):
        if name == cls_name and not failed:
            failed.append(name)
            raise RuntimeError("can't start new thread")
        return real(task, name)

    monkeypatch.setattr(actor_module.LOOP_THREADS, "run", run)
    return failed


def test_a_stop_whose_resume_finds_no_thread_still_stops_cleanly(monkeypatch):
    """No further put comes after a stop: the loop must still be resumed (retried), the stop
    handled by on_terminate -- not left to the shutdown timeout and a brutal cut-loose."""
    journal = Journal()
    with ActorSystem() as system:
        handle = system.spawn(ChildSpec("t", recorder("t", journal, Tracked), restart=Restart.TEMPORARY,
                                        shutdown_timeout=20.0))
        handle.ask(Seq(sender="warm", n=0), timeout=10)
        assert poll_until(_all_idle_without_thread)
        failed = _fail_once(monkeypatch, "Tracked")
        assert not handle.stop(0)  # the stop's resume fails: nothing else will come
        assert failed == ["Tracked"]
        assert handle.wait_exited(10)  # before: only the next put (none) resumed it
        assert journal.count("terminated", "t", "stopped") == 1


def test_a_close_whose_resume_finds_no_thread_still_ends_the_cut_loose_incarnation(monkeypatch):
    journal = Journal()
    with ActorSystem() as system:
        handle = system.spawn(ChildSpec("k", recorder("k", journal, CutLoose), restart=Restart.TEMPORARY))
        handle.ask(Seq(sender="warm", n=0), timeout=10)
        assert poll_until(_all_idle_without_thread)
        failed = _fail_once(monkeypatch, "CutLoose")
        handle.abandon()
        handle.close("brutal stop")  # the resume fails; a closed mailbox gets no further put
        assert failed == ["CutLoose"]
        assert journal.event("cut loose ended").wait(10)  # before: never (the resumer was dropped)


def test_with_no_thread_and_no_timer_the_next_put_resumes_the_loop(monkeypatch):
    journal = Journal()
    with ActorSystem() as system:
        handle = system.spawn(ChildSpec("n", recorder("n", journal), restart=Restart.TEMPORARY))
        handle.ask(Seq(sender="warm", n=0), timeout=10)
        assert poll_until(_all_idle_without_thread)
        failed = _fail_once(monkeypatch, "Recorder")

        def no_timer(*_args, **_kwargs):
            raise RuntimeError("can't start new thread")

        monkeypatch.setattr(actor_module, "call_later", no_timer)
        handle.tell(Seq(sender="q", n=1))  # queued; no thread, no retry: the mailbox keeps the resumer
        assert failed == ["Recorder"]
        assert handle.ask(Seq(sender="q", n=2), timeout=10) == ("n", 2, 1)
        assert _by_sender(journal)["n:q"] == [1, 2]

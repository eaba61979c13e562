"""The runtime core as a library user meets it, from the outside, with hostile inputs: handlers that
raise what is not an ``Exception`` or cannot even be printed, handlers that never return,
deadlines that are no number, stops and shutdowns asked for from inside the actor they stop,
factories that fail, a flood of short-lived actors."""

from __future__ import annotations

import gc
import math
import threading
import time
import weakref

import pytest

from castor.messages.base import Message
from castor.messages.errors import ActorCrashed, ActorStopped, CastorError, InvalidParams, NotFound, Timeout
from castor.runtime import Runtime, RuntimeSettings
from castor.supervision import Actor, ActorSystem, ChildSpec, Restart, handles
from castor.supervision.kinds import WhichChildren
from castor.supervision.threads import LOOP_THREADS
from castor.supervision.timers import Timers

from .helpers import poll_until


class Do(Message, type_name="test.hostile.do"):
    what: str = ""


class _Unprintable(Exception):
    def __str__(self) -> str:
        raise RuntimeError("this exception cannot be printed")


class _Unrepresentable(Exception):
    def __repr__(self) -> str:
        raise RuntimeError("this exception has no repr")


_RAISES: dict[str, BaseException] = {
    "system_exit": SystemExit(3),
    "keyboard_interrupt": KeyboardInterrupt(),
    "generator_exit": GeneratorExit(),
    "unprintable": _Unprintable(),
    "unrepresentable": _Unrepresentable("x"),
}


class Hostile(Actor):
    """Does what its message says; tells its life to ``Hostile.journal``."""

    journal: list[tuple] = []
    gate = threading.Event()
    system: ActorSystem | Runtime | None = None
    entered = threading.Event()

    def on_terminate(self, cause: str) -> None:
        Hostile.journal.append(("end", self.path, self.incarnation, str(cause)))

    @handles(Do)
    def do(self, message: Do) -> object:
        what = message.what
        if what in _RAISES:
            raise _RAISES[what]
        if what == "block":
            Hostile.entered.set()
            Hostile.gate.wait(30)
            return "released"
        if what == "ask_self":
            started = time.monotonic()
            try:
                self.handle.ask(Do(what="ping"), timeout=0.3)
            except Timeout as timeout:
                return ("timeout", timeout.may_have_started, time.monotonic() - started)
        if what == "stop_self_by_path":
            started = time.monotonic()
            assert isinstance(Hostile.system, ActorSystem)
            Hostile.system.stop_child(self.path)
            return ("asked", time.monotonic() - started)
        if what == "shutdown":
            started = time.monotonic()
            assert Hostile.system is not None
            return (Hostile.system.shutdown(30), time.monotonic() - started)
        return (what, self.incarnation)


@pytest.fixture(autouse=True)
def _fresh_hostile():
    Hostile.journal = []
    Hostile.gate = threading.Event()
    Hostile.entered = threading.Event()
    Hostile.system = None
    yield
    Hostile.gate.set()


@pytest.mark.timeout(30)
@pytest.mark.parametrize("what", sorted(_RAISES))
def test_a_handler_raising_any_base_exception_or_an_unprintable_one_crashes_only_its_actor(what):
    """SystemExit, KeyboardInterrupt, GeneratorExit, and exceptions whose str() or repr() raises:
    the asker gets ``actor_crashed`` chained to it, the actor is restarted and answers again."""
    system = ActorSystem([ChildSpec("a", Hostile), ChildSpec("b", Hostile)])
    try:
        a = system.lookup("/root/a")
        with pytest.raises(ActorCrashed) as crashed:
            a.ask(Do(what=what), timeout=5)
        assert crashed.value.__cause__ is _RAISES[what]
        assert a.ask(Do(what="ping"), timeout=5) == ("ping", 2)  # restarted, not a zombie
        assert system.lookup("/root/b").ask(Do(what="ping"), timeout=5) == ("ping", 1)
        assert ("end", "/root/a", 1, "crashed") in Hostile.journal
        a.tell(Do(what=what))  # by tell alike
        assert a.ask(Do(what="ping"), timeout=5) == ("ping", 3)
        assert not system.fatal.is_set()
    finally:
        assert system.shutdown(10)


@pytest.mark.timeout(30)
def test_an_incarnation_cut_loose_answers_its_asker_at_once_and_frees_its_thread_once_unblocked():
    """A handler that overruns its stop is cut loose: its asker learns at once (``actor_stopped``,
    ``may_have_started``), and once the handler does return its loop ends instead of waiting for
    ever on the closed mailbox, holding the thread and the actor."""
    system = ActorSystem([ChildSpec("stuck", Hostile, shutdown_timeout=0.2)])
    try:
        handle = system.lookup("/root/stuck")
        actor = weakref.ref(handle.actor)
        pending = handle.ask_pending(Do(what="block"), timeout=25)
        assert Hostile.entered.wait(5)
        queued = handle.ask_pending(Do(what="ping"), timeout=25)
        started = time.monotonic()
        system.stop_child("/root/stuck", timeout=10)
        assert time.monotonic() - started < 5  # bounded by its shutdown timeout
        assert queued.done and pending.done
        with pytest.raises(ActorStopped) as stopped:
            pending.result()
        assert stopped.value.may_have_started is True
        with pytest.raises(ActorStopped) as rejected:
            queued.result()
        assert rejected.value.may_have_started is False
        Hostile.gate.set()  # the handler returns now; nothing may take its late answer
        assert poll_until(lambda: gc.collect() >= 0 and actor() is None, timeout=10), \
            "the loop of the cut-loose incarnation still holds its actor (its thread never ended)"
    finally:
        system.shutdown(10)


@pytest.mark.timeout(20)
@pytest.mark.parametrize("timeout", [math.nan, math.inf, 1e12], ids=["nan", "inf", "too-long"])
def test_an_ask_whose_timeout_is_no_usable_deadline_is_refused_and_sends_nothing(timeout):
    system = ActorSystem([ChildSpec("a", Hostile)])
    try:
        handle = system.lookup("/root/a")
        for ask in (handle.ask, handle.ask_pending):
            with pytest.raises(InvalidParams) as refused:
                ask(Do(what="block"), timeout=timeout)
            assert refused.value.code == "invalid_params"
        assert not Hostile.entered.is_set()  # nothing was sent
        assert handle.snapshot().mailbox.processed == 0
        assert handle.ask(Do(what="ping"), timeout=5) == ("ping", 1)
        with pytest.raises(Timeout) as late:  # a deadline already past: at once, withdrawn
            handle.ask(Do(what="ping"), timeout=-1)
        assert late.value.may_have_started is False
    finally:
        system.shutdown(10)


@pytest.mark.timeout(20)
def test_a_timer_with_no_usable_delay_is_refused_and_no_callback_can_stop_the_timer_thread():
    timers = Timers("test-hostile-timers")  # a private timer thread: the process's stays unharmed
    for delay in (math.nan, math.inf, 1e12):
        with pytest.raises(InvalidParams):
            timers.call_later(delay, lambda: None)
    fired: list[str] = []
    done = threading.Event()

    def raise_(exc: BaseException):
        def callback() -> None:
            fired.append(type(exc).__name__)
            raise exc
        return callback

    timers.call_later(0.0, raise_(SystemExit(1)))
    timers.call_later(0.01, raise_(_Unprintable()))
    timers.call_later(0.02, done.set)
    assert done.wait(5), "a callback's exception stopped every later timer"
    assert fired == ["SystemExit", "_Unprintable"]


def _broken_factory() -> Actor:
    raise ValueError("cannot build this child")


@pytest.mark.timeout(30)
def test_a_child_whose_factory_fails_is_refused_to_its_starter_and_its_supervisor_goes_on():
    """Through ``StartChild`` (not a direct start): the starter gets ``actor_crashed`` chained to
    the factory's error; the supervisor -- here the root, whose crash fails the runtime -- runs on."""
    system = ActorSystem([ChildSpec("a", Hostile)])
    try:
        for restart in (Restart.PERMANENT, Restart.TEMPORARY):
            with pytest.raises(ActorCrashed) as crashed:
                system.spawn(ChildSpec("broken", _broken_factory, restart=restart))
            assert isinstance(crashed.value.__cause__, ValueError)
            assert crashed.value.may_have_started is False
        assert not system.fatal.is_set() and system.root.incarnation == 1
        assert system.lookup("/root/a").ask(Do(what="ping"), timeout=5) == ("ping", 1)
        assert system.root.ask(WhichChildren(), timeout=5) == ["/root/a"]
        for capacity in (0, -1, 2.5):
            with pytest.raises(ValueError):
                ChildSpec("bad", Hostile, mailbox_capacity=capacity)  # type: ignore[arg-type]  # the refusal is the point
    finally:
        system.shutdown(10)


@pytest.mark.timeout(30)
@pytest.mark.parametrize("what", ["keyboard_interrupt", "system_exit", "generator_exit"])
def test_a_child_whose_factory_raises_a_base_exception_is_refused_to_its_starter_like_any_failed_start(what):
    """Through ``StartChild`` the factory runs on the supervisor's thread: a KeyboardInterrupt,
    SystemExit or GeneratorExit it raises is its own failure there (no signal reaches a thread
    that is not the main one, and no thread's SystemExit ends the process), so it is a failed
    start like any other: the starter gets ``actor_crashed`` chained to it, the id is free again
    and the supervisor -- the root here, whose crash would fail the runtime -- runs on."""
    system = ActorSystem([ChildSpec("a", Hostile)])
    try:
        def raising() -> Actor:
            raise _RAISES[what]

        for restart in (Restart.PERMANENT, Restart.TEMPORARY):
            with pytest.raises(ActorCrashed) as crashed:
                system.spawn(ChildSpec("broken", raising, restart=restart))
            assert crashed.value.__cause__ is _RAISES[what]
            assert crashed.value.may_have_started is False
        assert not system.fatal.is_set() and system.root.incarnation == 1
        assert system.root.ask(WhichChildren(), timeout=5) == ["/root/a"]  # no slot left holding the id
        assert system.spawn(ChildSpec("broken", Hostile)).ask(Do(what="ping"), timeout=5) == ("ping", 1)
        assert system.lookup("/root/a").ask(Do(what="ping"), timeout=5) == ("ping", 1)
    finally:
        assert system.shutdown(10)


@pytest.mark.timeout(30)
@pytest.mark.parametrize("what", ["keyboard_interrupt", "system_exit", "generator_exit"])
def test_a_restart_whose_factory_raises_a_base_exception_is_a_failed_start_tried_again(what):
    """The restart path alike: a factory raising a BaseException when its child is restarted is
    a failed start (logged, counted toward the supervisor's intensity, tried again), not a crash
    of the supervisor."""
    built: list[int] = []

    def once_broken() -> Actor:
        built.append(1)
        if len(built) == 2:  # the first restart
            raise _RAISES[what]
        return Hostile()

    system = ActorSystem([ChildSpec("a", once_broken)])
    try:
        a = system.lookup("/root/a")
        with pytest.raises(ActorCrashed):
            a.ask(Do(what="unprintable"), timeout=5)
        assert poll_until(lambda: a.alive and len(built) == 3, timeout=5)
        assert a.ask(Do(what="ping"), timeout=5)[0] == "ping"
        assert not system.fatal.is_set() and system.root.incarnation == 1
    finally:
        assert system.shutdown(10)


@pytest.mark.timeout(30)
def test_a_direct_start_interrupted_by_a_base_exception_leaves_no_slot_behind():
    system = ActorSystem()
    try:
        def interrupted() -> Actor:
            raise KeyboardInterrupt

        with pytest.raises(KeyboardInterrupt):
            system.spawn(ChildSpec("d", interrupted, restart=Restart.TEMPORARY, direct_start=True))
        handle = system.spawn(ChildSpec("d", Hostile, restart=Restart.TEMPORARY, direct_start=True))
        assert handle.ask(Do(what="ping"), timeout=5) == ("ping", 1)
    finally:
        system.shutdown(10)


@pytest.mark.timeout(30)
def test_spawning_or_stopping_under_an_actor_that_is_no_supervisor_is_refused_and_harms_nothing():
    system = ActorSystem([ChildSpec("a", Hostile)])
    try:
        with pytest.raises(InvalidParams):
            system.spawn(ChildSpec("c", Hostile), under="/root/a")
        with pytest.raises(InvalidParams):
            system.stop_child("/root/a/c")
        with pytest.raises(NotFound):
            system.spawn(ChildSpec("c", Hostile), under="/root/nobody")
        a = system.lookup("/root/a")
        assert a.ask(Do(what="ping"), timeout=5) == ("ping", 1) and a.restarts == 0
    finally:
        system.shutdown(10)


@pytest.mark.timeout(30)
def test_asking_yourself_ends_by_the_deadline_withdrawn_and_the_actor_goes_on():
    system = ActorSystem([ChildSpec("a", Hostile)])
    try:
        a = system.lookup("/root/a")
        kind, may_have_started, waited = a.ask(Do(what="ask_self"), timeout=5)
        assert (kind, may_have_started) == ("timeout", False) and waited < 3
        assert a.ask(Do(what="ping"), timeout=5) == ("ping", 1)
        assert a.snapshot().mailbox.processed == 2  # the withdrawn self-ask never ran
    finally:
        system.shutdown(10)


@pytest.mark.timeout(30)
def test_a_stop_asked_for_from_inside_the_actor_it_stops_returns_at_once_and_stops_it_cleanly():
    system = ActorSystem([ChildSpec("a", Hostile, shutdown_timeout=5)])
    Hostile.system = system
    try:
        a = system.lookup("/root/a")
        kind, waited = a.ask(Do(what="stop_self_by_path"), timeout=10)
        assert kind == "asked" and waited < 1  # not the 5 s its supervisor would wait for it
        assert a.closed.wait(5)
        assert ("end", "/root/a", 1, "stopped") in Hostile.journal  # stopped, not cut loose
        with pytest.raises(NotFound):
            system.lookup("/root/a")
        with pytest.raises(ActorStopped):
            a.ask(Do(what="ping"), timeout=5)
    finally:
        system.shutdown(10)


@pytest.mark.timeout(30)
def test_shutting_the_system_down_from_inside_one_of_its_actors_returns_at_once_and_stops_all():
    system = ActorSystem([ChildSpec("a", Hostile, shutdown_timeout=5), ChildSpec("b", Hostile)])
    Hostile.system = system
    a = system.lookup("/root/a")
    clean, waited = a.ask(Do(what="shutdown"), timeout=10)
    assert clean is False and waited < 1  # it cannot wait for its own caller's stop
    assert system.root.closed.wait(10) and not system.fatal.is_set()
    assert {("end", "/root/a", 1, "stopped"), ("end", "/root/b", 1, "stopped")} <= set(Hostile.journal)
    assert system.shutdown(5) is True  # again, from outside: nothing left to stop
    with pytest.raises(ActorStopped):
        a.ask(Do(what="ping"), timeout=5)


@pytest.mark.timeout(60)
def test_a_runtime_shut_down_from_inside_one_of_its_actors_and_then_twice_from_outside(tmp_path):
    runtime = Runtime(RuntimeSettings(), extra_children=[ChildSpec("mine", Hostile, shutdown_timeout=5)])
    Hostile.system = runtime
    mine = runtime.system.lookup("/root/mine")
    clean, waited = mine.ask(Do(what="shutdown"), timeout=10)
    assert clean is False and waited < 1
    assert runtime.system.root.closed.wait(20) and not runtime.system.fatal.is_set()
    assert ("end", "/root/mine", 1, "stopped") in Hostile.journal
    assert runtime.shutdown(10) is True
    assert runtime.shutdown(10) is True


@pytest.mark.timeout(30)
def test_a_stopped_actors_queued_asks_fail_at_once_and_later_sends_are_refused_at_once():
    system = ActorSystem([ChildSpec("a", Hostile, shutdown_timeout=5)])
    try:
        a = system.lookup("/root/a")
        a.tell(Do(what="block"))
        assert Hostile.entered.wait(5)
        queued = [a.ask_pending(Do(what="ping"), timeout=25) for _ in range(50)]
        stopper = threading.Thread(target=system.stop_child, args=("/root/a",), kwargs={"timeout": 20})
        stopper.start()
        assert poll_until(lambda: a.snapshot().state == "stopping")
        Hostile.gate.set()
        stopper.join(10)
        assert all(p.done for p in queued)
        for pending in queued:
            with pytest.raises(ActorStopped) as stopped:
                pending.result()
            assert stopped.value.may_have_started is False
        started = time.monotonic()
        for send in (a.tell, lambda m: a.ask(m, timeout=20)):
            with pytest.raises(ActorStopped):
                send(Do(what="ping"))
        assert time.monotonic() - started < 1
    finally:
        system.shutdown(10)


@pytest.mark.timeout(120)
@pytest.mark.slow
def test_ten_thousand_actors_spawned_and_stopped_leave_threads_registry_and_memory_as_they_were():
    system = ActorSystem()
    try:
        def churn(n: int) -> None:
            for i in range(n):
                spec = ChildSpec(f"c{i}", Hostile, restart=Restart.TEMPORARY, direct_start=True)
                handle = system.spawn(spec)
                assert handle.ask(Do(what="ping"), timeout=10) == ("ping", 1)
                system.stop_child(handle.path, timeout=10)

        churn(500)  # warm the thread park and the caches
        gc.collect()
        threads_before = threading.active_count()
        actors_before = len(system.snapshot_data()["actors"])
        import tracemalloc

        tracemalloc.start()
        try:
            memory_before = tracemalloc.get_traced_memory()[0]
            churn(10_000)
            gc.collect()
            grown = tracemalloc.get_traced_memory()[0] - memory_before
        finally:
            tracemalloc.stop()
        assert len(system.snapshot_data()["actors"]) == actors_before
        assert threading.active_count() <= threads_before + LOOP_THREADS.max_parked
        assert grown < 2_000_000, f"{grown} bytes kept by 10,000 stopped actors"
        assert system.root.ask(WhichChildren(), timeout=5) == []
    finally:
        system.shutdown(10)


@pytest.mark.timeout(60)
def test_a_restart_storm_escalates_to_a_fatal_root_in_bounded_time_and_strands_no_ask():
    class CrashesAtStart(Hostile):
        def on_start(self) -> None:
            raise RuntimeError("crash at every start")

    system = ActorSystem([ChildSpec("a", Hostile)])
    started = time.monotonic()
    try:
        system.spawn(ChildSpec("storm", CrashesAtStart))  # permanent: restarted at every crash
        assert system.fatal.wait(20)
        assert time.monotonic() - started < 20
        a = system.find("/root/a")
        assert a is None or a.closed.wait(5)
        with pytest.raises(CastorError):
            system.root.ask(WhichChildren(), timeout=5)
    finally:
        system.shutdown(10)


@pytest.mark.timeout(30)
def test_a_huge_or_unpicklable_message_is_handed_over_as_it_is():
    class Anything(Actor):
        def receive(self, message: object) -> object:
            return message  # any Python object: local messages are never copied nor pickled

    system = ActorSystem([ChildSpec("a", Anything, mailbox_capacity=2)])
    try:
        a = system.lookup("/root/a")
        huge = Do(what="x" * 50_000_000)
        assert a.ask(huge, timeout=10) is huge
        lock = threading.Lock()  # unpicklable
        assert a.ask(lock, timeout=5) is lock
        assert a.snapshot().mailbox.by_type == {}
    finally:
        system.shutdown(10)


class _OwnsBadly(Hostile):
    """An actor whose ``owned_pids`` has a bug (it names a process it has not started)."""

    def owned_pids(self) -> list[int]:
        raise AttributeError("'NoneType' object has no attribute 'pid'")


@pytest.mark.timeout(30)
def test_an_actor_whose_owned_pids_raises_still_terminates_is_killed_and_stopped_with_its_siblings():
    system = ActorSystem([ChildSpec("a", Hostile), ChildSpec("bad", _OwnsBadly, shutdown_timeout=0.2)])
    try:
        bad = system.lookup("/root/bad")
        with pytest.raises(ActorCrashed):
            bad.ask(Do(what="system_exit"), timeout=5)
        # on_terminate runs all the same (after the asker has its answer: wait for it)
        assert poll_until(lambda: ("end", "/root/bad", 1, "crashed") in Hostile.journal)
        assert poll_until(lambda: bad.incarnation == 2 and bad.alive)
        from castor.supervision import faults

        faults.kill(bad)  # delivered, though killing what it owns fails
        assert poll_until(lambda: bad.incarnation == 3 and bad.alive)
        bad.tell(Do(what="block"))
        assert Hostile.entered.wait(5)
    finally:
        system.shutdown(10)  # "bad" overruns and is cut loose; its sibling must still be stopped
    assert ("end", "/root/a", 1, "stopped") in Hostile.journal
    assert system.root.closed.is_set() and system.find("/root/a") is None


@pytest.mark.timeout(10)
@pytest.mark.parametrize("seconds", [-1.0, math.nan, math.inf])
def test_a_delay_fault_with_no_usable_duration_is_refused_not_turned_into_a_crash(seconds):
    from castor.supervision import faults

    system = ActorSystem([ChildSpec("a", Hostile)])
    try:
        a = system.lookup("/root/a")
        with pytest.raises(InvalidParams):
            faults.delay_next(a, seconds)
        assert a.ask(Do(what="ping"), timeout=5) == ("ping", 1)  # not crashed by it
    finally:
        system.shutdown(10)

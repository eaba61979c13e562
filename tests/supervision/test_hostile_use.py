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
from castor.messages.errors import ActorStopped, InvalidParams, Timeout
from castor.runtime import Runtime
from castor.supervision import Actor, ActorSystem, ChildSpec, handles
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


class _OwnsBadly(Hostile):
    """An actor whose ``owned_pids`` has a bug (it names a process it has not started)."""

    def owned_pids(self) -> list[int]:
        raise AttributeError("'NoneType' object has no attribute 'pid'")


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

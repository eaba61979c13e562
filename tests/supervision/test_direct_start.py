"""Direct temporary children: started on the caller's thread, bookkept on their own.

What must hold (supervisor.py module doc): no round trip through the supervisor's mailbox to
start or end one; its own exit removes it (``on_removed`` runs once); an exit the supervisor
caused is the supervisor's to bookkeep; a terminating supervisor refuses new ones, so none
outlives it; the answers (Conflict, a failing factory) are those of a ``StartChild``.
"""

from __future__ import annotations

import threading

import pytest

from castor.messages.errors import ActorStopped, CastorError, Conflict
from castor.supervision import ActorSystem, ChildSpec, Restart, faults, supervisor_spec
from castor.supervision.kinds import ChildExited
from castor.supervision.supervisor import WhichChildren

from .helpers import Journal, Ping, Quit, Worker, poll_until, worker

pytestmark = pytest.mark.timeout(30)

POOL = "/root/pool"


def _system() -> ActorSystem:
    return ActorSystem([supervisor_spec("pool", [], max_restarts=100, within_seconds=10)])


def _direct(name: str, journal: Journal, **kw) -> ChildSpec:
    return ChildSpec(name, worker(name, journal), restart=Restart.TEMPORARY, direct_start=True, **kw)


def test_not_awaiting_the_start_is_refused_for_children_that_can_restart():
    journal = Journal()
    for restart in (Restart.PERMANENT, Restart.TRANSIENT):
        with pytest.raises(ValueError):
            ChildSpec("x", worker("x", journal), restart=restart, direct_start=True, await_start=False)


def test_a_direct_transient_child_is_started_without_the_supervisor_and_restarted_by_it():
    journal = Journal()
    system = _system()
    try:
        pool = system.lookup(POOL)
        before = pool.snapshot().mailbox.processed
        spec = ChildSpec("t", worker("t", journal), restart=Restart.TRANSIENT, direct_start=True)
        handle = system.spawn(spec, under=POOL, timeout=5)
        assert journal.count("start", "t") == 1 and pool.snapshot().mailbox.processed == before
        handle.kill("test")  # a crash: its ChildExited reaches the supervisor, which restarts it
        assert poll_until(lambda: handle.incarnation == 2 and handle.alive, timeout=5)
        assert handle.ask(Ping(n=4), timeout=5) == ("t", 2, 4)
        handle.tell(Quit())  # a normal exit of a transient child: removed, not restarted
        assert handle.closed.wait(5)
        assert pool.ask(WhichChildren(), timeout=5) == []
    finally:
        system.shutdown(10)


def test_a_direct_child_starts_and_ends_without_a_message_to_its_supervisor():
    journal = Journal()
    removed: list[tuple[str, str]] = []
    system = _system()
    try:
        pool = system.lookup(POOL)
        before = pool.snapshot().mailbox.processed
        # A delayed supervisor would hold any StartChild for 3 s, past the spawn's 2 s: a direct
        # start must not wait.
        faults.delay_next(pool, 3.0)
        spec = _direct("w1", journal, on_removed=lambda reason: removed.append(
            (reason, threading.current_thread().name)))
        handle = system.spawn(spec, under=POOL, timeout=2.0)
        assert handle.ask(Ping(n=1), timeout=2) == ("w1", 1, 1)
        assert journal.count("start", "w1") == 1  # on_start had run when spawn returned
        handle.tell(Quit())
        assert handle.closed.wait(5)
        assert poll_until(lambda: removed, timeout=5)
        assert removed == [("exited (stopped), restart=temporary", removed[0][1])]
        assert removed[0][1].startswith("Worker")  # bookkept on the child's own thread
        assert system.find(handle.path) is None
        assert pool.snapshot().mailbox.processed == before  # nothing reached the supervisor
        assert pool.ask(WhichChildren(), timeout=10) == []
    finally:
        system.shutdown(10)


def test_a_crashed_direct_child_is_removed_and_its_queued_asks_fail():
    journal = Journal()
    system = _system()
    try:
        handle = system.spawn(_direct("w2", journal), under=POOL)
        handle.kill("test")
        assert handle.closed.wait(5)
        with pytest.raises(ActorStopped):
            handle.ask(Ping(n=2), timeout=2)
        assert system.lookup(POOL).ask(WhichChildren(), timeout=5) == []
    finally:
        system.shutdown(10)


def test_a_stop_by_request_is_the_supervisors_to_bookkeep():
    journal = Journal()
    removed: list[str] = []
    system = _system()
    try:
        handle = system.spawn(_direct("w3", journal, on_removed=removed.append), under=POOL)
        system.stop_child(handle.path)
        assert handle.closed.is_set() and not handle.alive
        assert system.lookup(POOL).ask(WhichChildren(), timeout=5) == []
        assert removed == []  # stopped, not "removed instead of restarted" (as with StartChild)
    finally:
        system.shutdown(10)


def test_a_duplicate_id_is_a_conflict_and_a_failing_factory_raises():
    journal = Journal()
    system = _system()
    try:
        system.spawn(_direct("dup", journal), under=POOL)
        with pytest.raises(Conflict):
            system.spawn(_direct("dup", journal), under=POOL)

        def broken():
            raise RuntimeError("cannot build")

        with pytest.raises(RuntimeError):
            system.spawn(ChildSpec("bad", broken, restart=Restart.TEMPORARY, direct_start=True), under=POOL)
        assert sorted(system.lookup(POOL).ask(WhichChildren(), timeout=5)) == [f"{POOL}/dup"]
    finally:
        system.shutdown(10)


class _StartsOnCaller(Worker):
    start_on_caller = True  # on_start on the spawning thread, outside the table lock


@pytest.mark.parametrize("on_caller", [False, True], ids=["loop-thread-start", "start-on-caller"])
def test_no_direct_child_outlives_a_supervisor_that_stops_while_they_start(on_caller):
    """Starts race the supervisor's termination: each one is either refused or stopped with it."""
    journal = Journal()
    cls = _StartsOnCaller if on_caller else Worker
    system = _system()
    started: list = []
    refused = 0
    go = threading.Event()

    def starter() -> None:
        nonlocal refused
        go.wait(5)
        for n in range(400):
            try:
                spec = ChildSpec(f"r{n}", lambda n=n: cls(f"r{n}", journal), restart=Restart.TEMPORARY,
                                 direct_start=True)
                started.append(system.spawn(spec, under=POOL, timeout=5))
            except CastorError:
                refused += 1
    try:
        thread = threading.Thread(target=starter)
        thread.start()
        go.set()
        assert poll_until(lambda: len(started) >= 20, timeout=10)
        system.stop_child(POOL, timeout=20)  # stops the pool with every child it has
        thread.join(20)
        assert not thread.is_alive()
        assert started, "the race was not exercised"
        alive = [h.path for h in started if h.alive or not h.closed.is_set()]
        assert alive == []
        assert refused > 0 or len(started) == 400
    finally:
        system.shutdown(10)


class _GatedStart(Worker):
    """on_start waits for a gate (so a test can see whether spawn waited for it)."""

    def __init__(self, name: str, journal: Journal, gate: threading.Event) -> None:
        super().__init__(name, journal)
        self.gate = gate

    def on_start(self) -> None:
        self.gate.wait(10)
        super().on_start()


def test_await_start_false_returns_before_on_start_and_the_child_then_runs():
    journal = Journal()
    gate = threading.Event()
    system = _system()
    try:
        spec = ChildSpec("g", lambda: _GatedStart("g", journal, gate), restart=Restart.TEMPORARY,
                         direct_start=True, await_start=False)
        handle = system.spawn(spec, under=POOL, timeout=5)
        assert journal.count("start", "g") == 0  # spawn did not wait for on_start
        pending = handle.ask_pending(Ping(n=3), timeout=10)  # queued behind on_start
        gate.set()
        assert pending.result() == ("g", 1, 3)
        assert journal.count("start", "g") == 1
    finally:
        gate.set()
        system.shutdown(10)
    with pytest.raises(ValueError):
        ChildSpec("x", worker("x", journal), restart=Restart.TEMPORARY, await_start=False)


class _EndsAtStart(Worker):
    """Asks to stop (or retire) from on_start, before any message arrives."""

    def __init__(self, name: str, journal: Journal, how: str) -> None:
        super().__init__(name, journal)
        self.how = how

    def on_start(self) -> None:
        super().on_start()
        if self.how == "stop":
            self.stop_self()
        else:
            self.retire("nothing to do")


@pytest.mark.parametrize("how,cause", [("stop", "stopped"), ("retire", "retired")])
def test_a_stop_or_retire_asked_for_in_on_start_ends_the_incarnation_without_a_message(how, cause):
    journal = Journal()
    system = _system()
    try:
        spec = ChildSpec("s", lambda: _EndsAtStart("s", journal, how), restart=Restart.TEMPORARY, direct_start=True)
        handle = system.spawn(spec, under=POOL, timeout=5)
        assert handle.wait_exited(5)  # no message was ever sent to it
        assert journal.wait_for(lambda e: ("end", "s", 1, cause) in e)
        assert handle.processed == 0
    finally:
        system.shutdown(10)


def test_wait_gone_answers_once_the_supervisor_removed_the_child_or_restarted_it():
    # wait_exited is the incarnation's end; the ChildExited that removes (or restarts) a direct
    # transient child is handled later, on the supervisor's thread -- held back here for 0.3 s.
    journal = Journal()
    system = _system()
    try:
        pool = system.lookup(POOL)
        spec = ChildSpec("t", worker("t", journal), restart=Restart.TRANSIENT, direct_start=True)
        handle = system.spawn(spec, under=POOL, timeout=5)
        faults.delay_next(pool, 0.3, ChildExited.type_name)
        handle.kill("test")  # a crash: restarted once the supervisor handles its exit
        assert handle.wait_exited(5)
        assert handle.wait_gone(5) is False and handle.alive  # running again, not removed
        faults.delay_next(pool, 0.3, ChildExited.type_name)
        handle.tell(Quit())  # a normal exit: removed, not restarted
        assert handle.wait_exited(5) and not handle.closed.is_set()
        with pytest.raises(Conflict):  # the id is still taken until the supervisor removes it
            system.spawn(ChildSpec("t", worker("t", journal), restart=Restart.TRANSIENT, direct_start=True),
                         under=POOL, timeout=5)
        assert handle.wait_gone(5) is True
        again = system.spawn(ChildSpec("t", worker("t", journal), restart=Restart.TRANSIENT, direct_start=True),
                             under=POOL, timeout=5)
        assert again.ask(Ping(n=1), timeout=5) == ("t", 1, 1)
    finally:
        system.shutdown(10)

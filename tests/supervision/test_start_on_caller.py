"""``Actor.start_on_caller``: ``on_start`` runs on the thread that starts the incarnation.

What must hold (actor.py, docs/supervision.md): ``spawn`` returns once ``on_start`` has run on the
caller's thread, in a fresh ``contextvars.Context``; an incarnation still running afterwards gets
its loop on a loop thread (messages never run on the caller); one that ends in ``on_start``
(stop, retire, crash) ends there too and never takes a loop thread; a crash is a crash (a
temporary child is removed, a transient one restarted by its supervisor, on the supervisor's
thread), and so is no thread for its loop. (No child outlives a supervisor that terminates while
such children start: test_direct_start.py's race, run for both kinds of start.)
"""

from __future__ import annotations

import contextvars
import threading

import pytest

from castor.supervision import ActorSystem, ChildSpec, Restart, supervisor_spec
from castor.supervision import actor as actor_module
from castor.supervision.supervisor import WhichChildren

from .helpers import Journal, Ping, Worker, poll_until

pytestmark = pytest.mark.timeout(30)

POOL = "/root/pool"
_probe: contextvars.ContextVar[str] = contextvars.ContextVar("probe", default="fresh")


class _CallerStart(Worker):
    """Records the thread (and the context) its on_start and its messages run on."""

    start_on_caller = True

    def __init__(self, name: str, journal: Journal, how: str = "run") -> None:
        super().__init__(name, journal)
        self.how = how

    def on_start(self) -> None:
        self.journal.add("start-thread", self.name, self.incarnation, threading.get_ident(), _probe.get())
        _probe.set("set by on_start")  # must not leak into the caller's context
        super().on_start()
        if self.how == "stop":
            self.stop_self()
        elif self.how == "retire":
            self.retire("nothing to do")
        elif self.how == "crash" or (self.how == "crash-first" and self.incarnation == 1):
            raise RuntimeError("cannot start")

    def on_terminate(self, cause: str) -> None:
        self.journal.add("end-thread", self.name, self.incarnation, threading.get_ident())
        super().on_terminate(cause)

    def ping(self, message: Ping) -> tuple[str, int, int]:
        self.journal.add("ping-thread", self.name, threading.get_ident())
        return super().ping(message)


def _system() -> ActorSystem:
    return ActorSystem([supervisor_spec("pool", [], max_restarts=100, within_seconds=10)])


def _spec(name: str, journal: Journal, how: str = "run", **kw) -> ChildSpec:
    kw.setdefault("restart", Restart.TEMPORARY)
    return ChildSpec(name, lambda: _CallerStart(name, journal, how), direct_start=True, **kw)


def _entries(journal: Journal, kind: str) -> list[tuple]:
    with journal.lock:
        return [e for e in journal.entries if e[0] == kind]


@pytest.fixture
def loop_runs(monkeypatch):
    """Every loop of a ``_CallerStart`` handed to a loop thread."""
    names: list[str] = []
    real = actor_module.LOOP_THREADS.run

    def run(task, name):
        if name == "_CallerStart":
            names.append(name)
        return real(task, name)

    monkeypatch.setattr(actor_module.LOOP_THREADS, "run", run)
    return names


@pytest.mark.parametrize("await_start", [True, False])
def test_on_start_runs_on_the_caller_in_a_fresh_context_and_messages_on_a_loop_thread(await_start, loop_runs):
    journal = Journal()
    system = _system()
    try:
        _probe.set("the caller's")
        handle = system.spawn(_spec("c", journal, await_start=await_start), under=POOL, timeout=5)
        # on_start has run, here, before spawn returned (even with await_start=False).
        assert _entries(journal, "start-thread") == [("start-thread", "c", 1, threading.get_ident(), "fresh")]
        assert _probe.get() == "the caller's"
        assert loop_runs == ["_CallerStart"]  # still running after on_start: its loop got a thread
        assert handle.ask(Ping(n=1), timeout=5) == ("c", 1, 1)
        [(_, _, ping_thread)] = _entries(journal, "ping-thread")
        assert ping_thread != threading.get_ident()
    finally:
        system.shutdown(10)


@pytest.mark.parametrize("how,cause", [("stop", "stopped"), ("retire", "retired"), ("crash", "crashed")])
def test_an_incarnation_that_ends_in_on_start_ends_on_the_caller_without_a_loop_thread(how, cause, loop_runs):
    journal = Journal()
    removed: list[tuple[str, int]] = []
    system = _system()
    try:
        spec = _spec("e", journal, how, on_removed=lambda reason: removed.append((reason, threading.get_ident())))
        handle = system.spawn(spec, under=POOL, timeout=5)
        me = threading.get_ident()
        # Ended, bookkept and removed before spawn returned, all on this thread.
        assert handle.wait_exited(0)
        assert handle.closed.is_set()
        assert ("end", "e", 1, cause) in journal.entries
        assert _entries(journal, "end-thread") == [("end-thread", "e", 1, me)]
        assert removed == [(f"exited ({cause}), restart=temporary", me)]
        assert loop_runs == []
        assert handle.processed == 0
        assert system.find(handle.path) is None
        if how == "crash":
            assert isinstance(handle.last_error, RuntimeError)
        assert system.lookup(POOL).ask(WhichChildren(), timeout=5) == []
    finally:
        system.shutdown(10)


def test_a_transient_child_that_crashes_in_on_start_is_restarted_by_its_supervisor(loop_runs):
    journal = Journal()
    system = _system()
    try:
        handle = system.spawn(_spec("t", journal, "crash-first", restart=Restart.TRANSIENT), under=POOL, timeout=5)
        assert poll_until(lambda: handle.incarnation == 2 and handle.alive, timeout=5)
        assert handle.ask(Ping(n=2), timeout=5) == ("t", 2, 2)
        starts = _entries(journal, "start-thread")
        assert [s[2] for s in starts] == [1, 2]
        assert starts[0][3] == threading.get_ident()
        assert starts[1][3] != threading.get_ident()  # the restart: on the supervisor's thread
    finally:
        system.shutdown(10)


def test_no_thread_for_the_loop_after_on_start_is_a_crash_of_that_incarnation(monkeypatch):
    journal = Journal()
    removed: list[str] = []
    real = actor_module.LOOP_THREADS.run

    def run(task, name):
        if name == "_CallerStart":
            raise RuntimeError("can't start new thread")
        return real(task, name)

    monkeypatch.setattr(actor_module.LOOP_THREADS, "run", run)
    system = _system()
    try:
        handle = system.spawn(_spec("n", journal, on_removed=removed.append), under=POOL, timeout=5)
        assert handle.wait_exited(0) and handle.closed.is_set()
        assert ("end", "n", 1, "crashed") in journal.entries  # on_terminate ran: nothing it held leaks
        assert isinstance(handle.last_error, RuntimeError)
        assert removed == ["exited (crashed), restart=temporary"]
        assert system.lookup(POOL).ask(WhichChildren(), timeout=5) == []
    finally:
        system.shutdown(10)

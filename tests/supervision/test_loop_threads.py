"""The park of actor-loop threads: reuse, fresh context, no kept references, bounds."""

from __future__ import annotations

import contextvars
import gc
import threading
import weakref

from castor.supervision import Actor, ActorSystem, ChildSpec, Restart, handles
from castor.supervision.threads import LOOP_THREADS, LoopThreads
from tests.supervision.helpers import Journal, Ping, poll_until, worker

_VAR: contextvars.ContextVar[str] = contextvars.ContextVar("test_loop_threads_var")


def run_and_wait(park: LoopThreads, task, name: str = "t") -> threading.Thread:
    """Run ``task`` on the park; return the thread it ran on once it has finished."""
    done = threading.Event()
    ran_on: list[threading.Thread] = []

    def wrapped() -> None:
        ran_on.append(threading.current_thread())
        task()
        done.set()

    park.run(wrapped, name)
    assert done.wait(5)
    return ran_on[0]


def test_a_finished_thread_runs_the_next_task():
    park = LoopThreads()
    first = run_and_wait(park, lambda: None)
    assert poll_until(lambda: park.parked == 1)
    second = run_and_wait(park, lambda: None)
    assert first is second and first.daemon
    assert second.name.startswith("t-")


def test_each_task_starts_with_an_empty_context():
    park = LoopThreads()
    seen: list[str | None] = []
    run_and_wait(park, lambda: _VAR.set("left behind"))
    assert poll_until(lambda: park.parked == 1)
    run_and_wait(park, lambda: seen.append(_VAR.get(None)))
    assert seen == [None]


def test_a_parked_thread_keeps_no_reference_to_its_last_task():
    park = LoopThreads()

    class Payload:
        def run(self) -> None:
            raise RuntimeError("a loop that raises still releases its actor")

    payload = Payload()
    alive = weakref.ref(payload)
    park.run(payload.run, "t")
    del payload
    assert poll_until(lambda: park.parked == 1)
    gc.collect()
    assert alive() is None


def test_the_park_is_bounded_and_idle_threads_end():
    park = LoopThreads(max_parked=2, idle_seconds=0.2)
    release = threading.Event()
    started = threading.Semaphore(0)

    def hold() -> None:
        started.release()
        release.wait(5)

    for _ in range(4):
        park.run(hold, "t")
    for _ in range(4):
        assert started.acquire(timeout=5)
    release.set()
    assert poll_until(lambda: park.parked == 2)
    assert poll_until(lambda: park.parked == 0, timeout=5)  # unclaimed past idle_seconds: ended


def test_racing_claims_and_idle_timeouts_lose_no_task():
    park = LoopThreads(max_parked=4, idle_seconds=0.001)  # timeouts race every claim
    ran = threading.Semaphore(0)
    for _ in range(300):
        park.run(ran.release, "t")
    for _ in range(300):
        assert ran.acquire(timeout=5)


def test_stopped_temporary_children_park_their_threads_and_are_collected():
    journal = Journal()
    with ActorSystem() as system:
        refs = []
        for i in range(20):
            handle = system.spawn(ChildSpec(f"r{i}", worker("r", journal), restart=Restart.TEMPORARY))
            assert handle.ask(Ping(n=i), timeout=5) == ("r", 1, i)
            refs.append(weakref.ref(handle.actor))
            system.stop_child(handle.path)
            assert handle.closed.is_set()
        assert journal.count("ping") == 20
        assert LOOP_THREADS.parked >= 1
        assert poll_until(lambda: gc.collect() >= 0 and all(r() is None for r in refs))


class _SlowStart(Actor):
    def __init__(self, entered: threading.Event, gate: threading.Event) -> None:
        super().__init__()
        self.entered = entered
        self.gate = gate

    def on_start(self) -> None:
        self.entered.set()
        self.gate.wait(5)

    @handles(Ping)
    def ping(self, message: Ping) -> int:
        return message.n


class _NoStart(Actor):
    @handles(Ping)
    def ping(self, message: Ping) -> int:
        return message.n


def test_spawn_still_waits_for_an_overridden_on_start():
    entered, gate, returned = threading.Event(), threading.Event(), threading.Event()
    with ActorSystem() as system:
        spec = ChildSpec("slow", lambda: _SlowStart(entered, gate), restart=Restart.TEMPORARY)
        spawner = threading.Thread(target=lambda: (system.spawn(spec), returned.set()), daemon=True)
        spawner.start()
        assert entered.wait(5)
        assert not returned.wait(0.2)  # on_start is still running: the spawn must not have returned
        gate.set()
        assert returned.wait(5)
        spawner.join(5)


def test_a_child_without_on_start_is_not_waited_for_and_still_answers():
    with ActorSystem() as system:
        handle = system.spawn(ChildSpec("plain", _NoStart, restart=Restart.TEMPORARY))
        assert handle.actor is not None and handle.actor.start_latch is None
        assert handle.ask(Ping(n=7), timeout=5) == 7

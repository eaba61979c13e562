"""Nothing is kept per finished cast: the per-path locks of the state store and the artifact
writer live as long as a writer of that path does, not as long as the process."""

from __future__ import annotations

import gc
import threading

import pytest

from castor.actors.materia.api import materia_call
from castor.adapters.materia import artifacts, state_store
from castor.adapters.materia.artifacts import CastArtifacts
from castor.adapters.materia.state_store import CastStateStore
from tests.actors.materia.helpers import make_runtime, open_session, wait_status
from tests.support.waiting import wait_for


def _ours(table, root) -> int:
    gc.collect()
    return sum(1 for key in list(table.keys()) if key.startswith(str(root)))


def test_locks_are_shared_while_held_and_gone_when_released(tmp_path):
    store_a, store_b = CastStateStore(tmp_path), CastStateStore(tmp_path)
    store_a.save("c1", {"n": 1}, incarnation=1)
    store_b.save("c1", {"n": 2}, incarnation=1)
    lock_a, lock_b = store_a._locks["c1"][0], store_b._locks["c1"][0]
    assert lock_a is lock_b  # two stores of one cast in one process: one lock
    arts_a, arts_b = CastArtifacts(tmp_path, "c1"), CastArtifacts(tmp_path, "c1")
    assert arts_a._lock is arts_b._lock
    assert _ours(state_store._THREAD_LOCKS, tmp_path) == 1 and _ours(artifacts._LOCKS, tmp_path) == 1
    del store_a, store_b, lock_a, lock_b, arts_a, arts_b
    assert _ours(state_store._THREAD_LOCKS, tmp_path) == 0 and _ours(artifacts._LOCKS, tmp_path) == 0


def test_concurrent_writers_still_serialise_on_one_lock(tmp_path):
    """Appends from many threads through many objects of one cast never interleave."""
    CastArtifacts(tmp_path, "c1").create()
    barrier = threading.Barrier(8)

    def writer(n: int) -> None:
        arts = CastArtifacts(tmp_path, "c1")  # each thread its own object: the lock is shared
        barrier.wait(10)
        for i in range(50):
            arts.append_event("tick", {"writer": n, "i": i, "pad": "x" * 512})

    threads = [threading.Thread(target=writer, args=(n,)) for n in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    log = CastArtifacts(tmp_path, "c1").read_events()
    assert len(log.events) == 400 and log.skipped == []


@pytest.mark.timeout(120)
def test_running_many_casts_leaves_no_lock_behind(tmp_path):
    project = tmp_path / "project"
    project.mkdir()
    rt = make_runtime(max_casts_per_session=4)
    try:
        open_session(rt, "s1", project, ["answer"] * 200)

        def run(n: int) -> None:
            # At most the session's limit at once: a start is answered once its first save is
            # durable, before its cast has run a step, so a fifth start in a row finds four active.
            for first in range(0, n, 4):
                ids = [materia_call(rt, "s1", "start", {"request": f"cast {i}", "loadout": "hello"})["cast_id"]
                       for i in range(first, min(n, first + 4))]
                for cast_id in ids:
                    assert wait_status(rt, "s1", cast_id)["status"] == "complete"
                for cast_id in ids:  # the actors have stopped (a cast ends, then its actor exits)
                    handle = rt.system.registry.find(f"/root/session/s1/cast/{cast_id}")
                    if handle is not None:
                        handle.wait_exited(10)

        run(5)
        root = project / ".pi"
        after_warmup = (_ours(state_store._THREAD_LOCKS, root), _ours(artifacts._LOCKS, root))
        run(30)
        # Every cast has ended: no writer is left once the last actor thread has let go of its
        # store (a finished cast's actor may still be unwinding when its handle is gone: the
        # count must reach 0 within the deadline, and stay there -- a lock kept per cast never does).
        wait_for(lambda: (_ours(state_store._THREAD_LOCKS, root), _ours(artifacts._LOCKS, root)) == (0, 0),
                 10, f"every per-path lock released (after the warm-up: {after_warmup})")
    finally:
        rt.shutdown(10.0)

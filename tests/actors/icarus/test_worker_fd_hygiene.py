"""A worker's pipes are closed when it ends -- killed, crashed, timed out or retired -- not when
the garbage collector or a reference count gets to it: 200 workers end and stay referenced (gc
disabled) and the test process's open descriptor count is where it started. Real worker subprocesses on the reference
backend."""

from __future__ import annotations

import gc
import time

import psutil
import pytest

from castor.actors.icarus.worker import IcarusWorkerClient, icarus_worker_spec
from castor.adapters.icarus.worker_process import WorkerProcess, next_request_id, worker_factory
from castor.logs import configure_logging
from castor.messages.errors import Timeout, WorkerCrashed, WorkerRetired
from castor.supervision import ActorSystem

ROUNDS = 200


def _fds() -> int:
    return psutil.Process().num_fds()


def _end_one(worker: WorkerProcess, how: str) -> None:
    """Start ``worker`` with one call, then end it the way ``how`` says."""
    assert worker.call(next_request_id(), "hooks", "identity", [1], {}, time.monotonic() + 30)["result"] == 1
    if how == "kill":
        worker.kill_tree("test kill")
    elif how == "crash":
        with pytest.raises(WorkerCrashed):
            worker.call(next_request_id(), "hooks", "crash", [3], {}, time.monotonic() + 30)
    elif how == "timeout":
        with pytest.raises(Timeout):
            worker.call(next_request_id(), "hooks", "sleep", [], {"seconds": 30}, time.monotonic() + 0.05)
    elif how == "close":
        worker.close()
    # A later call on the finished worker writes nothing and opens nothing.
    with pytest.raises((WorkerRetired, WorkerCrashed)):
        worker.call(next_request_id(), "hooks", "identity", [2], {}, time.monotonic() + 30)


@pytest.mark.timeout(240)
def test_two_hundred_ended_workers_leave_no_descriptor_behind(harness):
    launch = harness.launch()
    gc.collect()
    gc.disable()
    try:
        _end_one(harness.worker(launch), "kill")  # warm: the first spawn imports and opens what it keeps
        before = _fds()
        hows = ("kill", "crash", "timeout", "close")
        # Every ended worker stays referenced (as an inspector, a log record or a cycle could keep
        # it): its descriptors must be closed by its ending, not by its deallocation.
        ended = []
        for i in range(ROUNDS):
            worker = WorkerProcess(launch)
            _end_one(worker, hows[i % len(hows)])
            ended.append(worker)
        after = _fds()
        assert after <= before, f"open fds grew from {before} to {after} over {ROUNDS} ended workers"
        # A never-started worker holds no descriptor either.
        unused = [WorkerProcess(launch) for _ in range(50)]
        assert _fds() == after
        for worker in unused:
            worker.kill_tree("never used")
    finally:
        gc.enable()


@pytest.mark.timeout(240)
def test_actor_retirements_leave_no_descriptor_behind(harness):
    """The same through the actor: each call times out, the actor retires (killing the worker) and
    the next call gets a fresh incarnation and worker."""
    configure_logging("ERROR")  # every retirement logs a warning by design
    system = ActorSystem([icarus_worker_spec("fd-worker", worker_factory(harness.launch()), next_request_id)])
    client = IcarusWorkerClient(system.lookup("/root/fd-worker"))
    gc.collect()
    gc.disable()
    try:
        assert client.call("hooks", "identity", [0]) == 0
        with pytest.raises(Timeout):
            client.call("hooks", "sleep", kwargs={"seconds": 30}, timeout=0.05)
        before = _fds()
        for i in range(ROUNDS // 4):
            assert client.call("hooks", "identity", [i]) == i
            with pytest.raises(Timeout):
                client.call("hooks", "sleep", kwargs={"seconds": 30}, timeout=0.05)
        after = _fds()
    finally:
        gc.enable()
        client.close()
        system.shutdown(10)
    assert after <= before, f"open fds grew from {before} to {after} over {ROUNDS // 4} retirements"

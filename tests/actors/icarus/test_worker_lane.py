"""WorkerLane with a helping caller: one job at a time, in order, whichever thread runs it."""

from __future__ import annotations

import threading
import time
from concurrent.futures import Future

import pytest

from castor.actors.icarus.hook_controller import WorkerLane
from castor.domain.icarus import lifecycle as lc
from castor.messages.errors import Timeout
from tests.support.icarus_fakes import FakeWorker

pytestmark = pytest.mark.timeout(30)


class Recorder:
    """The lane's feedback: every WorkerDone, with the thread that delivered it."""

    def __init__(self) -> None:
        self.done: list[tuple[lc.WorkerDone, str]] = []
        self.cond = threading.Condition()

    def __call__(self, done: lc.WorkerDone) -> None:
        with self.cond:
            self.done.append((done, threading.current_thread().name))
            self.cond.notify_all()

    def wait(self, n: int, timeout: float = 5.0) -> list[tuple[lc.WorkerDone, str]]:
        with self.cond:
            assert self.cond.wait_for(lambda: len(self.done) >= n, timeout), self.done
            return list(self.done)


def _lane(worker: FakeWorker, recorder: Recorder) -> WorkerLane:
    return WorkerLane(worker, 5.0, recorder, owner="/test/lane")


def test_a_helper_runs_its_own_job_on_its_own_thread_and_the_lane_thread_never_starts():
    worker, recorder = FakeWorker({"pre_llm_call": {"context": "c"}}), Recorder()
    lane = WorkerLane(worker, 5.0, lambda done: (recorder(done), fut.set_result(done)), owner="/test/lane")
    fut: Future = Future()
    lane.submit("r1", "pre_llm_call", {}, wake=False)
    lane.help_until(fut, time.monotonic() + 5)
    assert fut.result(0).ok and recorder.done[0][1] == threading.current_thread().name
    assert lane._thread is None
    lane.stop()


def test_jobs_left_when_the_helper_is_answered_go_to_the_lane_thread():
    worker, recorder = FakeWorker(), Recorder()
    lane = _lane(worker, recorder)
    done: Future = Future()
    done.set_result(None)  # answered at once (a capture the harness does not wait for)
    lane.submit("capture", "post_llm_call", {}, wake=False)
    lane.help_until(done, time.monotonic() + 5)
    ((result, thread),) = recorder.wait(1)
    assert result.request == "capture" and thread == "icarus-hook-lane"
    lane.stop()


def test_a_helper_never_runs_a_job_while_the_lane_thread_runs_one_and_order_holds():
    worker, recorder = FakeWorker(), Recorder()
    gate = worker.gates["on_session_start"] = threading.Event()
    lane = _lane(worker, recorder)
    lane.submit("start", "on_session_start", {})  # the lane thread takes it and blocks in it
    assert worker.wait_calls(1)
    lane.submit("prompt", "pre_llm_call", {}, wake=False)
    never: Future = Future()
    lane.help_until(never, time.monotonic() + 5)  # returns at once: a job is running elsewhere
    assert worker.functions() == ["on_session_start"]
    gate.set()
    results = recorder.wait(2)
    assert [r.request for r, _ in results] == ["start", "prompt"]
    assert worker.functions() == ["on_session_start", "pre_llm_call"]
    lane.stop()


def test_a_fatal_error_in_a_helped_job_fails_the_queued_calls_unsent():
    worker, recorder = FakeWorker({"pre_llm_call": Timeout("worker timed out", may_have_started=True)}), Recorder()
    fut: Future = Future()

    def feedback(done: lc.WorkerDone) -> None:
        recorder(done)
        if done.request == "prompt":
            fut.set_result(done)

    lane = WorkerLane(worker, 5.0, feedback, owner="/test/lane")
    lane.submit("prompt", "pre_llm_call", {}, wake=False)
    lane.submit("capture", "post_llm_call", {}, wake=False)
    lane.help_until(fut, time.monotonic() + 5)
    results = recorder.wait(2)
    assert sorted((r.request, r.ok, r.error_code) for r, _ in results) == [
        ("capture", False, "worker_retired"), ("prompt", False, "timeout")]
    assert worker.functions() == ["pre_llm_call"]  # post_llm_call was never sent
    assert all(thread == threading.current_thread().name for _, thread in results)
    lane.stop()


def test_a_stopped_lane_gives_a_helper_nothing_to_run():
    worker, recorder = FakeWorker(), Recorder()
    lane = _lane(worker, recorder)
    lane.submit("prompt", "pre_llm_call", {}, wake=False)
    lane.stop()  # fails the queued call, unsent
    never: Future = Future()
    lane.help_until(never, time.monotonic() + 5)
    assert worker.functions() == []
    assert [(r.request, r.error_code) for r, _ in recorder.wait(1)] == [("prompt", "actor_stopped")]

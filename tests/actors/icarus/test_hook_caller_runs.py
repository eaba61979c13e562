"""A blocking hook caller makes its own worker call: the races that creates.

``HookClient.event`` offers to make the event's worker call on its own thread; an idle
HookController hands it over when its worker lane is free and empty (``WorkerLane.claim``), and the
call's outcome goes back to the controller as the lane's would. These tests hold the worker call
open (a gated fake worker) and check that the controller stays responsive, that the lane's order
and failure policy are the same, and that nothing is left in flight or waiting. Synchronisation is
by events and deadlines only.
"""

from __future__ import annotations

import itertools
import threading
from concurrent.futures import Future
from typing import Any

import pytest

from castor.actors.icarus.hook_controller import HookClient, HookController
from castor.actors.icarus.messages import CallerRun
from castor.domain.icarus.lifecycle import HookConfig
from castor.messages.errors import Timeout
from castor.supervision import ActorSystem, ChildSpec
from tests.support.icarus_fakes import SAMPLE, FakeUi, FakeWorker

pytestmark = pytest.mark.timeout(60)

_ids = itertools.count(1)
INJECTED = {"message": {"customType": "icarus-memory-context", "content": SAMPLE, "display": True}}


class ThreadWorker(FakeWorker):
    """A FakeWorker that also records which thread made each call."""

    def __init__(self, results: dict[str, Any] | None = None) -> None:
        super().__init__(results)
        self.threads: list[int] = []

    def call(self, module, function, args=None, kwargs=None, timeout=None):
        self.threads.append(threading.get_ident())
        return super().call(module, function, args, kwargs, timeout)


@pytest.fixture
def system():
    s = ActorSystem()
    yield s
    s.shutdown(10)


def rig(system: ActorSystem, worker: FakeWorker) -> tuple[HookClient, Any, FakeUi]:
    ui = FakeUi()
    n = next(_ids)
    handle = system.spawn(ChildSpec(id=f"hooks{n}", factory=lambda: HookController(
        HookConfig(filtering=False), worker=worker, ui=ui, worker_timeout=10.0)))
    client = HookClient(handle, default_timeout=20)
    assert client.event("session_start", {"session_id": "S1"}) is None
    return client, handle, ui


def in_thread(fn, *args: Any, **kwargs: Any) -> Future[Any]:
    """Run ``fn`` on a thread of its own; the future gets its result."""
    fut: Future[Any] = Future()

    def run() -> None:
        try:
            fut.set_result(fn(*args, **kwargs))
        except BaseException as exc:  # noqa: BLE001 - handed to the test through the future
            fut.set_exception(exc)

    threading.Thread(target=run, daemon=True).start()
    return fut


def test_an_idle_controller_lets_the_asking_thread_make_the_call(system):
    worker = ThreadWorker({"pre_llm_call": {"context": SAMPLE}})
    client, _, _ = rig(system, worker)
    me = threading.get_ident()
    assert client.event("before_agent_start", {"prompt": "q"}) == INJECTED
    assert worker.functions() == ["on_session_start", "pre_llm_call"]
    assert worker.threads == [me, me]  # no lane thread, no controller thread in between
    assert client.status().in_flight == 0


def test_icarus_off_while_the_asker_is_in_the_worker_call(system):
    worker = ThreadWorker({"pre_llm_call": {"context": SAMPLE}})
    gate = worker.gates["pre_llm_call"] = threading.Event()
    client, _, ui = rig(system, worker)
    hook = in_thread(client.event, "before_agent_start", {"prompt": "q"})
    assert worker.wait_calls(2)
    # The controller is not waiting for the worker: the command and a status answer at once.
    assert client.set_enabled(False, timeout=2) is False
    assert client.status(timeout=2).in_flight == 0  # answered (None) at invalidation
    assert not hook.done()  # the asking thread is still in the worker call
    gate.set()
    assert hook.result(5) is None  # the late context is not injected
    assert ui.status[-1] == ("icarus", None)
    assert client.set_enabled(True, timeout=2) is True
    gate.clear()
    worker.gates.pop("pre_llm_call")
    assert client.event("before_agent_start", {"prompt": "again"}) == INJECTED


def test_an_abort_while_the_asker_is_in_the_worker_call(system):
    worker = ThreadWorker({"pre_llm_call": {"context": SAMPLE}})
    gate = worker.gates["pre_llm_call"] = threading.Event()
    client, _, _ = rig(system, worker)
    hook = in_thread(client.event, "before_agent_start", {"prompt": "q"}, request="turn-1")
    assert worker.wait_calls(2)
    client.abort("turn-1")
    assert client.status(timeout=2).in_flight == 0  # the abort was handled mid-call
    gate.set()
    assert hook.result(5) is None
    assert client.status().in_flight == 0


def test_two_hooks_at_once_keep_the_lane_order(system):
    worker = ThreadWorker({"pre_llm_call": {"context": SAMPLE}, "post_llm_call": None})
    gate = worker.gates["pre_llm_call"] = threading.Event()
    client, _, _ = rig(system, worker)
    first = in_thread(client.event, "before_agent_start", {"prompt": "q"})
    assert worker.wait_calls(2)
    first_thread = worker.threads[1]
    # A second hook while the first call is being made: it queues on the lane behind it.
    second = in_thread(client.event, "agent_settled", {"messages": [
        {"role": "user", "content": "q"},
        {"role": "assistant", "content": "a", "stopReason": "stop"}]})
    assert not worker.wait_calls(3, timeout=0.3)  # not sent while the first call runs
    assert not second.done()
    gate.set()
    assert first.result(5) == INJECTED
    assert second.result(5) is None
    assert worker.functions() == ["on_session_start", "pre_llm_call", "post_llm_call"]
    assert worker.threads[2] != first_thread  # the lane thread made the queued call
    assert client.status().in_flight == 0


def test_a_fatal_outcome_on_the_askers_call_fails_the_queued_calls_unsent(system):
    worker = ThreadWorker({"pre_llm_call": Timeout("fake timeout", may_have_started=True), "post_llm_call": None})
    gate = worker.gates["pre_llm_call"] = threading.Event()
    client, _, _ = rig(system, worker)
    first = in_thread(client.event, "before_agent_start", {"prompt": "q"})
    assert worker.wait_calls(2)
    second = in_thread(client.event, "agent_settled", {"messages": [
        {"role": "user", "content": "q"},
        {"role": "assistant", "content": "a", "stopReason": "stop"}]})
    assert not worker.wait_calls(3, timeout=0.3)
    gate.set()
    assert first.result(5) is None and second.result(5) is None
    assert worker.functions() == ["on_session_start", "pre_llm_call"]  # post_llm_call never sent
    assert client.status().in_flight == 0


def test_the_session_closing_mid_call_ends_and_closes_after_the_call(system):
    worker = ThreadWorker({"pre_llm_call": {"context": SAMPLE}})
    gate = worker.gates["pre_llm_call"] = threading.Event()
    client, _, ui = rig(system, worker)
    hook = in_thread(client.event, "before_agent_start", {"prompt": "q"})
    assert worker.wait_calls(2)
    shutdown = in_thread(client.event, "session_shutdown")
    assert client.status(timeout=2).in_flight == 1  # only the shutdown: the prompt was invalidated
    assert not worker.wait_calls(3, timeout=0.3)  # on_session_end waits for the call in progress
    assert worker.closed == 0
    gate.set()
    assert hook.result(5) is None
    assert shutdown.result(5) is None
    assert worker.functions() == ["on_session_start", "pre_llm_call", "on_session_end"]
    assert worker.closed == 1 and ui.status[-1] == ("icarus", None)


def test_the_controller_stopping_mid_call_answers_and_ignores_the_late_outcome(system):
    worker = ThreadWorker({"pre_llm_call": {"context": SAMPLE}})
    gate = worker.gates["pre_llm_call"] = threading.Event()
    client, handle, _ = rig(system, worker)
    hook = in_thread(client.event, "before_agent_start", {"prompt": "q"})
    assert worker.wait_calls(2)
    handle.kill("test")  # a crash of the session's controller while the asker is in the call
    assert client.status(timeout=5).in_flight == 0  # the restarted incarnation answers at once
    gate.set()
    assert hook.result(5) is None  # answered on the old incarnation's exit; late context ignored
    assert client.status(timeout=5).in_flight == 0
    assert client.event("before_agent_start", {"prompt": "again"}) == INJECTED


def test_a_call_offered_after_the_asker_stopped_waiting_is_refused():
    slot = CallerRun("r1")
    assert slot.take() is None
    assert slot.offer(lambda: None) is False  # the controller then queues it on the lane


def test_an_offered_call_is_taken_exactly_once():
    slot = CallerRun("r1")
    ran: list[int] = []
    assert slot.offer(lambda: ran.append(1)) is True
    assert slot.offer(lambda: ran.append(2)) is False
    call = slot.take()
    assert call is not None
    call()
    assert slot.take() is None and ran == [1]


def test_a_claimed_lane_holds_queued_items_until_the_claimed_call_is_reported():
    from castor.actors.icarus.hook_controller import WorkerLane

    worker = ThreadWorker({"a": 1, "b": 2})
    done: list[tuple[str, bool]] = []
    reported = threading.Condition()

    def feedback(event) -> None:
        with reported:
            done.append((event.request, event.ok))
            reported.notify_all()

    lane = WorkerLane(worker, 5.0, feedback)
    assert lane.claim() is True
    assert lane.claim() is False  # busy: a second claimant queues instead
    lane.submit("rb", "b", {})
    assert not worker.wait_calls(1, timeout=0.2)  # the lane thread waits for the claimed call
    lane.run_claimed("ra", "a", {}, feedback)
    with reported:
        assert reported.wait_for(lambda: len(done) == 2, 5)
    assert done == [("ra", True), ("rb", True)] and worker.functions() == ["a", "b"]
    assert lane.claim() is True  # free and empty again
    lane.submit_claimed("rc", "a", {})  # a claim given back: the lane thread makes the call
    with reported:
        assert reported.wait_for(lambda: len(done) == 3, 5)
    assert worker.threads[2] != threading.get_ident()
    lane.stop()
    assert lane.claim() is False

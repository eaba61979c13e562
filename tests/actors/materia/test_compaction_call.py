"""CompactionCall: one host compaction, answered exactly once, under a deadline, cancellable."""

from __future__ import annotations

import queue
import threading
from typing import Any

import pytest

from castor.actors.materia.compaction_call import CompactionCall
from castor.ports.host_context import CompactionOutcome, CompactionRequest, NoHostContext

pytestmark = pytest.mark.timeout(15)

REQUEST = CompactionRequest(cast_id="c1", instructions="keep the SECRET plan")


class ManualPort:
    """A port whose replies the test triggers by hand."""

    has_context = True

    def __init__(self, *, raises: Exception | None = None) -> None:
        self.replies: list[Any] = []
        self.called = threading.Event()
        self.raises = raises

    def context_usage(self, timeout_s: float) -> None:
        return None

    def compact(self, request: CompactionRequest, reply: Any, *, timeout_s: float) -> None:
        if self.raises is not None:
            raise self.raises
        self.replies.append(reply)
        self.called.set()


def _collect() -> tuple[queue.Queue[tuple[CompactionOutcome, str]], Any]:
    got: queue.Queue[tuple[CompactionOutcome, str]] = queue.Queue()
    return got, lambda outcome: got.put((outcome, threading.current_thread().name))


def test_the_port_reply_is_delivered_once_and_a_second_reply_is_dropped() -> None:
    port, (got, deliver) = ManualPort(), _collect()
    call = CompactionCall(port, REQUEST, timeout_s=10, deliver=deliver).start()
    assert port.called.wait(5)
    port.replies[0](CompactionOutcome.succeeded({"tokensBefore": 5, "summary": "x"}))
    port.replies[0](CompactionOutcome.failed("again"))
    outcome, _thread = got.get(timeout=5)
    assert outcome.ok and outcome.result == {"tokensBefore": 5} and call.done
    with pytest.raises(queue.Empty):
        got.get(timeout=0.2)


def test_the_deadline_fails_the_compaction_and_the_late_reply_is_dropped() -> None:
    port, (got, deliver) = ManualPort(), _collect()
    CompactionCall(port, REQUEST, timeout_s=0.2, deliver=deliver).start()
    outcome, _thread = got.get(timeout=5)
    assert not outcome.ok and outcome.error == "host compaction timed out after 0.2s"
    port.replies[0](CompactionOutcome.succeeded({}))
    with pytest.raises(queue.Empty):
        got.get(timeout=0.2)


def test_cancel_means_nothing_is_ever_delivered() -> None:
    port, (got, deliver) = ManualPort(), _collect()
    call = CompactionCall(port, REQUEST, timeout_s=0.2, deliver=deliver).start()
    call.cancel()
    port.replies[0](CompactionOutcome.succeeded({}))
    with pytest.raises(queue.Empty):
        got.get(timeout=0.5)  # past the deadline too


def test_a_port_that_raises_is_a_failed_outcome_off_the_callers_stack() -> None:
    port, (got, deliver) = ManualPort(raises=RuntimeError("boom")), _collect()
    CompactionCall(port, REQUEST, timeout_s=10, deliver=deliver).start()
    outcome, thread = got.get(timeout=5)
    assert not outcome.ok and "could not start the host compaction: boom" in outcome.error
    assert thread != threading.current_thread().name


def test_no_host_context_answers_ok_skipped_on_another_thread_and_never_reports_usage() -> None:
    port, (got, deliver) = NoHostContext(), _collect()
    assert port.has_context is False and port.context_usage(1.0) is None
    CompactionCall(port, REQUEST, timeout_s=10, deliver=deliver).start()
    outcome, thread = got.get(timeout=5)
    assert outcome.ok and outcome.result == {} and outcome.skipped == "no host context"
    assert thread != threading.current_thread().name
    assert "SECRET" not in repr(REQUEST)  # instructions never reach a log line through repr

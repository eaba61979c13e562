"""WorkerProcess reads a reply that is already there without polling first, and keeps every rule.

On one CPU the worker usually answers before the parent's ``write`` returns; the parent then
reads at once instead of asking ``poll`` first. These tests make that case certain -- ``write``,
as the module sees it, returns only once the reply is readable -- and check that the answer,
the stream-hygiene rules and a kill meanwhile come out exactly as on the polling path, and
that a call whose reply was not there makes the next calls poll first.
"""

from __future__ import annotations

import os
import select
import sys
import time

import pytest

import castor.adapters.icarus.worker_process as wp
from castor.adapters.icarus.launch import WorkerLaunch
from castor.adapters.icarus.worker_process import WorkerProcess, next_request_id, reply_result
from castor.messages.errors import WorkerRetired
from tests.adapters.icarus.test_worker_process import _FAKE
from tests.support.icarus import REFERENCE_ICARUS

pytestmark = pytest.mark.timeout(60)


def call(worker: WorkerProcess, function: str, *args, **kwargs):
    reply = worker.call(next_request_id(), "hooks", function, list(args), kwargs, time.monotonic() + 20)
    return reply_result(reply, f"hooks.{function}")


class _AnsweredBeforeWriteReturns:
    """The module's ``os``, except that a request's ``write`` returns once the reply is readable
    (what a preempted parent sees on one CPU); ``after_reply`` runs then, if set."""

    def __init__(self) -> None:
        self.worker: WorkerProcess | None = None
        self.after_reply = None

    def __getattr__(self, name: str):
        return getattr(os, name)

    def write(self, fd: int, data) -> int:
        written = os.write(fd, data)
        worker = self.worker
        if worker is not None and worker.started and fd == worker._in_fd:
            poller = select.poll()
            poller.register(worker._out_fd, select.POLLIN)
            assert poller.poll(10_000), "the worker never answered"
            if self.after_reply is not None:
                self.after_reply(worker)
        return written


class _CountingPoller:
    def __init__(self, inner) -> None:
        self.inner = inner
        self.polls = 0

    def poll(self, *args):
        self.polls += 1
        return self.inner.poll(*args)


@pytest.fixture
def answered_first(monkeypatch):
    fake_os = _AnsweredBeforeWriteReturns()
    monkeypatch.setattr(wp, "os", fake_os)
    return fake_os


def _started(harness, launch=None) -> tuple[WorkerProcess, _CountingPoller]:
    worker = harness.worker(launch)
    assert call(worker, "identity", 0) == 0  # spawn + import, on the ordinary path
    counting = _CountingPoller(worker._reply_poller)
    worker._reply_poller = counting
    worker._poll_first = 0
    return worker, counting


def _fake_worker(harness) -> WorkerProcess:
    launch = WorkerLaunch(argv=(sys.executable, "-u", "-c", _FAKE), cwd=str(harness.project),
                          env=dict(os.environ), icarus_dir=str(REFERENCE_ICARUS))
    return harness.worker(launch)


def test_a_reply_there_when_write_returns_is_read_without_a_poll(harness, answered_first):
    worker, counting = _started(harness)
    answered_first.worker = worker
    assert [call(worker, "identity", n) for n in range(20)] == list(range(20))
    assert counting.polls == 0
    assert worker._poll_first == 0


def test_garbage_and_stale_ids_read_first_are_counted_and_skipped(harness, answered_first):
    worker = _fake_worker(harness)
    assert call(worker, "warm") == "warm"
    answered_first.worker = worker
    worker._poll_first = 0
    assert call(worker, "wrong_id") == "wrong_id"  # a stale reply ahead of the real one: skipped
    assert call(worker, "garbage") == "garbage"  # a line that is not a reply ahead of it: dropped
    assert call(worker, "after") == "after"
    stats = worker.stats()
    assert stats.garbage_lines == 1 and stats.mismatched_replies == 1


def test_a_worker_killed_after_its_reply_arrived_fails_the_call_as_retired(harness, answered_first):
    worker, _counting = _started(harness)
    answered_first.worker = worker
    answered_first.after_reply = lambda w: w.kill_tree("killed by the test")
    with pytest.raises(WorkerRetired):
        call(worker, "identity", 1)


def test_a_reply_not_there_yet_makes_the_next_calls_poll_first(harness):
    worker, counting = _started(harness)
    assert call(worker, "sleep", 0.2)["slept"] is True  # nothing to read right after the write: a miss
    assert worker._poll_first == wp._READ_FIRST_BACKOFF
    before = counting.polls
    assert call(worker, "identity", 7) == 7
    assert counting.polls > before  # this call waited in poll first
    assert worker._poll_first == wp._READ_FIRST_BACKOFF - 1
    for n in range(wp._READ_FIRST_BACKOFF - 1):
        assert call(worker, "identity", n) == n
    assert worker._poll_first == 0  # the next call reads first again

"""The bounded, adaptive spin before a worker call's blocking wait (castor._spin).

Where the process may run on several CPUs, the parent polls the worker's stdout without blocking
for up to a few tens of microseconds before it sleeps; never on one CPU (where it would only keep
the worker it waits for from running), never when turned off, never longer than its bound, backing
off when it does not catch replies. What it catches, or what comes after it, is read exactly as a
blocking wait's: a reply after the spin, a worker that dies during it.
"""

from __future__ import annotations

import threading
import time

import pytest

import castor._spin as spin_module
from castor._spin import ReplySpin, reply_spin
from castor.adapters.icarus.worker_process import WorkerProcess, next_request_id, reply_result
from castor.messages.errors import WorkerCrashed, WorkerRetired

pytestmark = pytest.mark.timeout(60)


def call(worker: WorkerProcess, function: str, *args, **kwargs):
    reply = worker.call(next_request_id(), "hooks", function, list(args), kwargs, time.monotonic() + 20)
    return reply_result(reply, f"hooks.{function}")


@pytest.fixture
def several_cpus(monkeypatch):
    """Several CPUs, and the worker call's spin turned on (it is off unless asked for)."""
    monkeypatch.setattr(spin_module, "_multi_cpu", lambda: True)
    monkeypatch.setenv("CASTOR_REPLY_SPIN", "1")
    monkeypatch.delenv("CASTOR_REPLY_SPIN_US", raising=False)


def test_the_worker_call_spins_only_when_turned_on(monkeypatch, harness):
    monkeypatch.setattr(spin_module, "_multi_cpu", lambda: True)
    monkeypatch.delenv("CASTOR_REPLY_SPIN_US", raising=False)
    monkeypatch.delenv("CASTOR_REPLY_SPIN", raising=False)
    assert reply_spin(on_by_default=False) is None
    assert isinstance(reply_spin(), ReplySpin)  # a waiter on by default (the client's) still spins
    worker = harness.worker()
    assert worker._spin is None
    assert [call(worker, "identity", n) for n in range(5)] == list(range(5))
    for value in ("1", "on", "true", "yes"):
        monkeypatch.setenv("CASTOR_REPLY_SPIN", value)
        assert isinstance(reply_spin(on_by_default=False), ReplySpin)
    monkeypatch.setenv("CASTOR_REPLY_SPIN", "1")
    worker = harness.worker()
    assert worker._spin is not None
    assert [call(worker, "identity", n) for n in range(5)] == list(range(5))


def test_off_on_one_cpu(monkeypatch):
    monkeypatch.delenv("CASTOR_REPLY_SPIN", raising=False)
    monkeypatch.setattr(spin_module.os, "sched_getaffinity", lambda _pid: {0})
    assert reply_spin() is None
    monkeypatch.setattr(spin_module.os, "sched_getaffinity", lambda _pid: {0, 1})
    assert isinstance(reply_spin(), ReplySpin)


def test_off_when_turned_off(several_cpus, monkeypatch):
    monkeypatch.delenv("CASTOR_REPLY_SPIN")
    assert isinstance(reply_spin(), ReplySpin)
    for value in ("0", "off", "false", "no"):
        monkeypatch.setenv("CASTOR_REPLY_SPIN", value)
        assert reply_spin() is None
    monkeypatch.delenv("CASTOR_REPLY_SPIN")
    monkeypatch.setenv("CASTOR_REPLY_SPIN_US", "0")
    assert reply_spin() is None
    monkeypatch.setenv("CASTOR_REPLY_SPIN_US", "20")
    spin = reply_spin()
    assert spin is not None and spin.max_ns == 20_000


def test_a_worker_on_one_cpu_waits_without_spinning(harness, monkeypatch):
    monkeypatch.setattr(spin_module, "_multi_cpu", lambda: False)
    worker = harness.worker()
    assert worker._spin is None
    assert [call(worker, "identity", n) for n in range(5)] == list(range(5))


def test_a_spin_is_bounded_and_backs_off_when_it_catches_nothing():
    spin = ReplySpin(max_us=200)
    polls = 0

    def nothing(_timeout):
        nonlocal polls
        polls += 1
        return []

    for _ in range(3):
        assert spin.wanted()
        started = time.perf_counter()
        assert spin.poll(nothing) == []
        # its bound, and a generous allowance for a descheduled test process
        assert time.perf_counter() - started < 0.2
    assert polls >= 3
    assert spin.spins == 3 and spin.hits == 0
    # three misses in a row: the next calls wait without spinning, then it probes again
    skipped = 0
    while not spin.wanted():
        skipped += 1
    assert skipped == 8
    assert spin.poll(nothing) == []  # still missing: the back-off doubles
    assert spin.poll(nothing) == [] and spin.poll(nothing) == []
    skipped = 0
    while not spin.wanted():
        skipped += 1
    assert skipped == 16


def test_a_caught_reply_resets_the_back_off_and_shortens_the_next_spins():
    spin = ReplySpin(max_us=1000)
    for _ in range(3):
        spin.poll(lambda _t: [])
    while not spin.wanted():
        pass
    assert spin.poll(lambda _t: [(3, 1)]) == [(3, 1)]
    assert spin.hits == 1 and spin.back_off == 8 and spin.misses == 0
    for _ in range(50):
        spin.poll(lambda _t: [(3, 1)])
    assert spin.average_ns < 100_000  # near what the replies took, not the bound


def test_replies_caught_by_the_spin_are_the_calls_own(several_cpus, harness):
    worker = harness.worker()
    assert worker._spin is not None
    assert [call(worker, "identity", n) for n in range(50)] == list(range(50))
    assert call(worker, "echo", "x", y=1) == {"args": ["x"], "kwargs": {"y": 1}}


def test_a_reply_that_comes_after_the_spin_is_still_read(several_cpus, harness):
    worker = harness.worker()
    assert call(worker, "identity", 0) == 0
    spin = worker._spin = ReplySpin(max_us=50)
    worker._poll_first = 1  # no read first: the spin is the call's first look at stdout
    assert call(worker, "sleep", ms=300, tag="late") == {"slept": True, "tag": "late"}
    assert (spin.spins, spin.hits) == (1, 0)  # the spin ended long before the reply came
    assert call(worker, "identity", 7) == 7  # and the stream is in step after it


def test_a_worker_that_dies_during_the_spin_fails_the_call(several_cpus, harness):
    worker = harness.worker()
    assert call(worker, "identity", 0) == 0
    spin = worker._spin = ReplySpin(max_us=10_000_000)  # a spin that outlasts the death
    worker._poll_first = 1
    with pytest.raises(WorkerCrashed):
        call(worker, "crash", code=3)
    assert (spin.spins, spin.hits) == (1, 1)  # the end of its stdout came during the spin
    assert worker._proc is not None and worker._proc.stdout is not None
    assert worker._proc.stdout.closed  # its pipes closed at once, as after a blocking wait


def test_a_worker_killed_during_the_spin_fails_the_call_at_once(several_cpus, harness):
    worker = harness.worker()
    assert call(worker, "identity", 0) == 0
    spin = worker._spin = ReplySpin(max_us=10_000_000)
    worker._poll_first = 1
    killer = threading.Timer(0.2, worker.kill_tree, args=("retired by the test",))
    killer.start()
    started = time.monotonic()
    try:
        with pytest.raises(WorkerRetired):
            call(worker, "sleep", seconds=30)
    finally:
        killer.join()
    assert time.monotonic() - started < 10  # woken by the kill, not by the spin's bound nor the backend
    assert (spin.spins, spin.hits) == (1, 1)

"""Meters: counters (locked and lock-free tallies) add up, and a read never loses or invents a tick."""

from __future__ import annotations

import threading

import pytest

from castor.supervision.meters import Meters


@pytest.mark.timeout(10)
def test_a_tally_and_count_add_up_and_reading_consumes_nothing():
    meters = Meters()
    tick = meters.tally("worker_calls", "W")
    assert meters.collect()[0] == {}  # an untouched tally shows nothing
    meters.count("worker_calls", "W", 5)
    tick()
    tick()
    assert meters.collect()[0] == {("worker_calls", "W"): 7}
    assert meters.collect()[0] == {("worker_calls", "W"): 7}  # reading twice counts nothing
    assert meters.tally("worker_calls", "W")() is not None  # the same tally, fetched again
    assert meters.collect()[0] == {("worker_calls", "W"): 8}


@pytest.mark.timeout(30)
def test_tallies_from_many_threads_while_collect_reads_lose_nothing():
    meters = Meters()
    threads, per_thread = 4, 20000
    start = threading.Barrier(threads + 1)
    done = threading.Event()

    def bump() -> None:
        tick = meters.tally("n", "K")
        start.wait(5)
        for _ in range(per_thread):
            tick()

    def read() -> None:
        start.wait(5)
        while not done.is_set():
            meters.collect()

    workers = [threading.Thread(target=bump) for _ in range(threads)]
    reader = threading.Thread(target=read)
    for thread in (*workers, reader):
        thread.start()
    for thread in workers:
        thread.join(20)
    done.set()
    reader.join(5)
    assert meters.collect()[0] == {("n", "K"): threads * per_thread}


@pytest.mark.timeout(30)
def test_a_bound_histogram_and_observe_fill_the_same_buckets_from_many_threads():
    meters = Meters()
    observe = meters.histogram("ask_seconds", "K")
    assert meters.collect()[1][("ask_seconds", "K")][-1] == 0.0  # bound: present, empty
    threads, per_thread = 4, 5000
    start = threading.Barrier(threads)

    def record(n: int) -> None:
        start.wait(5)
        for _ in range(per_thread):
            if n % 2:
                observe(0.0001)  # first bucket
            else:
                meters.observe("ask_seconds", "K", 7.0)  # the 10 s bucket

    workers = [threading.Thread(target=record, args=(n,)) for n in range(threads)]
    for thread in workers:
        thread.start()
    for thread in workers:
        thread.join(20)
    row = meters.collect()[1][("ask_seconds", "K")]
    assert row[0] == 2 * per_thread and sum(row[:-1]) == threads * per_thread
    assert row[-1] == pytest.approx(2 * per_thread * (0.0001 + 7.0))
    assert meters.histogram("ask_seconds", "K") is not observe  # a new observer, the same row
    meters.histogram("ask_seconds", "K")(0.0001)
    assert meters.collect()[1][("ask_seconds", "K")][0] == 2 * per_thread + 1


@pytest.mark.timeout(10)
def test_observe_puts_each_duration_in_the_bucket_a_bisect_finds_at_every_bound():
    """The first bucket is found with one comparison: exactly the durations bisect puts there."""
    from bisect import bisect_left

    from castor.supervision.meters import BUCKETS

    meters = Meters()
    observe = meters.histogram("ask_seconds", "B")
    values = [0.0, -1e-9, *BUCKETS, *(b * (1 + 1e-9) for b in BUCKETS), *(b * (1 - 1e-9) for b in BUCKETS), 1e9]
    expected = [0.0] * (len(BUCKETS) + 2)
    for value in values:
        meters.observe("ask_seconds", "A", value)
        observe(value)
        expected[bisect_left(BUCKETS, value)] += 1
    _, histograms = meters.collect()
    assert histograms[("ask_seconds", "A")][:-1] == expected[:-1]
    assert histograms[("ask_seconds", "B")][:-1] == expected[:-1]

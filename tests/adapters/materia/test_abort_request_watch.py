"""castor.adapters.materia.abort_requests: the process's one watcher thread across casts.

A session's casts run one after another: the thread that watched the last one waits, parked and
polling nothing, for the next, so a start does not start a thread per cast; with no cast for
its idle time it ends, and the next watch starts one again.
"""

from __future__ import annotations

import gc
import json
import threading
import time
import weakref
from pathlib import Path

import pytest

import castor.supervision.threads as threads
from castor.adapters.materia.abort_requests import ABORT_POLL_S, ABORT_REQUEST, AbortRequests, _Watch
from tests.support.waiting import wait_for


@pytest.fixture
def thread_starts(monkeypatch: pytest.MonkeyPatch) -> list[threading.Thread]:
    """Every thread the watcher starts (through ``start_thread``), in order."""
    started: list[threading.Thread] = []
    real = threads.start_thread

    def counting(*args: object, **kwargs: object) -> threading.Thread:
        thread = real(*args, **kwargs)  # type: ignore[arg-type]
        started.append(thread)
        return thread

    monkeypatch.setattr(threads, "start_thread", counting)
    return started


def _watch_one(watcher: _Watch, run_dir: Path) -> tuple[threading.Event, object]:
    run_dir.mkdir()
    asked = threading.Event()
    unwatch = watcher.add(AbortRequests(run_dir / ABORT_REQUEST, time.time() - 1, lambda line: None), asked.set)
    return asked, unwatch


def _request_abort(run_dir: Path) -> None:
    (run_dir / ABORT_REQUEST).write_text(json.dumps({"requested_at": time.time(), "pid": 1}))


def test_the_next_cast_is_watched_by_the_parked_thread_not_a_new_one(tmp_path, thread_starts):
    watcher = _Watch()
    asked, unwatch = _watch_one(watcher, tmp_path / "first")
    _request_abort(tmp_path / "first")
    assert asked.wait(5)
    unwatch()  # type: ignore[operator]
    first = thread_starts[0]
    # The last cast gone: the thread polls no more (it parks, or before this change it ended).
    wait_for(lambda: getattr(watcher, "parked", False) or not first.is_alive(), what="the watcher idle")
    asked, unwatch = _watch_one(watcher, tmp_path / "second")
    _request_abort(tmp_path / "second")
    assert asked.wait(5), "the second cast's request was not taken"
    assert thread_starts == [first], "a watch after the last one ended started a thread of its own"
    unwatch()  # type: ignore[operator]


def test_a_parked_watcher_ends_after_its_idle_time_and_the_next_watch_starts_one(tmp_path, thread_starts):
    watcher = _Watch(idle_s=0.2)
    asked, unwatch = _watch_one(watcher, tmp_path / "first")
    unwatch()  # type: ignore[operator]
    wait_for(lambda: not thread_starts[0].is_alive(), what="the idle watcher's end")
    assert not watcher.running and not watcher.parked
    asked, unwatch = _watch_one(watcher, tmp_path / "second")
    _request_abort(tmp_path / "second")
    assert asked.wait(5)
    assert len(thread_starts) == 2
    unwatch()  # type: ignore[operator]


def test_a_parked_watcher_keeps_nothing_of_the_casts_it_watched(tmp_path, thread_starts):
    """What a watch was given (the cast's callbacks, holding its actor's handle and through it the
    cast's files' locks) is let go once it is unwatched, while the thread waits, parked, on."""

    class Cast:
        def asked(self) -> None:
            pass

    watcher = _Watch()
    (tmp_path / "run").mkdir()
    cast = Cast()
    unwatch = watcher.add(AbortRequests(tmp_path / "run" / ABORT_REQUEST, time.time() - 1, lambda line: None),
                          cast.asked)
    polled = time.monotonic() + 3 * ABORT_POLL_S  # a few polls with the cast watched
    wait_for(lambda: time.monotonic() > polled, what="a few polls")
    unwatch()
    wait_for(lambda: getattr(watcher, "parked", False) or not thread_starts[0].is_alive(), what="the watcher idle")
    gone = weakref.ref(cast)
    del cast
    gc.collect()
    assert gone() is None, "the parked watcher still holds the last cast it watched"


def test_a_watch_handed_to_the_parked_thread_wakes_no_thread(tmp_path, thread_starts):
    """A start hands its cast to the parked watcher without waking it (a woken watcher took the GIL
    from the starting thread mid-start): the watch is added, and the next tick polls it."""
    watcher = _Watch()
    asked, unwatch = _watch_one(watcher, tmp_path / "first")
    unwatch()  # type: ignore[operator]
    wait_for(lambda: watcher.parked, what="the watcher parked")
    wakes: list[str] = []
    with pytest.MonkeyPatch.context() as patch:
        for name in ("notify", "notify_all"):
            real = getattr(threading.Condition, name)
            patch.setattr(threading.Condition, name,
                          lambda self, *a, _real=real, _name=name, **k: (wakes.append(_name), _real(self, *a, **k))[1])
        patch.setattr(threading.Event, "set",
                      lambda self, _real=threading.Event.set: (wakes.append("set"), _real(self))[1])
        asked, unwatch = _watch_one(watcher, tmp_path / "second")
    assert wakes == [], "handing a watch to the parked watcher woke it"
    _request_abort(tmp_path / "second")
    assert asked.wait(5), "the parked watcher's next tick did not take the request"
    assert len(thread_starts) == 1, "the watch started a thread of its own"
    unwatch()  # type: ignore[operator]
